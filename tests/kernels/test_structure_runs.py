"""Labels in the forms the fused CPU kernel reads, from the compact structure without any
[rows x keys] tensor: runs of equal l2g / g2l labels per row equal the runs of the dense rows in
any block of rows and keys (and the dense source's pieces join into the same runs), and the
band's skewed labels equal those skewed from the dense side-input rows."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import graph_batch

from graphattn.compile.batching import collate
from graphattn.kernels import blocked_sources, fused_cpu, fused_cpu_labels
from graphattn.kernels.blocked_sources import CompactSource, DenseSource
from graphattn.kernels.blocked_tiles import geometry, local_index
from graphattn.kernels.structure_runs import Runs, runs_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compile"))
from compile_helpers import WordTokenizer  # noqa: E402
from test_compiler_properties import cases  # noqa: E402

from graphattn import compile_instance  # noqa: E402

VOCAB = 1000  # the masked label: above every id of these schemas
needs_kernel = pytest.mark.skipif(not fused_cpu.available(), reason=f"fused CPU kernel: {fused_cpu.why_not()}")


def dense_runs(side, region: str, rows: slice, cols: slice) -> Runs:
    mask = getattr(side, f"{region}_att_mask")[:, rows, cols]
    ids = getattr(side, f"{region}_relative_att_ids")[:, rows, cols]
    return runs_of(torch.where(mask != 0, ids, VOCAB))


def assert_same(ours: Runs, expected: Runs, where: str) -> None:
    assert torch.equal(ours.counts, expected.counts), f"{where}: run counts differ"
    assert torch.equal(ours.start, expected.start), f"{where}: run starts differ"
    assert torch.equal(ours.label, expected.label), f"{where}: run labels differ"
    assert torch.equal(ours.allowed_rows(VOCAB), expected.allowed_rows(VOCAB)), f"{where}: allowed rows differ"


def check_blocks(batch, bounds: list[tuple[float, float, float, float]]) -> None:
    """Every block given as fractions (row start, row stop, key start, key stop) of each region."""
    compact, side = CompactSource(batch.compact), DenseSource(batch.side)
    sizes = {"l2g": (batch.compact.long_length, batch.compact.global_length)}
    sizes["g2l"] = sizes["l2g"][::-1]
    for region, (n, m) in sizes.items():
        for a, b, c, d in bounds:
            rows = slice(int(a * n), max(int(a * n), int(b * n)))
            cols = slice(int(c * m), max(int(c * m), int(d * m)))
            where = f"{region} rows {rows.start}:{rows.stop} keys {cols.start}:{cols.stop}"
            expected = dense_runs(batch.side, region, rows, cols)
            assert_same(getattr(compact, f"{region}_runs")(rows, cols, VOCAB), expected, f"compact {where}")
            assert_same(getattr(side, f"{region}_runs")(rows, cols, VOCAB), expected, f"dense {where}")


WHOLE_AND_PARTS = [(0, 1, 0, 1), (0, 0.5, 0.3, 1), (0.4, 1, 0, 0.7), (0.2, 0.3, 0.5, 0.6), (0, 1, 0, 0)]


def test_runs_by_hand() -> None:
    """Row 0 of [5 5 2 2] is two runs, row 1 all masked is one; allowed_rows says which have a label."""
    runs = runs_of(torch.tensor([[[5, 5, 2, 2], [9, 9, 9, 9]]]))
    assert runs.counts.tolist() == [[2, 1]]
    assert runs.start.tolist() == [0, 2, 0] and runs.label.tolist() == [5, 2, 9]
    assert runs.allowed_rows(9).tolist() == [[True, False]]


def test_a_graph_batch_with_mention_links_and_padding() -> None:
    batch = graph_batch(compact=True)
    check_blocks(batch, WHOLE_AND_PARTS)
    check_band(batch)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    cases(),
    cases(),
    st.integers(0, 3),
    st.integers(0, 2),
    st.lists(st.tuples(*[st.floats(0, 1)] * 4), min_size=1, max_size=3),
)
def test_compact_runs_equal_the_dense_rows_runs(first, second, extra_long, extra_global, bounds) -> None:
    """Random compiled layouts (the compiler's property-test strategy) and random blocks."""
    tok = WordTokenizer()
    (graphs_a, schema), (graphs_b, _) = first, second
    instances = [compile_instance(g, schema, tok, compact=True) for g in (graphs_a, graphs_b)]
    batch = collate(
        instances,
        pad_to_long=max(i.long_length for i in instances) + extra_long,
        pad_to_global=max(i.global_length for i in instances) + extra_global,
    )
    check_blocks(batch, WHOLE_AND_PARTS + [tuple(sorted(b[:2])) + tuple(sorted(b[2:])) for b in bounds])
    check_band(batch)


def check_band(batch) -> None:
    """The band's skewed labels from the structure equal those skewed from the dense rows."""
    c = batch.compact
    for block in (None, 3, c.local_radius + 2):
        geo = geometry(c.batch_size, 1, c.global_length, c.long_length, c.local_radius, VOCAB, 1.0, block, 1 << 20)
        expected = local_index(geo, DenseSource(batch.side))
        with mock.patch.object(fused_cpu_labels, "dense_band", lambda *_: None):  # torch, where no C is built
            from_torch = local_index(geo, DenseSource(batch.side))
        for ours, source in ((local_index(geo, CompactSource(c)), "structure"), (from_torch, "torch")):
            for part, a, b in zip(("labels", "empty rows"), ours, expected):
                assert a.dtype == b.dtype and torch.equal(a, b), f"band {part} from the {source}, block {geo.block}"


@needs_kernel
def test_the_c_pass_finds_every_run_of_rows_with_many() -> None:
    """Rows that change label at most columns (the vectorized scan's 16 columns at a time and
    its tail), in strided views of a batch of three, with masked stretches and a fully masked
    row: chunk_labels gives the runs of torch's runs_of, and sink V + 1 exactly to the rows
    with no allowed key (A allows none here)."""
    gen = torch.Generator().manual_seed(3)
    mask = (torch.rand(3, 9, 53, generator=gen) < 0.7).int()
    mask[1, 4] = 0
    ids = torch.randint(0, 4, (3, 9, 53), generator=gen, dtype=torch.int32)
    for rows, cols in ((slice(0, 9), slice(0, 53)), (slice(2, 7), slice(5, 40)), (slice(3, 4), slice(0, 1))):
        m, i = mask[:, rows, cols], ids[:, rows, cols]
        n = m.shape[1]
        expected = runs_of(torch.where(m != 0, i, VOCAB))
        no_a = torch.full((3, n, 1), VOCAB, dtype=torch.int16)
        block = fused_cpu_labels.LabelBlock(
            n, n, slice(0, m.shape[2]), m, i, a_labels=no_a, a_empty=torch.ones(3, n, dtype=torch.bool)
        )
        (made,) = fused_cpu_labels.chunk_labels([block], 3, VOCAB, torch.int16, workers=1)
        where = f"rows {rows}, keys {cols}"
        assert made.run_ptr.tolist() == [0, *expected.counts.flatten().cumsum(0).tolist()], where
        assert torch.equal(made.run_start, expected.start) and torch.equal(made.run_label, expected.label), where
        assert torch.equal(made.sink, VOCAB + (~expected.allowed_rows(VOCAB)).to(torch.int16)), where


@needs_kernel
def test_the_c_pass_finds_each_rows_allowed_extent() -> None:
    """First allowed column and one past the last, (m, 0) for none: as torch finds them."""
    mask = torch.tensor([[[0, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]]], dtype=torch.int32)
    first, last = fused_cpu_labels.dense_extents(mask[:, :, :])
    assert first.tolist() == [[1, 5, 0, 4]] and last.tolist() == [[4, 0, 5, 5]]
    with mock.patch.object(fused_cpu_labels, "dense_extents", lambda *_: None):
        assert [t.tolist() for t in blocked_sources._mask_ranges(mask)] == [first.tolist(), last.tolist()]


@needs_kernel
def test_chunk_labels_by_hand() -> None:
    """V = 9. A global chunk of three rows (dense g2g over two globals, g2l over four tokens), a
    long chunk of three rows, the last past L (its A labels given, with the rows A leaves
    empty), and a chunk taking rows 1-2 and keys 3-5 of runs over whole rows (as from the
    structure): A's labels, each row's sink (V, or V + 1 for a row with no allowed key) and
    B's runs."""
    i32 = lambda rows: torch.tensor([rows], dtype=torch.int32)  # noqa: E731
    LabelBlock = fused_cpu_labels.LabelBlock  # noqa: N806
    global_chunk = LabelBlock(
        3, 3, slice(0, 4),
        b_mask=i32([[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]),
        b_ids=i32([[5, 5, 5, 5], [5, 5, 5, 5], [1, 1, 2, 2]]),
        a_mask=i32([[1, 0], [0, 0], [0, 1]]),  # row 0's only key is global 0
        a_ids=i32([[4, 4], [4, 4], [6, 7]]),
    )  # fmt: skip
    band = torch.tensor([[[3, 9], [9, 9], [9, 9]]], dtype=torch.int8)
    long_chunk = LabelBlock(
        3, 2, slice(0, 2), b_mask=i32([[1, 1], [0, 0]]), b_ids=i32([[2, 3], [0, 0]]),
        a_labels=band, a_empty=torch.tensor([[False, True, True]]),
    )  # fmt: skip
    whole = fused_cpu_labels.WholeRuns.of(runs_of(torch.tensor([[[1, 1, 2, 2, 9, 9], [9, 9, 9, 3, 3, 3], [4] * 6]])), 6)
    assert whole.ptr.tolist() == [0, 3, 5, 6]
    taken = LabelBlock(
        3, 2, slice(3, 6), whole=whole, row0=1, a_labels=band, a_empty=torch.tensor([[True, False, True]])
    )
    for workers in (1, 2):
        g, lo, t = fused_cpu_labels.chunk_labels([global_chunk, long_chunk, taken], 1, 9, torch.int8, workers)
        assert g.dense.tolist() == [[[4, 9], [9, 9], [9, 7]]]
        assert g.sink.tolist() == [[9, 10, 9]]
        assert g.run_ptr.tolist() == [0, 1, 2, 5]
        assert g.run_start.tolist() == [0, 0, 0, 2, 3] and g.run_label.tolist() == [9, 9, 1, 2, 9]
        assert lo.dense is band and lo.sink.tolist() == [[9, 10, 10]]
        assert lo.run_ptr.tolist() == [0, 2, 3, 3]  # the row past L has none
        assert lo.run_start.tolist() == [0, 1, 0] and lo.run_label.tolist() == [2, 3, 9]
        assert t.sink.tolist() == [[9, 9, 10]]  # keys 3-5 of row 1 are [3 3 3] (its run of 9s ends at 3)
        assert t.run_ptr.tolist() == [0, 1, 2, 2]
        assert t.run_start.tolist() == [0, 0] and t.run_label.tolist() == [3, 4]


def test_the_dense_source_joins_its_pieces_into_the_same_runs() -> None:
    """The dense source's torch runs (where C cannot take a layout), a few rows at a time."""
    batch = graph_batch(compact=True)
    rows, cols = slice(0, batch.compact.long_length), slice(0, 3)
    expected = dense_runs(batch.side, "l2g", rows, cols)
    assert_same(DenseSource(batch.side).l2g_runs(rows, cols, VOCAB), expected, "whole")
    with mock.patch.object(blocked_sources, "RUN_PIECE_ELEMENTS", 5):  # pieces of one or two rows
        assert_same(DenseSource(batch.side).l2g_runs(rows, cols, VOCAB), expected, "pieces")
