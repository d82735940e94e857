"""The Triton kernels reading the compact structure (labels and masks derived in registers) against
the dense oracle, a deterministic backward without atomics, and what is refused before launch.

Runs under TRITON_INTERPRET=1 (tests/conftest.py) with 16-token tiles, on layouts drawn by the
compiler's own property-test strategy (hierarchies, packed documents, segments with blocking and
a cross-segment label, links, g2g edges, hard masks, padding).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import RESULT_NAMES, assert_all_close, graph_batch

from graphattn.compile.batching import collate
from graphattn.errors import BatchError
from graphattn.kernels import dense, prepare_attention
from graphattn.kernels.triton import config as triton_config
from graphattn.kernels.triton import dkdv, dq, launches, tiles
from graphattn.kernels.triton import forward as triton_forward
from graphattn.kernels.triton import labels as triton_labels
from graphattn.kernels.triton.blocks import BlockSizes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compile"))
from compile_helpers import WordTokenizer  # noqa: E402
from test_compiler_properties import cases  # noqa: E402

from graphattn import compile_instance  # noqa: E402

TILES = BlockSizes(16, 16)


def random_states(batch, heads, num_global, num_long, dim, vocab, seed=0):
    gen = torch.Generator().manual_seed(seed)
    leaf = lambda *shape: torch.randn(*shape, generator=gen).requires_grad_()  # noqa: E731
    states = [leaf(batch, heads, n, dim) for n in (num_global,) * 3 + (num_long,) * 3]
    return states, leaf(vocab, heads, dim), leaf(vocab, heads)


def outputs_and_grads(attend, states, key_table, bias_table, seed=1):
    outs = attend(*states, key_table, bias_table, 0.3)
    gen = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=gen)).sum() for o in outs)
    return list(outs) + list(torch.autograd.grad(loss, [*states, key_table, bias_table]))


def structured_and_dense(batch, vocab, heads=2, dim=16, seed=0):
    side = batch.side
    states, key_table, bias_table = random_states(
        batch.batch_size, heads, side.global_length, side.long_length, dim, vocab, seed
    )
    attention = prepare_attention(
        batch.compact, num_heads=heads, head_dim=dim, vocab_size=vocab, backend="triton", block_sizes=TILES
    )
    assert attention.plan.for_states(torch.float32, dim).structured
    ours = outputs_and_grads(attention.attend, states, key_table, bias_table)
    expected = outputs_and_grads(lambda *a: dense.attention(*a[:6], side, *a[6:]), states, key_table, bias_table)
    return ours, expected


def test_structured_kernels_match_dense_on_a_compiled_graph_batch() -> None:
    """Mention links with their own label, document segments, hard g2l, a padded row."""
    ours, expected = structured_and_dense(graph_batch(compact=True), vocab=16)
    assert_all_close(ours, expected, 1e-5, RESULT_NAMES)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases(), cases(), st.integers(0, 20))
def test_structured_kernels_match_dense_on_random_layouts(first, second, extra_long) -> None:
    tok = WordTokenizer()
    (graphs_a, schema), (graphs_b, _) = first, second
    instances = [
        compile_instance(graphs_a, schema, tok, compact=True),
        compile_instance(graphs_b, schema, tok, compact=True),
    ]
    batch = collate(instances, pad_to_long=max(i.long_length for i in instances) + extra_long)
    ours, expected = structured_and_dense(batch, vocab=schema.relative_vocab_size)
    assert_all_close(ours, expected, 1e-5, RESULT_NAMES)


def on_graph_batch(form: str, backend: str = "triton", **options):
    """A compiled graph batch's structure ("structured": compact, "dense": the dense tensors)
    prepared for `backend`, random inputs, and the dense oracle's outputs and gradients on them."""
    batch = graph_batch(compact=True)
    structure = batch.compact if form == "structured" else batch.side
    inputs = random_states(2, 2, batch.side.global_length, batch.side.long_length, 16, 16)
    attention = prepare_attention(structure, num_heads=2, head_dim=16, vocab_size=16, backend=backend, **options)
    oracle = lambda: outputs_and_grads(lambda *a: dense.attention(*a[:6], batch.side, *a[6:]), *inputs)  # noqa: E731
    return attention, inputs, oracle


@pytest.mark.parametrize("form", ["structured", "dense"])
def test_two_backward_passes_are_bitwise_equal(form) -> None:
    attention, inputs, _ = on_graph_batch(form, block_sizes=TILES)
    first = outputs_and_grads(attention.attend, *inputs)
    second = outputs_and_grads(attention.attend, *inputs)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("backend", ["triton", "blocked"])
