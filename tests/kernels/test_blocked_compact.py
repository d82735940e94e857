"""The blocked backend reading a batch's compact structure chunk by chunk: the same results as
from the dense tensors, and no block of masks larger than a chunk ever exists."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import RESULT_NAMES, assert_all_close

from graphattn.compact import CompactBatch, CompactSideInputs
from graphattn.compile.batching import collate
from graphattn.kernels import blocked_fused, fused_cpu, fused_cpu_labels, prepare_attention, structure

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compile"))
from compile_helpers import WordTokenizer  # noqa: E402
from test_compiler_properties import cases  # noqa: E402

from graphattn import compile_instance  # noqa: E402


def run_both(batch, vocab, dtype=torch.float64, **options):
    side = batch.side
    gen = torch.Generator().manual_seed(0)
    leaf = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_()  # noqa: E731
    states = [leaf(batch.batch_size, 2, n, 8) for n in (side.global_length,) * 3 + (side.long_length,) * 3]
    tables = [leaf(vocab, 2, 8), leaf(vocab, 2)]
    results = []
    for form in (batch.compact, side):
        attention = prepare_attention(form, num_heads=2, head_dim=8, vocab_size=vocab, backend="blocked", **options)
        outs = attention.attend(*states, *tables, 0.3)
        weights = torch.Generator().manual_seed(1)
        loss = sum((o * torch.randn(o.shape, generator=weights, dtype=o.dtype)).sum() for o in outs)
        results.append(list(outs) + list(torch.autograd.grad(loss, [*states, *tables])))
    return results


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases(), cases(), st.integers(0, 5), st.sampled_from([1, 300, 1 << 21]), st.sampled_from([None, 3]))
def test_compact_chunks_match_the_dense_tensors(first, second, extra_long, tile_elements, block_size) -> None:
    tok = WordTokenizer()
    (graphs_a, schema), (graphs_b, _) = first, second
    instances = [
        compile_instance(graphs_a, schema, tok, compact=True),
        compile_instance(graphs_b, schema, tok, compact=True),
    ]
    batch = collate(instances, pad_to_long=max(i.long_length for i in instances) + extra_long)
    block_size = max(block_size or 0, schema.local_radius) if block_size else None
    compact, dense = run_both(
        batch, schema.relative_vocab_size, tile_elements=tile_elements, block_size=block_size, workers=1
    )
    assert_all_close(compact, dense, 1e-10, RESULT_NAMES)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases(), cases(), st.integers(0, 5), st.sampled_from([None, 1, 3]))
def test_the_fused_kernel_reads_the_same_labels_from_either_form(first, second, extra_long, key_block) -> None:
    """fp32 on the fused CPU kernel: labels derived from the structure (runs, band) give the
    results of labels derived from the dense tensors, bit for bit; and so do both made by
    torch chunk by chunk (where fused_cpu_labels.chunk_labels cannot take a layout) instead of C."""
    if not fused_cpu.available():
        pytest.skip(fused_cpu.why_not())
    tok = WordTokenizer()
    (graphs_a, schema), (graphs_b, _) = first, second
    instances = [compile_instance(g, schema, tok, compact=True) for g in (graphs_a, graphs_b)]
    batch = collate(instances, pad_to_long=max(i.long_length for i in instances) + extra_long)
    with mock.patch.object(blocked_fused, "KEY_BLOCK", key_block or blocked_fused.KEY_BLOCK):
        compact, dense = run_both(batch, schema.relative_vocab_size, torch.float32, fused=True, workers=1)
        with mock.patch.object(fused_cpu_labels, "chunk_labels", lambda *_: None):
            by_torch = run_both(batch, schema.relative_vocab_size, torch.float32, fused=True, workers=1)
    for name, a, b, *torch_made in zip(RESULT_NAMES, compact, dense, *by_torch):
        assert torch.equal(a, b), name
        assert all(torch.equal(a, c) for c in torch_made), f"{name}: labels made by torch"


def long_compact_batch(length: int, num_global: int) -> CompactBatch:
    """One document, one sentence global per 16 tokens, hard g2l, a few mention links."""
    owners = (np.arange(length) // (length // num_global)).astype(np.int32)[None]
    zeros = lambda n: np.zeros(n, np.int32)  # noqa: E731
    links = np.arange(0, length, 997, dtype=np.int32)
    side = CompactSideInputs(
        local_radius=84,
        max_distance=12,
        levels=("sentence",),
        owners=owners,
        long_doc=zeros(length),
        long_segment=zeros(length),
        global_doc=zeros(num_global),
        global_segment=zeros(num_global),
        global_blockable=np.zeros(num_global, bool),
        long_hard_l2g=np.zeros(length, bool),
        global_hard_g2l=np.ones(num_global, bool),
        link_long=links,
        link_global=(links * 7) % num_global,
        link_label=np.full(len(links), 27, np.int32),
    )
    return CompactBatch.from_instances([side], length, num_global).to_torch()


def test_no_mask_block_larger_than_a_chunk_is_built(monkeypatch) -> None:
    """L = 16384, G = 1024: a dense l2g tensor would have 16.8M entries; the chunks derive blocks
    of one chunk's rows against the keys they may see, a small fraction of that."""
    length, num_global = 16384, 1024
    compact = long_compact_batch(length, num_global)
    sizes = []
    for name in ("dense_l2g", "dense_g2l", "dense_g2g"):
        real = getattr(structure, name)
        monkeypatch.setattr(
            structure,
            name,
            lambda *a, real=real, **k: (lambda out: (sizes.append(out[0].numel()), out)[1])(real(*a, **k)),
        )
    attention = prepare_attention(
        compact, num_heads=2, head_dim=8, vocab_size=32, backend="blocked", tile_elements=1 << 18, workers=1
    )
    gen = torch.Generator().manual_seed(0)
    states = [torch.randn(1, 2, n, 8, generator=gen) for n in (num_global,) * 3 + (length,) * 3]
    with torch.no_grad():
        global_out, long_out = attention.attend(*states, torch.randn(32, 2, 8, generator=gen), None)
    geo = attention.plan.geo
    chunk_rows = geo.blocks_per_chunk * geo.block
    bound = max(chunk_rows * num_global, geo.global_rows_per_chunk * length)
    assert sizes and max(sizes) <= bound <= length * num_global // 16
    assert torch.isfinite(long_out).all() and torch.isfinite(global_out).all()


def test_fused_plans_take_small_global_chunks_where_hard_g2l_keeps_each_rows_keys_few() -> None:
    """Hard g2l: each global sees its sentence's 16 tokens, so 256-row chunks would score every
    long key for every row; the fused plan's cost model picks chunks whose spans stay small. Soft
    g2l rows see the whole document: the largest chunks are cheapest."""
    if not fused_cpu.available():
        pytest.skip(fused_cpu.why_not())
    hard = long_compact_batch(4096, 256)
    soft = hard.map(lambda t: t.clone())
    soft.global_hard_g2l.zero_()
    rows = {}
    for name, batch in (("hard", hard), ("soft", soft)):
        prepared = prepare_attention(batch, num_heads=2, head_dim=8, vocab_size=32, backend="blocked", workers=2)
        geo, spans = prepared._plan.geo, prepared._plan.global_spans
        rows[name] = geo.global_rows_per_chunk
        if name == "hard":  # a few chunks reach farther through mention links
            narrow = [hi - lo <= 2 * 16 * geo.global_rows_per_chunk for lo, hi in spans]
            assert sum(narrow) >= 0.75 * len(narrow), spans
    assert rows["soft"] == 256 and rows["hard"] <= 64, rows
