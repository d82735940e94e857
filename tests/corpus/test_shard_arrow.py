"""Shard columns built from buffers equal what `pa.array` makes, and building them does not
import pandas (pyarrow's shim would, on its first `pa.array` in a worker)."""

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from graphattn.shards import arrow

CASES = [
    ([3, -1, 7], pa.int32()),
    ([1, None, 2], pa.int64()),
    ([True, False, True, True, False, False, True, True, True], pa.bool_()),
    (["a", "bé", "", None, "日本"], pa.string()),
    ([np.array([1, 2], np.uint16), np.array([], np.uint16), np.array([65535], np.uint16)], pa.list_(pa.uint16())),
    ([np.array([0.5], np.float32), np.array([-2.0, 3.25], np.float32)], pa.list_(pa.float32())),
    ([["x", None], [], ["yz"]], pa.list_(pa.string())),
    ([[4, None], [None], []], pa.list_(pa.int64())),
    ([], pa.list_(pa.int16())),
]


@pytest.mark.parametrize(("values", "type"), CASES, ids=[str(t) for _, t in CASES])
def test_columns_equal_pa_array(values, type):
    built = arrow.column(values, type)
    expected = pa.array(values, type=type)
    assert built.type == type
    assert built.equals(expected), (built, expected)
    assert built.null_count == expected.null_count


def test_list_offsets_and_nulls_by_hand():
    built = arrow.column([[4, None], [None], []], pa.list_(pa.int64()))
    assert built.offsets.to_pylist() == [0, 2, 3, 3]
    assert built.flatten().to_pylist() == [4, None, None]


def test_building_a_shard_table_does_not_import_pandas():
    code = (
        "import sys, numpy as np, pyarrow as pa\n"
        "from graphattn.shards import arrow\n"
        "arrow.column([np.array([1, 2], np.int32)], pa.list_(pa.int32()))\n"
        "arrow.column(['a', None], pa.string()); arrow.column([True], pa.bool_())\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
