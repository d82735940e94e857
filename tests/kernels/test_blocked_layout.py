"""The blocked backend's tile layout on cases small enough to spell out, and how its chunks run."""

from __future__ import annotations

import threading
from dataclasses import replace
from functools import partial
from unittest import mock

import pytest
import torch
from kernel_cases import RESULT_NAMES, assert_all_close, run, synthetic_case

from graphattn.kernels import blocked, blocked_tiles, dense, fused_cpu_labels
from graphattn.kernels.blocked_tiles import CallTensors, LongChunk, Scratch, Scratches, geometry, local_index
from graphattn.kernels.request import direct_request

V = 99  # the masked column of the label tables


class _Band:
    """A source with only a band: L = 5, r = 1, every pair allowed, id 10*i + column."""

    radius = 1

    def l2l(self):
        rows = torch.arange(5)[:, None] * 10 + torch.arange(3)[None, :]
        return torch.ones(1, 5, 3, dtype=torch.int32), rows[None].to(torch.int32)


def _band_geometry():
    return geometry(1, 1, 0, 5, 1, V, 1.0, 2, 1 << 20)  # w = 2: three blocks, windows of 4 keys


def test_the_band_labels_are_skewed_into_windows_of_w_plus_2r_keys() -> None:
    """Block b of w = 2 rows sees keys 2b-1 .. 2b+2; row i's ids sit at keys i-1, i, i+1 (columns
    0, 1, 2 of its side-input row); keys outside [0, 5) and row 5 (padding) are masked."""
    geo = _band_geometry()
    assert (geo.block, geo.window, geo.num_blocks, geo.window_pieces) == (2, 4, 3, 2)
    expected = torch.tensor(
        [
            [[V, 1, 2, V], [V, 10, 11, 12]],  # keys -1, 0, 1, 2
            [[20, 21, 22, V], [V, 30, 31, 32]],  # keys 1, 2, 3, 4
            [[40, 41, V, V], [V, V, V, V]],  # keys 3, 4, 5, 6
        ]
    )
    empty = [[False] * 5 + [True]]  # row 5 is padding
    index, no_key = local_index(geo, _Band())  # in C where the fused kernel is built
    assert torch.equal(index, expected[None]) and no_key.tolist() == empty
    with mock.patch.object(fused_cpu_labels, "dense_band", lambda *_: None):  # torch
        index, no_key = local_index(geo, _Band())
    assert torch.equal(index, expected[None]) and no_key.tolist() == empty


def test_windows_are_the_rows_each_block_may_reach_zero_padded() -> None:
    geo = _band_geometry()
    lay = CallTensors.__new__(CallTensors)
    lay.geo, lay.dim = geo, 1
    keys = torch.arange(1.0, 6.0).view(1, 5, 1)  # key i holds i + 1
    windows = lay.windows(keys, 0, 3, Scratch(keys))
    expected = torch.tensor([[0.0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 0, 0]])
    assert torch.equal(windows.squeeze(-1), expected)
    assert torch.equal(lay.windows(keys, 1, 2, Scratch(keys)).squeeze(-1), expected[1:2])


def test_rows_without_an_allowed_key_point_their_sink_at_the_zero_column() -> None:
    case = synthetic_case(num_long=13, num_global=4, radius=2, empty_long_rows=3, long_padding=2, hard_l2g=True)
    global_q, global_k, _, long_q, _, _ = case.states
    plan = blocked.plan(direct_request(case.side, global_q, global_k, long_q, case.key_table, workers=1))
    geo = replace(plan.geo, scale=0.5)
    states = [s.detach() for s in case.states]
    tables = [blocked.label_tables(states[i], case.key_table.detach(), None, 0.5) for i in (0, 3)]
    lay = CallTensors(geo, plan, *states, *tables)
    assert geo.blocks_per_chunk >= geo.num_blocks  # one chunk holds every row
    tile = LongChunk(lay, 0, geo.num_blocks, Scratches(states[3]))
    side, length = case.side, geo.num_long
    keys = torch.arange(length)[:, None] + torch.arange(-2, 3)[None, :]
    band = ((side.l2l_att_mask != 0) & (keys >= 0) & (keys < length)).any(-1)
    empty = ~(band | (side.l2g_att_mask != 0).any(-1))
    empty = torch.cat([empty, torch.ones(1, geo.padded_long - length, dtype=torch.bool).expand(len(empty), -1)], 1)
    assert empty.any() and not empty.all()
    sink = geo.lane_offsets(tile.index.shape[-1], torch.device("cpu"))[-1]  # the table copy the sink reads
    assert torch.equal(tile.index[:, :, -1] - sink, torch.where(empty, geo.vocab + 1, geo.vocab))
    probs = tile.probs(Scratches(states[3]))
    sink = probs.view(geo.batch, geo.heads, geo.padded_long, -1)[..., -1]
    assert torch.equal(sink, empty[:, None].expand_as(sink).to(sink.dtype))  # all weight, or none


def test_neighbouring_columns_read_different_copies_of_the_label_table() -> None:
    """Column j of a tile adds (j % lanes) * (V + 2) to its label: the backward's scatter-add
    then sends neighbouring columns with the same label to different addresses."""
    assert _band_geometry().lanes == blocked_tiles.LANES  # V = 99 <= MAX_LANED_VOCAB
    assert geometry(1, 1, 0, 5, 1, blocked_tiles.MAX_LANED_VOCAB + 1, 1.0, 2, 1 << 20).lanes == 1
    geo = replace(_band_geometry(), lanes=3)
    assert geo.lane_offsets(7, torch.device("cpu")).tolist() == [0, 101, 202, 0, 101, 202, 0]
    grads = torch.arange(3 * 101.0).expand(2, 303)  # copies 0, 1, 2 of labels 0..98, -inf, sink
    assert geo.fold_lanes(grads).tolist() == [[3 * v + 303 for v in range(99)]] * 2


