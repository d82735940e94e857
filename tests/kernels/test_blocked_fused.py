"""The blocked backend's fused CPU kernel (kernels/cpu/, PyTorch operators) equals the dense oracle
on outputs and every gradient, in its AVX-512 and AVX2 builds, and falls back to the PyTorch path,
saying why, where it cannot be built."""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from queue import Empty
from unittest import mock

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
from test_blocked import COMPILER_CASES

from graphattn.kernels import blocked, blocked_fused, dense, fused_cpu
from graphattn.kernels.structure_runs import runs_of

HAS_COMPILER = bool(shutil.which("c++") or shutil.which("g++")) and shutil.which("ninja") is not None
needs_kernel = pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler or ninja to build the fused kernel")
FP32 = 1e-5  # relative to each result's largest magnitude, as the PyTorch path's fp32 test
# Rows whose second key set spans several pieces take the backward's D = rowsum(dO . O) (flash
# attention's), which differs from rowsum(P dP) by fp32 rounding: such a row with one allowed key
# gets dS ~ 1e-7 instead of an exact 0, so a result that is 0 in exact arithmetic is checked to
# 1e-6 (FP32 * ZERO_FLOOR), about 10 ulps of 1.0.
ZERO_FLOOR = 0.1


def fused(**options):
    return functools.partial(blocked.attention, fused=True, **options)


def against_oracle(
    case_of, rtol: float = FP32, key_block: int | None = None, band_parts: tuple[int, int] | None = None, **options
) -> None:
    """The fused kernel on fp32 inputs against the dense oracle on the same values in fp64;
    `key_block` (default blocked_fused.KEY_BLOCK) keys per piece of the online softmax;
    `band_parts` (BAND_PARTS, BAND_PART_ROWS): the long blocks' sub-blocks for the band (the
    default's 16-row minimum leaves these small blocks whole)."""
    parts, part_rows = band_parts or (blocked_fused.BAND_PARTS, blocked_fused.BAND_PART_ROWS)
    with (
        mock.patch.object(blocked_fused, "KEY_BLOCK", key_block or blocked_fused.KEY_BLOCK),
        mock.patch.multiple(blocked_fused, BAND_PARTS=parts, BAND_PART_ROWS=part_rows),
    ):
        actual = run(fused(**options), case_of(torch.float32))
    assert_all_close(actual, run(dense.attention, case_of(torch.float64)), rtol, RESULT_NAMES, ZERO_FLOOR)


def test_labels_keep_key_set_b_as_runs() -> None:
    """Two rows, A = 2 columns, B = 4, and the sinks (V = 8: 8 masked, 9 the empty row's sink)."""
    second = torch.tensor([[[5, 5, 2, 2], [8, 8, 8, 8]]])
    runs = runs_of(second)
    assert runs.counts.tolist() == [[2, 1]]  # row 0: runs 0-1, row 1: run 2
    assert runs.start.tolist() == [0, 2, 0] and runs.label.tolist() == [5, 2, 8]
    assert runs.allowed_rows(8).tolist() == [[True, False]]
    first = torch.tensor([[[3, 1], [8, 8]]])
    labels = fused_cpu.Labels.of(first, torch.tensor([[False, True]]), runs, 8, torch.int8)
    assert labels.dense.dtype == torch.int8 and labels.dense.tolist() == [[[3, 1], [8, 8]]]
    assert labels.sink.dtype == torch.int8 and labels.sink.tolist() == [[8, 9]]
    assert labels.run_ptr.tolist() == [0, 2, 3]
    assert labels.nbytes == 4 + 2 + 3 * 8 + 3 * 4 + 3 * 4
    band = torch.zeros(1, 4, 3, dtype=torch.int8)  # a view of another tensor's rows is used as it is
    view = fused_cpu.Labels.of(band[:, 1:3], torch.tensor([[False, False]]), runs, 8, torch.int8)
    assert view.dense.data_ptr() == band[:, 1:3].data_ptr() and view.nbytes == 2 + 3 * 8 + 3 * 4 + 3 * 4
    none = runs_of(second[:, :, :0])  # no B keys: no runs
    assert none.counts.tolist() == [[0, 0]] and none.start.numel() == 0