def test_a_compact_batch_never_becomes_dense_side_inputs(backend, monkeypatch) -> None:
    """The Triton kernels and the blocked backend read the CompactBatch itself: no [L, G] tensor."""
    import graphattn.kernels.structure as structure

    def refuse(*args, **kwargs):
        raise AssertionError("dense side inputs were built from the compact batch")

    monkeypatch.setattr(structure, "compact_to_side", refuse)
    options = {"block_sizes": TILES} if backend == "triton" else {}
    attention, inputs, oracle = on_graph_batch("structured", backend, **options)
    ours = outputs_and_grads(attention.attend, *inputs)
    assert attention.side is None
    assert_all_close(ours, oracle(), 1e-5, RESULT_NAMES)


def test_the_kernels_use_no_atomics() -> None:
    """Every output is written by the one program that owns it (the label gradients too)."""
    for module in (tiles, triton_forward, dq, dkdv, launches, triton_labels):
        assert "tl.atomic" not in inspect.getsource(module), module.__name__


# -- refused before launch ---------------------------------------------------------------------
def test_old_gpus_unknown_head_dims_and_exact_fp32_at_128_are_refused(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    with pytest.raises(
        BatchError, match=r"compute capability 7\.5.*need compute capability 8\.0.*backend='flex' or 'blocked'"
    ):
        triton_config.tile_candidates(torch.device("cuda"), 64, torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    with pytest.raises(
        BatchError, match=r"head_dim 96 in bfloat16.*compute capability 8\.6.*use head_dim 16, 32, 64 or 128"
    ):
        triton_config.tile_candidates(torch.device("cuda"), 96, torch.bfloat16)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    with pytest.raises(BatchError, match=r"head_dim 128 in float32.*8\.6.*allow_tf32"):
        triton_config.tile_candidates(torch.device("cuda"), 128, torch.float32)
    assert triton_config.tile_candidates(torch.device("cuda"), 64, torch.bfloat16)


def test_a_kernel_over_the_shared_memory_limit_is_refused_before_it_runs(monkeypatch) -> None:
    launched = []

    class FakeKernel:
        fn = SimpleNamespace(__name__="_forward_kernel")

        def warmup(self, *args, grid, **constants):
            return SimpleNamespace(metadata=SimpleNamespace(shared=200_000))

        def __getitem__(self, grid):
            return lambda *args, **constants: launched.append(grid)

    monkeypatch.setattr(triton_config, "shared_memory_limit", lambda device: 101376)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    with pytest.raises(
        triton_config.SharedMemoryExceeded,
        match=r"needs 200000 bytes of shared memory.*compute capability 8\.9.*101376",
    ):
        triton_config.check_shared_memory(
            FakeKernel(), (1,), (torch.bfloat16, 3), {"BLOCK_LM": 64}, torch.device("cuda", 0)
        )
    assert not launched


def test_more_than_128_labels_are_refused() -> None:
    batch = graph_batch()
    with pytest.raises(BatchError, match="at most 128 relative labels"):
        prepare_attention(batch.side, num_heads=2, head_dim=16, vocab_size=200, backend="triton")


@pytest.mark.parametrize("form", ["structured", "dense"])
def test_separate_query_and_key_tiles_and_split_label_gradients(form) -> None:
    """Query tiles of 32 rows against 16-token key tiles, dq and the label gradients written by
    two launches (the head-dim-128 configuration), key-owner tiles of their own."""
    from graphattn.kernels.triton.blocks import KernelTiles, TileConfig

    tiles = TileConfig(
        KernelTiles(32, 16, 16, 16), KernelTiles(16, 32, 16, 16, split_label_grads=True), KernelTiles(16, 16, 32, 16)
    )
    attention, inputs, oracle = on_graph_batch(form, block_sizes=tiles)
    assert_all_close(outputs_and_grads(attention.attend, *inputs), oracle(), 1e-5, RESULT_NAMES)


def test_auto_sends_exact_fp32_on_a_gpu_to_flex(monkeypatch) -> None:
    import graphattn.kernels.prepared as prepared

    monkeypatch.setattr(prepared, "triton_available", lambda: True)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    cuda = torch.device("cuda")
    assert prepared.resolve_backend("auto", cuda, torch.bfloat16) == "triton"
    assert prepared.resolve_backend("auto", cuda, torch.float32) == ("flex" if prepared.flex.available() else "blocked")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    assert prepared.resolve_backend("auto", cuda, torch.float32) == "triton"
    assert prepared.resolve_backend("auto", torch.device("cpu"), torch.bfloat16) == "blocked"
