"""Attention prepared once per batch: the same results as one call, checks run once, and no
host-device synchronisation inside the layer loop."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from kernel_cases import assert_all_close, graph_batch, synthetic_case

import graphattn.kernels.prepared as prepared_module
from graphattn.errors import BatchError
from graphattn.kernels import flex, global_local_attention, prepare_attention
from graphattn.nn import EtcConfig, EtcEncoder

BACKENDS = ["dense", "blocked", "triton"] + (["flex"] if flex.available() else [])


@pytest.fixture(scope="module")
def case():
    return synthetic_case(dtype=torch.float32, dim=16, num_long=21, num_global=5, radius=3, num_docs=2, mention_links=3)


def prepare_for(case, backend, **options):
    return prepare_attention(case.side, num_heads=2, head_dim=16, vocab_size=case.vocab, backend=backend, **options)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prepared_attention_equals_the_one_call_entry_point(case, backend) -> None:
    options = {"compiled": False} if backend == "flex" else {}
    attention = prepare_for(case, backend, **options)
    assert attention.backend == backend
    with torch.no_grad():
        first = attention.attend(*case.states, case.key_table, case.bias_table, 0.4)
        again = attention.attend(*case.states, case.key_table, case.bias_table, 0.4)  # a second layer: same plan
        if backend == "flex":
            expected = flex.attention(*case.states, case.side, case.key_table, case.bias_table, 0.4, compiled=False)
        else:
            expected = global_local_attention(
                *case.states, case.side, case.key_table, case.bias_table, backend=backend, scale=0.4
            )
    assert_all_close(list(first), list(expected), 1e-5)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_attend_checks_the_states_against_the_prepared_batch(case) -> None:
    attention = prepare_for(case, "blocked")
    shorter = [s[:, :, :-1] if i >= 3 else s for i, s in enumerate(case.states)]
    with pytest.raises(BatchError, match=r"long 20 \(prepared 21\)"):
        attention.attend(*shorter, case.key_table, case.bias_table)
    with pytest.raises(BatchError, match="prepared for a relative vocabulary of"):
        attention.attend(*case.states, case.key_table[:-1], None)
    assert "PreparedAttention(backend='blocked', B=2, G=5, G_keys=5, L=21" in repr(attention)


def encoder_and_batch(backend: str, layers: int = 3):
    batch = graph_batch()
    config = EtcConfig(
        vocab_size=200,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=layers,
        local_radius=3,
        relative_pos_max_distance=2,
        relative_vocab_size=16,
        hidden_dropout_prob=0.0,
        attention_backend=backend,
    )
    torch.manual_seed(0)
    return EtcEncoder(config).eval(), batch


def test_the_encoder_checks_label_ranges_once_per_forward(monkeypatch) -> None:
    calls = []
    real = prepared_module.check_label_ids
    monkeypatch.setattr(prepared_module, "check_label_ids", lambda *a: (calls.append(1), real(*a))[1])
    encoder, batch = encoder_and_batch("blocked", layers=3)
    with torch.no_grad():
        encoder(batch)
        assert len(calls) == 1  # not one per layer
        encoder(batch)
    assert len(calls) == 2


_SYNCING = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__")


@contextlib.contextmanager
def no_host_sync():
    """Tensor methods that read a value back to the host raise while the context is open."""
    saved = {name: getattr(torch.Tensor, name) for name in _SYNCING}

    def refuse(name):
        def method(self, *args, **kwargs):
            raise AssertionError(f"Tensor.{name} called inside the layer loop (a host-device synchronisation on a GPU)")

        return method

    try:
        for name in _SYNCING:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


@pytest.mark.parametrize("backend", ["dense", "blocked", "triton"])
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_no_host_device_synchronisation_inside_the_layer_loop(backend, grad) -> None:
    """FlexAttention is left out: its eager path traces through dynamo on every call, which reads
    0-dim CPU constants with .item() (on CUDA it runs compiled, without re-tracing)."""
    encoder, batch = encoder_and_batch(backend, layers=2)
    with torch.set_grad_enabled(grad):
        encoder.check_batch(batch)
        attention = encoder.prepare(batch)
        hidden = encoder.embeddings(batch)
        with no_host_sync():
            global_hidden, long_hidden = encoder.run_layers(*hidden, attention)
            if grad:
                (global_hidden.sum() + long_hidden.square().sum()).backward()
    expected = encoder(batch)
    torch.testing.assert_close(long_hidden, expected[1])


def test_the_guard_catches_a_synchronisation() -> None:
    with no_host_sync(), pytest.raises(AssertionError, match="Tensor.item"):
        torch.ones(2).sum().item()


@pytest.mark.parametrize("backend", ["dense", "blocked", "triton"])
def test_a_compact_batch_gives_what_its_dense_tensors_give(backend) -> None:
    encoder, _ = encoder_and_batch(backend, layers=2)
    batch = graph_batch(compact=True)
    assert batch.compact is not None
    with torch.no_grad():
        from_compact = encoder(dataclasses.replace(batch, side=None))
        from_dense = encoder(dataclasses.replace(batch, compact=None))
    for a, b in zip(from_compact, from_dense):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not flex.available(), reason="torch without FlexAttention")
def test_flex_from_a_compact_batch_equals_dense() -> None:
    batch = graph_batch(compact=True)
    gen = torch.Generator().manual_seed(3)
    b, g, l = batch.batch_size, batch.side.global_length, batch.side.long_length
    states = [torch.randn(b, 2, n, 16, generator=gen) for n in (g, g, g, l, l, l)]
    key_table, bias_table = torch.randn(16, 2, 16, generator=gen), torch.randn(16, 2, generator=gen)
    attention = prepare_attention(
        batch.compact, num_heads=2, head_dim=16, vocab_size=16, backend="flex", compiled=False
    )
    with torch.no_grad():
        ours = attention.attend(*states, key_table, bias_table)
        expected = global_local_attention(*states, batch.side, key_table, bias_table, backend="dense")
    assert_all_close(list(ours), list(expected), 1e-5)