def test_the_kernel_builds_where_there_is_a_compiler() -> None:
    if not HAS_COMPILER:
        pytest.skip("no C++ compiler or ninja")
    assert fused_cpu.available(), fused_cpu.why_not()


@needs_kernel
@pytest.mark.parametrize("name", COMPILER_CASES)
def test_compiler_batches(name) -> None:
    against_oracle(lambda dtype: compiler_case(dtype=dtype, **COMPILER_CASES[name]))


@needs_kernel
def test_graph_batch_with_mention_links_and_padding() -> None:
    against_oracle(lambda dtype: graph_case(dtype=dtype))


@needs_kernel
@pytest.mark.parametrize(
    "options",
    [
        dict(tile_elements=1),
        dict(block_size=5),
        dict(block_size=11, tile_elements=300),
        dict(workers=3),
        dict(workers=1),
        dict(key_block=1),
        dict(key_block=3, tile_elements=1),
        dict(key_block=4, block_size=3),
        dict(band_parts=(2, 1)),
        dict(band_parts=(2, 1), block_size=5, key_block=2),
        dict(band_parts=(3, 1), block_size=7, tile_elements=300),
    ],
    ids=[
        "one_block_per_chunk",
        "block_above_radius",
        "odd_block_small_tiles",
        "three_workers",
        "one_worker",
        "one_key_per_piece",
        "three_keys_per_piece_small_chunks",
        "four_keys_per_piece_small_blocks",
        "band_in_halves",
        "band_in_halves_odd_block",
        "band_in_thirds_small_chunks",
    ],
)
def test_chunking_does_not_change_results(options) -> None:
    layout = dict(num_long=41, num_global=7, radius=4, num_docs=2, long_padding=4, global_padding=1, mention_links=6)
    layout.update(empty_long_rows=2, empty_global_rows=1)
    against_oracle(lambda dtype: synthetic_case(dtype=dtype, **layout), **options)


@needs_kernel
@pytest.mark.parametrize(
    "layout",
    [dict(num_global=0, num_long=13, radius=40), dict(bias=False, hard_l2g=True), dict(num_long=1, num_global=1)],
    ids=["no_globals_radius_past_length", "no_bias_table", "one_token"],
)
def test_edges(layout) -> None:
    against_oracle(lambda dtype: synthetic_case(dtype=dtype, **layout))


@needs_kernel
def test_empty_rows_are_zero_not_nan() -> None:
    case = synthetic_case(dtype=torch.float32, empty_long_rows=5, empty_global_rows=2, long_padding=3)
    results = run(fused(), case)
    empty = (case.side.l2l_att_mask.sum(-1) + case.side.l2g_att_mask.sum(-1)) == 0
    assert empty.any() and (results[1].transpose(1, 2)[empty] == 0).all()
    assert all(torch.isfinite(r).all() for r in results if r is not None)


def _wider_vocabulary(case, vocab: int):
    """The same case with `vocab` rows in the label tables (ids unchanged): the index then needs
    a wider integer type, and tables past 64 columns are read by gather instead of permutes."""
    gen = torch.Generator().manual_seed(3)
    extra = vocab - case.vocab
    key = torch.randn(extra, *case.key_table.shape[1:], generator=gen, dtype=torch.float64).to(case.key_table.dtype)
    bias = torch.randn(extra, *case.bias_table.shape[1:], generator=gen, dtype=torch.float64).to(case.key_table.dtype)
    key_table = torch.cat([case.key_table.detach(), key]).requires_grad_()
    bias_table = torch.cat([case.bias_table.detach(), bias]).requires_grad_()
    return type(case)(case.side, vocab, case.states, key_table, bias_table)


