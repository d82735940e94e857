"""GlobalLocalAttention: BERT equivalence without globals, Q/K/V sharing, relative tables."""

from __future__ import annotations

import pytest
import torch

from graphattn.contract import SideInputs
from graphattn.kernels.synthetic import synthetic_side_inputs
from graphattn.nn import EtcConfig, GlobalLocalAttention


def tiny_config(**changes) -> EtcConfig:
    base = dict(
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=2,
        local_radius=20,
        relative_pos_max_distance=2,
        relative_vocab_size=8,
        vocab_size=50,
        hidden_dropout_prob=0.0,
    )
    return EtcConfig(**{**base, **changes})


def long_only_side(batch: int, length: int, radius: int) -> SideInputs:
    """No global tokens; every key inside the sequence is visible (radius >= length)."""
    offsets = torch.arange(-radius, radius + 1)
    keys = torch.arange(length)[:, None] + offsets
    l2l = ((keys >= 0) & (keys < length)).int().expand(batch, -1, -1).contiguous()
    empty = lambda *shape: torch.zeros(*shape, dtype=torch.int32)  # noqa: E731
    return SideInputs(
        l2l,
        empty(batch, 0, 0),
        empty(batch, length, 0),
        empty(batch, 0, length),
        torch.zeros_like(l2l),
        empty(batch, 0, 0),
        empty(batch, length, 0),
        empty(batch, 0, length),
    )


@pytest.mark.parametrize("backend", ["dense", "blocked"])
def test_no_globals_and_full_radius_is_bert_self_attention(backend) -> None:
    config = tiny_config(attention_backend=backend)
    module = GlobalLocalAttention(config).double()
    with torch.no_grad():
        module.relative_key_table.zero_()  # no labels
    long_hidden = torch.randn(2, 12, 32, dtype=torch.float64)
    global_hidden = torch.zeros(2, 0, 32, dtype=torch.float64)
    _, long_out = module(global_hidden, long_hidden, long_only_side(2, 12, config.local_radius))

    heads = lambda x: x.view(2, 12, 2, 16).transpose(1, 2)  # noqa: E731
    q, k, v = heads(module.query(long_hidden)), heads(module.key(long_hidden)), heads(module.value(long_hidden))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    expected = module.output(expected.transpose(1, 2).reshape(2, 12, 32))
    torch.testing.assert_close(long_out, expected, rtol=1e-10, atol=1e-10)


def test_separate_global_projections_equal_shared_ones_when_copied() -> None:
    side, _ = synthetic_side_inputs(2, 15, 4, 3, 2)
    shared = GlobalLocalAttention(tiny_config(local_radius=3))
    separate = GlobalLocalAttention(
        tiny_config(local_radius=3, share_qkv_projections=False, global_token_projections=True)
    )
    assert {"global_query.weight", "global_key.bias", "global_value.weight"} <= set(separate.state_dict())
    assert not any(name.startswith("global_") for name in shared.state_dict())
    separate.load_state_dict(shared.state_dict(), strict=False)
    for name in ("query", "key", "value"):
        getattr(separate, f"global_{name}").load_state_dict(getattr(shared, name).state_dict())
    g, x = torch.randn(2, 4, 32), torch.randn(2, 15, 32)
    for a, b in zip(shared(g, x, side), separate(g, x, side)):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        separate.global_query.weight.add_(0.5)
    global_out, long_out = separate(g, x, side)
    assert not torch.allclose(global_out, shared(g, x, side)[0])
    torch.testing.assert_close(long_out, shared(g, x, side)[1])  # long queries use the long projection


def test_relative_tables_receive_gradients() -> None:
    side, _ = synthetic_side_inputs(1, 10, 3, 3, 2, mention_links=2)
    module = GlobalLocalAttention(tiny_config(local_radius=3, relative_bias=True))
    assert module.relative_key_table.shape == (8, 2, 16) and module.relative_bias_table.shape == (8, 2)
    global_out, long_out = module(torch.randn(1, 3, 32), torch.randn(1, 10, 32), side)
    (global_out.square().sum() + long_out.square().sum()).backward()
    assert module.relative_key_table.grad.abs().sum() > 0
    assert module.relative_bias_table.grad.abs().sum() > 0
