"""The blocked backend equals the dense oracle on outputs and on every gradient."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import (
    RESULT_NAMES,
    assert_all_close,
    compiler_case,
    graph_case,
    random_layouts,
    run,
    synthetic_case,
)

from graphattn.kernels import blocked, blocked_tiles, dense


def blocked_with(**options):
    return functools.partial(blocked.attention, **options)


COMPILER_CASES = {
    "packed_hierarchy": dict(),
    "hard_g2l": dict(hard_g2l=True),
    "hard_both": dict(hard_g2l=True, hard_l2g=True, doc_lengths=((11, 8), (6, 6, 7))),
    "wide_radius": dict(radius=9, num_long=30, doc_lengths=((30,), (12, 10))),
}


@pytest.mark.parametrize("name", COMPILER_CASES)
def test_compiler_batches_fp64(name) -> None:
    case = compiler_case(**COMPILER_CASES[name])
    assert_all_close(run(blocked.attention, case), run(dense.attention, case), 1e-10, RESULT_NAMES)


def test_compiled_graph_batch_with_mention_links_and_padding() -> None:
    case = graph_case()
    assert (case.side.l2g_relative_att_ids == 7).any(), "the batch should carry mention_of labels"
    assert_all_close(run(blocked.attention, case), run(dense.attention, case), 1e-10, RESULT_NAMES)


@pytest.mark.parametrize(
    "options",
    [
        dict(tile_elements=1),
        dict(block_size=5),
        dict(block_size=11, tile_elements=300),
        dict(tile_elements=1, workers=3),
        dict(tile_elements=1, workers=1),
    ],
    ids=["one_block_per_chunk", "block_above_radius", "odd_block_small_tiles", "three_worker_threads", "one_thread"],
)
def test_chunking_does_not_change_results(options) -> None:
    case = synthetic_case(
        num_long=41,
        num_global=7,
        radius=4,
        num_docs=2,
        long_padding=4,
        global_padding=1,
        mention_links=6,
        empty_long_rows=2,
        empty_global_rows=1,
    )
    assert_all_close(run(blocked_with(**options), case), run(dense.attention, case), 1e-10, RESULT_NAMES)


def test_fp32_within_1e5_relative() -> None:
    case = compiler_case(dtype=torch.float32, hard_g2l=True, dim=16, heads=3)
    expected = run(dense.attention, compiler_case(dtype=torch.float64, hard_g2l=True, dim=16, heads=3))
    assert_all_close(run(blocked.attention, case), expected, 1e-5, RESULT_NAMES)


def test_bf16_within_its_tolerance() -> None:
    case = synthetic_case(dtype=torch.bfloat16, dim=16, num_docs=2, mention_links=4)
    reference = synthetic_case(dtype=torch.float64, dim=16, num_docs=2, mention_links=4)
    with torch.no_grad():  # the fp64 reference sees exactly the bf16-rounded inputs
        for mine, ref in zip(case.params, reference.params):
            ref.copy_(mine.double())
    actual = run(blocked.attention, case)
    assert actual[0].dtype == torch.bfloat16 and actual[1].dtype == torch.bfloat16
    assert_all_close(actual, run(dense.attention, reference), 3e-2, RESULT_NAMES)


def test_bf16_without_gradients_within_its_tolerance() -> None:
    """Inference in bf16: tiles and matmuls in bf16 where the CPU multiplies bf16 in hardware
    (fp32 elsewhere), within bf16's tolerance of the fp64 oracle on the same rounded inputs."""
    case = synthetic_case(dtype=torch.bfloat16, dim=16, num_docs=2, mention_links=4, empty_long_rows=2)
    reference = synthetic_case(dtype=torch.float64, dim=16, num_docs=2, mention_links=4, empty_long_rows=2)
    with torch.no_grad():
        for mine, ref in zip(case.params, reference.params):
            ref.copy_(mine.double())
        actual = run(blocked.attention, case, grads=False)
    assert actual[0].dtype == torch.bfloat16 and actual[1].dtype == torch.bfloat16
    assert_all_close(actual, run(dense.attention, reference, grads=False), 3e-2, RESULT_NAMES)


def test_only_bf16_calls_without_gradients_compute_in_bf16() -> None:
    cpu = torch.device("cpu")
    native = blocked._native_bf16(cpu)
    assert blocked.compute_dtype(torch.bfloat16, cpu, backward=False) == (torch.bfloat16 if native else torch.float32)
    assert blocked.compute_dtype(torch.bfloat16, cpu, backward=True) == torch.float32
    assert blocked.compute_dtype(torch.float16, cpu, backward=False) == torch.float32
    assert blocked.compute_dtype(torch.float64, cpu, backward=False) == torch.float64


def test_no_global_tokens_and_radius_beyond_length() -> None:
    case = synthetic_case(num_global=0, num_long=13, radius=40)
    assert_all_close(run(blocked.attention, case), run(dense.attention, case), 1e-10, RESULT_NAMES)


def test_without_bias_table() -> None:
    case = synthetic_case(bias=False, hard_l2g=True)
    assert_all_close(run(blocked.attention, case), run(dense.attention, case), 1e-10, RESULT_NAMES)


def test_empty_rows_are_zero_not_nan() -> None:
    case = synthetic_case(dtype=torch.float32, empty_long_rows=5, empty_global_rows=2, long_padding=3)
    results = run(blocked.attention, case)
    empty = (case.side.l2l_att_mask.sum(-1) + case.side.l2g_att_mask.sum(-1)) == 0
    assert (results[1].transpose(1, 2)[empty] == 0).all()
    assert all(torch.isfinite(r).all() for r in results if r is not None)


def test_tiles_stay_within_budget_as_length_grows() -> None:
    """The layout never holds [H, L, G] scores: a chunk's tile (band window and every global key,
    or a global row against every key) stays within the budget as L and G grow."""
    for n in (4096, 16384):
        geo = blocked_tiles.geometry(1, 12, n // 16, n, 84, 32, 0.125, None, blocked.TILE_ELEMENTS)
        assert geo.window == geo.block + 2 * 84
        long_tile = geo.blocks_per_chunk * geo.bh * geo.block * (geo.window + geo.num_global_keys)
        global_row = geo.bh * (geo.num_global_keys + geo.num_long)
        assert long_tile <= blocked.TILE_ELEMENTS
        assert geo.global_rows_per_chunk * global_row <= max(blocked.TILE_ELEMENTS, 16 * global_row)


@settings(max_examples=15, deadline=None)
@given(
    layout=random_layouts(),
    block_size=st.sampled_from([None, 3, 8]),
    tile_elements=st.sampled_from([1, 500, 1 << 21]),
    workers=st.sampled_from([1, 2]),
)
def test_random_batches_match_dense(layout, block_size, tile_elements, workers) -> None:
    case = synthetic_case(**layout)
    actual = run(blocked_with(block_size=block_size, tile_elements=tile_elements, workers=workers), case)
    assert_all_close(actual, run(dense.attention, case), 1e-10, RESULT_NAMES)