@needs_kernel
@pytest.mark.parametrize(
    "vocab, cache_bytes",
    [(None, None), (62, None), (100, None), (300, None), (40_000, None), (None, 0)],
    ids=["int8_permute", "int8_widest_permute", "int8_gather", "int16", "int32", "uncached"],
)
def test_every_index_type_and_table_width(vocab, cache_bytes) -> None:
    def case_of(dtype):
        case = synthetic_case(dtype=dtype, num_long=33, radius=5, mention_links=4, empty_long_rows=1)
        return case if vocab is None else _wider_vocabulary(case, vocab)

    against_oracle(case_of, index_cache_bytes=cache_bytes)


@needs_kernel
def test_later_layers_reuse_the_plans_labels_and_repeat_bit_for_bit() -> None:
    case = synthetic_case(dtype=torch.float32, num_long=61, radius=6, mention_links=5)
    gq, gk, _, lq, *_ = case.states
    from graphattn.kernels.request import direct_request

    plan = blocked.plan(direct_request(case.side, gq, gk, lq, case.key_table, fused=True, workers=2))

    def layer():
        return run(lambda *a: blocked.run(plan, a[:6], a[7], a[8], a[9]), case)

    made = plan.fused_chunks["both"]
    assert len(made.labels) == 5 * made.table.shape[0] > 0, "the plan holds every chunk's labels"
    first, second = layer(), layer()
    assert plan.fused_chunks["both"] is made and all(
        a is b for a, b in zip(plan.fused_chunks["both"].labels, made.labels)
    )
    for a, b in zip(first, second):
        assert a is None and b is None or torch.equal(a, b)
    eager = run(functools.partial(blocked.attention, fused=False), case)
    assert_all_close(first, eager, FP32, RESULT_NAMES)


@needs_kernel
@settings(max_examples=15, deadline=None)
@given(
    layout=random_layouts(),
    block_size=st.sampled_from([None, 3, 8]),
    tile_elements=st.sampled_from([1, 500, None]),
    workers=st.sampled_from([1, 2]),
    key_block=st.sampled_from([None, 1, 2, 5]),
    band_parts=st.sampled_from([None, (2, 1), (3, 1)]),
)
def test_random_batches_match_dense(layout, block_size, tile_elements, workers, key_block, band_parts):
    options = dict(block_size=block_size, workers=workers, key_block=key_block, band_parts=band_parts)
    if tile_elements is not None:
        options["tile_elements"] = tile_elements
    against_oracle(lambda dtype: synthetic_case(dtype=dtype, **layout), **options)


@pytest.fixture
def rebuild(monkeypatch, tmp_path):
    """A fresh load of the kernel (cache directory and settings from the test); the usual build
    is loaded again afterwards."""
    monkeypatch.setenv("GRAPHATTN_CACHE", str(tmp_path))
    fused_cpu.reset()
    yield monkeypatch
    monkeypatch.undo()
    fused_cpu.reset()


