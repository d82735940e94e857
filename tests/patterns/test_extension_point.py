"""The patterns use the ETC layer's extension point instead of copies of it: an attention
pattern with `attend`, memory rows as key-only keys, one preparation per batch."""

from __future__ import annotations

import pytest
import torch
from test_compressive import MAX_DISTANCE, RADIUS, make_batch

import graphattn.patterns.longformer as longformer_module
from graphattn.nn import EtcConfig, EtcLayer
from graphattn.patterns.compressive import CompressiveConfig, CompressiveEncoder
from graphattn.patterns.dilated import dilated_attention
from graphattn.patterns.longformer import LongformerConfig, LongformerEncoder
from graphattn.patterns.longnet import LongNetPattern
from graphattn.patterns.segments import split_segments

PAIRS = ((8, 1), (16, 2))


def tiny_config(**changes) -> EtcConfig:
    base = dict(
        vocab_size=50,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=1,
        local_radius=3,
        relative_pos_max_distance=2,
        relative_vocab_size=8,
        hidden_dropout_prob=0.0,
    )
    return EtcConfig(**{**base, **changes})


def test_an_etc_layer_runs_longnet_through_its_pattern() -> None:
    """No global tokens: the layer's projections, LongNet's dilated attention, the layer's
    output projection and post-LN block, composed by hand, equal the layer with the pattern."""
    torch.manual_seed(0)
    layer = EtcLayer(tiny_config()).double().eval()
    long_hidden = torch.randn(2, 21, 32, dtype=torch.float64)
    no_globals = long_hidden[:, :0]
    padding = torch.arange(21)[None, :] < torch.tensor([[21], [17]])
    _, out = layer(no_globals, long_hidden, LongNetPattern(PAIRS, key_padding=padding))

    att = layer.attention
    heads = lambda x: x.view(2, 21, 2, 16).transpose(1, 2)  # noqa: E731
    attended = dilated_attention(
        heads(att.query(long_hidden)),
        heads(att.key(long_hidden)),
        heads(att.value(long_hidden)),
        PAIRS,
        key_padding=padding,
    )
    expected = layer.residual_block(long_hidden, att.output(attended.transpose(1, 2).reshape(2, 21, 32)))
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("backend", ["dense", "triton"])
def test_compressive_memory_slots_agree_across_backends(backend) -> None:
    """Key-only memory slots through every backend give the blocked backend's stream (fp32,
    head dim 16 for Triton)."""
    batch = make_batch(long_length=12)
    streams = {}
    for name in ("blocked", backend):
        torch.manual_seed(0)
        config = tiny_config(
            local_radius=RADIUS,
            relative_pos_max_distance=MAX_DISTANCE,
            relative_vocab_size=2 * MAX_DISTANCE + 6,
            num_hidden_layers=2,
            attention_backend=name,
        )
        encoder = CompressiveEncoder(
            config,
            CompressiveConfig(
                segment_length=4, memory_length=6, compressed_length=3, compression_rate=2, compression="mean_pool"
            ),
        ).eval()
        state, outs = None, []
        with torch.no_grad():
            for segment, _ in split_segments(batch, 4):
                out = encoder(segment, state)
                state, _ = out.state, outs.append(out.long_hidden)
        streams[name] = torch.cat(outs, dim=1)
    torch.testing.assert_close(streams[backend], streams["blocked"], rtol=1e-4, atol=1e-4)


def test_longformer_encoder_prepares_once_per_batch(monkeypatch) -> None:
    calls = []
    real = longformer_module.check_global_positions
    monkeypatch.setattr(longformer_module, "check_global_positions", lambda *a: (calls.append(1), real(*a))[1])
    config = LongformerConfig(
        vocab_size=50,
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=3,
        intermediate_size=64,
        attention_window=[4, 4, 8],
        attention_dilation=[1, 1, [1, 1, 2, 2]],
        hidden_dropout_prob=0.0,
        attention_backend="blocked",
        max_absolute_position_embeddings=64,
    )
    encoder = LongformerEncoder(config).eval()
    batch = make_batch(long_length=20)
    positions = torch.tensor([[0, 5], [3, -1]])
    pattern = encoder.prepare(positions, batch.long_input_mask != 0)
    assert sorted(pattern.windows) == [(2, (1, 1, 1, 1)), (4, (1, 1, 2, 2))]  # the first two layers share a window
    calls.clear()
    with torch.no_grad():
        encoder(batch, positions)
    assert len(calls) == 1