@pytest.mark.parametrize("budget", [0, 750, 1 << 20], ids=["no_cache", "some_chunks", "every_chunk"])
def test_later_calls_read_the_chunk_indices_the_first_call_kept(budget) -> None:
    """A plan keeps its chunks' label indices (int8 for this small vocabulary) within its byte
    budget; calls after the first read them instead of deriving masks and labels, and give the
    oracle's results."""
    case = synthetic_case(
        num_long=41, num_global=7, radius=4, num_docs=2, mention_links=6, empty_long_rows=2, empty_global_rows=1
    )
    global_q, global_k, _, long_q, _, _ = case.states
    request = direct_request(case.side, global_q, global_k, long_q, case.key_table, tile_elements=1)
    request.options["index_cache_bytes"] = budget
    plan = blocked.plan(request)
    cache = plan.index_cache
    chunks = len(list(blocked_tiles.long_chunks(plan.geo))) + len(list(blocked_tiles.global_chunks(plan.geo)))

    def attention(*args):
        return blocked.run(plan, args[:6], args[7], args[8], args[9])

    expected = run(dense.attention, case)
    assert_all_close(run(attention, case), expected, 1e-10, RESULT_NAMES)
    kept = len(cache._entries)
    assert cache.used <= budget and all(e.dtype == torch.int8 for e in cache._entries.values())
    assert kept == {0: 0, 750: kept, 1 << 20: chunks}[budget] and (budget != 750 or 0 < kept < chunks)
    assert_all_close(run(attention, case), expected, 1e-10, RESULT_NAMES)  # now from the cache
    assert len(cache._entries) == kept
    sizes = {126: torch.int8, 127: torch.int16, 32766: torch.int16, 32767: torch.int32}
    assert {v: blocked_tiles.IndexCache(v, 0).dtype for v in sizes} == sizes  # V + 1 must fit


def test_the_pytorch_path_changes_no_thread_count_and_leaves_no_threads_running() -> None:
    """Two calls at once on the PyTorch path (workers asked for or not) give the oracle's results,
    and afterwards torch's thread count is what it was, in the caller and in a new thread, and no
    thread of ours is left running."""
    case = synthetic_case(num_long=61, num_global=7, radius=4, num_docs=2, mention_links=6)
    expected = run(dense.attention, case)
    before_threads, before_count = set(threading.enumerate()), torch.get_num_threads()
    results, errors = {}, []

    def call(name: str, **options) -> None:
        try:
            results[name] = run(partial(blocked.attention, fused=False, tile_elements=64, **options), case)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    callers = [threading.Thread(target=call, args=(str(i),), kwargs={"workers": 1 + i}) for i in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert not errors and len(results) == 2
    for result in results.values():
        assert_all_close(result, expected, 1e-10, RESULT_NAMES)
    seen = []
    fresh = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    fresh.start()
    fresh.join()
    assert torch.get_num_threads() == before_count and seen == [before_count]
    assert set(threading.enumerate()) <= before_threads


def test_the_pytorch_path_repeats_its_results_bit_for_bit() -> None:
    """A resumed training run equals an uninterrupted one only if every call gives the same bits:
    the chunks' key-gradient sums must not depend on timing."""
    case = synthetic_case(num_long=300, num_global=20, radius=6, num_docs=2, mention_links=10, dtype=torch.float32)
    first = run(partial(blocked.attention, fused=False, tile_elements=64), case)
    for _ in range(3):
        again = run(partial(blocked.attention, fused=False, tile_elements=64), case)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_the_index_cache_budget_must_be_a_non_negative_count() -> None:
    case = synthetic_case(num_long=9, num_global=2, radius=2)
    for bad in (-1, 1.5, "lots", True):
        with pytest.raises(TypeError, match="index_cache_bytes must be a non-negative int"):
            run(partial(blocked.attention, index_cache_bytes=bad), case)


def test_workers_must_be_a_positive_count_or_auto() -> None:
    case = synthetic_case(num_long=9, num_global=2, radius=2)
    for bad in (0, -1, "fast", 1.5):
        with pytest.raises(TypeError, match="workers must be a positive int or 'auto'"):
            run(partial(blocked.attention, workers=bad), case)


def test_one_tile_bound_whichever_way_the_backend_is_called(monkeypatch) -> None:
    """blocked.attention and a prepared plan without tile_elements chunk alike (the attention
    function once passed the PyTorch path's bound on to fused plans), and the PyTorch path's
    tiles take TILE_ELEMENTS, the one bound."""
    case = synthetic_case(num_long=200, num_global=12, radius=5, dtype=torch.float32)
    plans = []
    real = blocked.plan
    monkeypatch.setattr(blocked, "plan", lambda request: plans.append(real(request)) or plans[-1])
    for fused in (None, False):
        plans.clear()
        blocked.attention(*case.states, case.side, case.key_table, case.bias_table, 0.4, fused=fused)
        request = direct_request(case.side, *case.states[:2], case.states[3], case.key_table, fused=fused)
        assert real(request).geo == plans[0].geo
    eager = real(direct_request(case.side, *case.states[:2], case.states[3], case.key_table, fused=False)).geo
    assert eager == geometry(eager.batch, eager.heads, 12, 200, 5, eager.vocab, 1.0, None, blocked.TILE_ELEMENTS, 12)