AVX2_CHILD = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from graphattn.kernels import fused_build, fused_cpu
fused_build.isa_level = lambda: fused_build.X86_LEVELS[1][::2]  # the AVX2 build
assert fused_cpu.available(), fused_cpu.why_not()
assert fused_cpu.library().name.startswith("graphattn_cpu_x86_64_avx2_"), fused_cpu.library()
import test_blocked_fused as t
layout = dict(mention_links=4, empty_long_rows=2, empty_global_rows=1)
t.against_oracle(lambda dtype: t.synthetic_case(dtype=dtype, **layout))
t.against_oracle(lambda dtype: t.synthetic_case(dtype=dtype, **layout), key_block=3)
t.against_oracle(lambda dtype: t._wider_vocabulary(t.synthetic_case(dtype=dtype), 100))
print("done")
"""


@needs_kernel
@pytest.mark.slow
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="AVX-512 is an x86 extension")
def test_the_portable_build_without_avx512_matches_too(tmp_path) -> None:
    """The AVX2 build (another library: a process holds one build) in a child process."""
    env = {**os.environ, "GRAPHATTN_CACHE": str(tmp_path)}
    here = str(Path(__file__).parent)
    done = subprocess.run(
        [sys.executable, "-c", AVX2_CHILD, here], capture_output=True, text=True, env=env, timeout=900, cwd=here
    )
    assert done.returncode == 0 and done.stdout.split() == ["done"], done.stderr[-3000:]


def test_turned_off_it_runs_the_pytorch_path_and_a_request_for_it_says_why(rebuild) -> None:
    rebuild.setenv("GRAPHATTN_FUSED_CPU", "0")
    case = synthetic_case(dtype=torch.float32)
    assert_all_close(run(blocked.attention, case), run(dense.attention, synthetic_case()), FP32, RESULT_NAMES)
    with pytest.raises(RuntimeError, match="fused CPU kernel was asked for.*GRAPHATTN_FUSED_CPU=0"):
        run(fused(), case)


def test_a_failed_build_warns_once_and_runs_the_pytorch_path(rebuild) -> None:
    rebuild.setenv("CXX", "/bin/false")
    case = synthetic_case(dtype=torch.float32)
    said = r"(?s)could not be built.*C\+\+ compiler \(/bin/false\) failed compiling.*slower PyTorch path"
    with pytest.warns(UserWarning, match=said):
        results = run(blocked.attention, case)
    assert_all_close(results, run(dense.attention, synthetic_case()), FP32, RESULT_NAMES)
    assert not fused_cpu.available() and "/bin/false" in fused_cpu.why_not()


def test_other_dtypes_are_refused_by_name() -> None:
    with pytest.raises(RuntimeError, match="fp32 tiles on CPU, and these are torch.float64"):
        run(fused(), synthetic_case())
    with pytest.raises(TypeError, match="option fused must be True, False or None"):
        run(functools.partial(blocked.attention, fused="yes"), synthetic_case())


@needs_kernel
def test_ids_past_the_table_fail_before_the_kernel_reads_them() -> None:
    case = synthetic_case(dtype=torch.float32)
    case.side.l2g_relative_att_ids[0, 0, 0] = case.vocab + 5
    with pytest.raises(ValueError, match=r"ids must lie in \[0, \d+\).*long queries from row 0"):
        run(fused(), case)


@needs_kernel
def test_the_result_does_not_depend_on_the_threads_pytorch_gives() -> None:
    """Three workers on PyTorch's threads and the same three workers' chunk lists run one after
    another on the calling thread (torch on one thread): the same deal, the same per-worker
    sums, so the same bits, forward and backward."""
    case = synthetic_case(dtype=torch.float32, num_long=300, num_global=20, radius=6, num_docs=2, mention_links=10)
    attend = fused(workers=3, tile_elements=64)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        threaded = run(attend, case)
        torch.set_num_threads(1)
        serial = run(attend, case)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(threaded, serial):
        assert a is None and b is None or torch.equal(a, b)


def _attend_in_child(queue) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(30, exit=True)  # a hang leaves the child's stack in the test's output
    case = synthetic_case(dtype=torch.float32, num_long=40, radius=4)
    queue.put([None if t is None else t.tolist() for t in run(fused(workers=2), case)])


@needs_kernel
def test_a_forked_child_runs_the_kernel_on_its_own_thread() -> None:
    """The workers are PyTorch's (OpenMP) threads; a child forked after they started (a DataLoader
    worker) must not wait on its parent's threads, which do not exist in it, even when it asks
    for two workers, nor may the BLAS open a team there (MKL's did, on these 40-row blocks); it
    gets the same results, forward and backward. (The case is small enough that PyTorch's own
    ops in the child stay on one thread; larger ones there would wait on those threads too.)"""
    import multiprocessing

    case = synthetic_case(dtype=torch.float32, num_long=40, radius=4)
    # the parent's pool exists now
    expected = run(fused(workers=2), case)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_attend_in_child, args=(queue,))
    child.start()
    try:
        got = queue.get(timeout=60)
    except Empty:
        got = None
    child.join(timeout=10)
    hung = child.is_alive()
    if hung:
        child.kill()
        child.join()
    assert got is not None and not hung and child.exitcode == 0, f"the forked child hung or failed ({child.exitcode})"
    # the child's products are plain loops (no BLAS team there): the same values within fp32 rounding
    got = [None if t is None else torch.tensor(t) for t in got]
    assert_all_close(got, expected, FP32, RESULT_NAMES, ZERO_FLOOR)


@needs_kernel
def test_the_backward_keeps_its_workers_buffers_and_zeroes_them() -> None:
    """Workers 1 and 2 of three accumulate in buffers the operator keeps between calls: a second
    call finds them dirty and must give the same bits; a larger batch replaces them, a smaller
    one after it uses part of them; released, they are made again."""
    small = synthetic_case(dtype=torch.float32, num_long=120, num_global=8, radius=5, mention_links=6)
    large = synthetic_case(dtype=torch.float32, num_long=300, num_global=20, radius=6, num_docs=2, mention_links=10)
    attend = fused(workers=3, tile_elements=64)

    def same(a, b) -> None:
        for x, y in zip(a, b):
            assert x is None and y is None or torch.equal(x, y)

    blocked_fused.release_workspace()
    fresh_small = run(attend, small)
    blocked_fused.release_workspace()
    fresh_large = run(attend, large)
    for case, fresh in ((small, fresh_small), (small, fresh_small), (large, fresh_large), (small, fresh_small)):
        same(run(attend, case), fresh)
    blocked_fused.release_workspace()
    same(run(attend, small), fresh_small)


CHECKS_UNDER_O = """
import torch
from graphattn.kernels import blocked, fused_cpu
from graphattn.kernels.request import direct_request
from graphattn.kernels.synthetic import synthetic_side_inputs

assert fused_cpu.available(), fused_cpu.why_not()
side, layout = synthetic_side_inputs(1, 24, 3, 2, 2)
states = [torch.randn(1, 2, n, 8) for n in (3, 3, 3, 24, 24, 24)]
key = torch.randn(layout.vocab_size, 2, 8)
plan = blocked.plan(direct_request(side, states[0], states[1], states[3], key, fused=True))
chunks = plan.fused_chunks["both"]
flat = [s.reshape(2, s.shape[2], 8) for s in states]
good = dict(zip("gq gk gv lq lk lv".split(), flat), long_key=key, long_bias=None, global_key=key, global_bias=None,
            table=chunks.table, labels=list(chunks.labels), heads=2, scale=0.5, workers=2)
torch.ops.graphattn.fused_forward(**good)
first = list(chunks.labels)
bad_ptr = first[2].clone()
bad_ptr[-1] = 10**9
bad = {
    "gq float64": dict(gq=flat[0].double()),
    "lk on another shape": dict(lk=torch.randn(2, 23, 8)),
    "key table shape": dict(long_key=torch.randn(layout.vocab_size, 3, 8)),
    "bias shape": dict(long_bias=torch.randn(2, 2)),
    "labels' shape": dict(labels=[first[0][:, :, :1], *first[1:]]),
    "labels' dtype": dict(labels=[first[0].long(), *first[1:]]),
    "run pointer past its runs": dict(labels=[*first[:2], bad_ptr, *first[3:]]),
    "too few labels": dict(labels=first[:-1]),
    "a table row past the keys": dict(table=chunks.table.clone().index_fill_(1, torch.tensor([10]), 10**6)),
    "a block larger than its chunk": dict(table=chunks.table.clone().index_fill_(1, torch.tensor([4]), 10**6)),
    "heads": dict(heads=3),
}
for name, change in bad.items():
    try:
        torch.ops.graphattn.fused_forward(**{**good, **change})
        print("ACCEPTED", name)
    except ValueError as error:
        assert "fused CPU kernel" in str(error), error
out = torch.ops.graphattn.fused_forward(**good)
try:
    torch.ops.graphattn.fused_backward(**good, global_out=out[0], long_out=out[1][:, :5], global_stats=out[2],
                                       long_stats=out[3], grad_global=out[0], grad_long=out[1])
    print("ACCEPTED backward")
except ValueError as error:
    assert "laid out as the queries" in str(error), error
print("done")
"""


def test_bad_tensors_raise_even_under_python_O() -> None:
    """The kernel's memory safety rests on checks that always run: `python -O` strips asserts."""
    done = subprocess.run([sys.executable, "-O", "-c", CHECKS_UNDER_O], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["done"], done.stdout
