"""Compressive memory: FIFO bookkeeping step by step, each compression function by hand, the
stop-gradient of the reconstruction loss, constant per-segment key sets, memory labels, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn.contract import EtcBatch
from graphattn.errors import BatchError, GraphattnError
from graphattn.kernels import PreparedAttention
from graphattn.kernels.synthetic import synthetic_side_inputs
from graphattn.nn import EtcConfig, EtcEncoder
from graphattn.patterns.compression import Compressor, attention_reconstruction_loss
from graphattn.patterns.compressive import (
    CompressiveConfig,
    CompressiveEncoder,
    LayerMemory,
    append_compressed,
    push_segment,
)
from graphattn.patterns.segments import clipped_distance_ids, split_segments, widen_with_memory

RADIUS, MAX_DISTANCE = 2, 2


def make_batch(batch=2, long_length=24, global_length=6, long_padding=0, seed=0) -> EtcBatch:
    side, layout = synthetic_side_inputs(
        batch, long_length, global_length, RADIUS, MAX_DISTANCE, long_padding=long_padding, seed=seed
    )
    gen = torch.Generator().manual_seed(seed)
    return EtcBatch(
        long_token_ids=torch.randint(1, 40, (batch, long_length), generator=gen),
        long_type_ids=torch.zeros(batch, long_length, dtype=torch.long),
        global_token_ids=torch.randint(1, 40, (batch, global_length), generator=gen),
        global_type_ids=torch.zeros(batch, global_length, dtype=torch.long),
        long_input_mask=(layout.long_doc >= 0).int(),
        global_input_mask=torch.ones(batch, global_length, dtype=torch.int32),
        side=side,
        vocab_size=layout.vocab_size,
    )


def make_encoder(
    compression="mean_pool", segment=4, memory=6, compressed=3, rate=2, layers=2, backend="blocked"
) -> CompressiveEncoder:
    torch.manual_seed(0)
    config = EtcConfig(
        vocab_size=40,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        num_hidden_layers=layers,
        local_radius=RADIUS,
        relative_pos_max_distance=MAX_DISTANCE,
        relative_vocab_size=2 * MAX_DISTANCE + 6,
        hidden_dropout_prob=0.0,
        attention_backend=backend,
    )
    mem = CompressiveConfig(
        segment_length=segment,
        memory_length=memory,
        compressed_length=compressed,
        compression_rate=rate,
        compression=compression,
    )
    return CompressiveEncoder(config, mem).double().eval()


# --- FIFO bookkeeping -------------------------------------------------------------------------

# n_s = 4, n_m = 6, n_cm = 3, c = 2: after each segment, the stream positions held in memory and
# the [start, stop) spans of the compressed slots (oldest first).
EXPECTED_FIFO = [
    ([0, 1, 2, 3], []),
    ([2, 3, 4, 5, 6, 7], [[0, 2]]),
    ([6, 7, 8, 9, 10, 11], [[0, 2], [2, 4], [4, 6]]),
    ([10, 11, 12, 13, 14, 15], [[4, 6], [6, 8], [8, 10]]),
    ([14, 15, 16, 17, 18, 19], [[8, 10], [10, 12], [12, 14]]),
    ([18, 19, 20, 21, 22, 23], [[12, 14], [14, 16], [16, 18]]),
]


def test_fifo_bookkeeping_step_by_step() -> None:
    encoder = make_encoder()
    batch = make_batch()
    segments = split_segments(batch, 4)
    embedded = torch.cat([encoder.encoder.embeddings(seg)[1] for seg, _ in segments], dim=1)  # layer-0 inputs
    state = None
    with torch.no_grad():
        for step, ((segment, _), (memory_positions, spans)) in enumerate(zip(segments, EXPECTED_FIFO)):
            state = encoder(segment, state).state
            for layer in state.layers:
                assert layer.memory_positions[0].tolist() == memory_positions, f"memory after segment {step}"
                assert layer.compressed_spans[0].tolist() == spans, f"compressed memory after segment {step}"
            assert state.next_position == 4 * (step + 1)
            first = state.layers[0]
            torch.testing.assert_close(first.memory, embedded[:, memory_positions])
            for slot, (start, stop) in enumerate(spans):  # mean pool of the layer-0 inputs it replaced
                torch.testing.assert_close(first.compressed[:, slot], embedded[:, start:stop].mean(dim=1))


@settings(max_examples=30, deadline=None)
@given(
    segment=st.integers(1, 5),
    memory=st.integers(0, 8),
    compressed=st.integers(0, 5),
    rate=st.integers(1, 3),
    segments=st.integers(1, 8),
)
def test_fifo_matches_a_list_simulation(segment, memory, compressed, rate, segments) -> None:
    """push_segment + mean-pool compression + append_compressed against plain Python lists,
    straight from the paper's update rule, with the activation equal to its stream position."""
    state = LayerMemory.empty(1, 1, dtype=torch.float64)
    pool = Compressor("mean_pool", 1, rate)
    held, packed = [], []  # lists of positions / of (start, stop, mean)
    for step in range(segments):
        positions = list(range(step * segment, (step + 1) * segment))
        hidden = torch.tensor(positions, dtype=torch.float64).view(1, -1, 1)
        state, evicted = push_segment(
            state, hidden, torch.tensor([positions]), torch.ones(1, segment, dtype=torch.bool), memory
        )
        joined = held + positions
        old, held = joined[: max(len(joined) - memory, 0)], joined[max(len(joined) - memory, 0) :]
        if old and compressed:
            new, valid, spans = pool(evicted.hidden, evicted.valid)
            spans = evicted.positions[0][spans[..., 0]], evicted.positions[0][spans[..., 1] - 1] + 1
            state = append_compressed(state, new, torch.stack(spans, -1), valid, compressed)
            chunks = [old[i : i + rate] for i in range(0, len(old), rate)]
            packed = (packed + [(c[0], c[-1] + 1, sum(c) / len(c)) for c in chunks])[-compressed:]
        assert state.memory_positions[0].tolist() == held
        assert state.memory.flatten().tolist() == [float(p) for p in held]
        assert state.compressed_spans[0].tolist() == [[a, b] for a, b, _ in packed]
        assert state.compressed.flatten().tolist() == pytest.approx([m for _, _, m in packed])


def test_push_and_append_by_hand() -> None:
    memory = LayerMemory.empty(1, 1)
    h = lambda *xs: torch.tensor(xs, dtype=torch.float32).view(1, -1, 1)  # noqa: E731
    pos = lambda *xs: torch.tensor([xs])  # noqa: E731
    memory, evicted = push_segment(
        memory, h(10, 11, 12), pos(0, 1, 2), torch.ones(1, 3, dtype=torch.bool), memory_length=4
    )
    assert evicted.hidden.shape[1] == 0 and memory.memory.flatten().tolist() == [10, 11, 12]
    memory, evicted = push_segment(
        memory, h(13, 14, 15), pos(3, 4, 5), torch.ones(1, 3, dtype=torch.bool), memory_length=4
    )
    assert memory.memory.flatten().tolist() == [12, 13, 14, 15] and evicted.hidden.flatten().tolist() == [10, 11]
    assert evicted.positions.tolist() == [[0, 1]]
    for value in (1.0, 2.0, 3.0):
        memory = append_compressed(
            memory, h(value), torch.tensor([[[0, 2]]]), torch.ones(1, 1, dtype=torch.bool), compressed_length=2
        )
    assert memory.compressed.flatten().tolist() == [2.0, 3.0]


def test_padding_is_remembered_as_invalid_and_never_compressed_into_values() -> None:
    encoder = make_encoder(compression="max_pool")
    batch = make_batch(long_length=12, long_padding=5)  # real tokens 0..6
    state = None
    with torch.no_grad():
        for segment, _ in split_segments(batch, 4):
            state = encoder(segment, state).state
    layer = state.layers[0]
    assert layer.memory_positions[0].tolist() == [6, 7, 8, 9, 10, 11]
    assert layer.memory_valid[0].tolist() == [True, False, False, False, False, False]
    assert layer.compressed_spans[0].tolist() == [[0, 2], [2, 4], [4, 6]] and layer.compressed_valid[0].all()


# --- compression functions --------------------------------------------------------------------


def rows(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).view(1, -1, 1)


ALL_VALID = torch.ones(1, 6, dtype=torch.bool)


def test_pools_by_hand() -> None:
    old = rows(1, 5, 3, -2, 4, 0)
    out, valid, spans = Compressor("max_pool", 1, 3)(old, ALL_VALID)
    assert (
        out.flatten().tolist() == [5, 4] and valid.tolist() == [[True, True]] and spans.tolist() == [[[0, 3], [3, 6]]]
    )
    out, _, _ = Compressor("mean_pool", 1, 3)(old, ALL_VALID)
    assert out.flatten().tolist() == pytest.approx([3.0, 2.0 / 3.0])
    # padding is ignored by both; a ragged tail of 2 rows with c = 4 becomes a second slot
    partly = torch.tensor([[True, False, True, True, False, False]])
    assert Compressor("max_pool", 1, 3)(old, partly)[0].flatten().tolist() == [3, -2]
    assert Compressor("mean_pool", 1, 3)(old, partly)[0].flatten().tolist() == [2, -2]
    out, valid, spans = Compressor("mean_pool", 1, 4)(old, ALL_VALID)
    assert out.flatten().tolist() == [1.75, 2.0] and spans.tolist() == [[[0, 4], [4, 6]]]


def test_conv_by_hand() -> None:
    conv = Compressor("conv", 1, 3)
    with torch.no_grad():
        conv.conv.weight.copy_(torch.tensor([[[1.0, 10.0, 100.0]]]))
        conv.conv.bias.fill_(0.5)
    out, valid, spans = conv(rows(1, 2, 3, 4, 5, 6), ALL_VALID)
    assert out.shape == (1, 2, 1)
    assert out.flatten().tolist() == [321.5, 654.5]  # 1 + 20 + 300 + 0.5, 4 + 50 + 600 + 0.5


def test_dilated_conv_by_hand() -> None:
    # c = 2, dilation 3: slot k reads rows 2k and 2k+3; the last slot's second tap is past the end.
    conv = Compressor("dilated_conv", 1, 2, dilation=3)
    with torch.no_grad():
        conv.conv.weight.copy_(torch.tensor([[[1.0, 10.0]]]))
        conv.conv.bias.zero_()
    out, valid, spans = conv(rows(1, 2, 3, 4, 5, 6), ALL_VALID)
    assert out.flatten().tolist() == [41.0, 63.0, 5.0]  # 1 + 40, 3 + 60, 5 + 0
    assert spans.tolist() == [[[0, 4], [2, 6], [4, 6]]]


def test_most_used_keeps_top_rows_in_order() -> None:
    usage = torch.tensor([[0.1, 0.5, 0.05, 0.2, 0.9, 0.3]])
    out, valid, spans = Compressor("most_used", 1, 3)(rows(1, 2, 3, 4, 5, 6), ALL_VALID, usage)
    assert out.flatten().tolist() == [2, 5] and spans.tolist() == [[[1, 2], [4, 5]]]
    padded = torch.tensor([[True, False, True, True, False, True]])
    assert Compressor("most_used", 1, 3)(rows(1, 2, 3, 4, 5, 6), padded, usage)[0].flatten().tolist() == [4, 6]
    with pytest.raises(ValueError, match="usage"):
        Compressor("most_used", 1, 3)(rows(1, 2, 3), ALL_VALID[:, :3])


@pytest.mark.parametrize("kind", ["max_pool", "mean_pool", "conv", "dilated_conv", "most_used"])
def test_every_compression_runs_in_the_encoder(kind) -> None:
    encoder = make_encoder(compression=kind)
    state = None
    with torch.no_grad():
        for segment, _ in split_segments(make_batch(), 4):
            out = encoder(segment, state)
            state = out.state
    layer = state.layers[1]
    assert layer.compressed.shape == (2, 3, 16) and torch.isfinite(layer.compressed).all()
    assert out.reconstruction_loss.item() >= 0


# --- the reconstruction loss's stop-gradient --------------------------------------------------


def two_segments(kind="conv"):
    encoder = make_encoder(compression=kind).train()
    segments = split_segments(make_batch(), 4)
    first = encoder(segments[0][0])
    second = encoder(segments[1][0], first.state)  # evicts 2 rows per layer
    return encoder, second


def test_reconstruction_loss_reaches_only_the_compression_network() -> None:
    encoder, out = two_segments()
    assert out.reconstruction_loss.item() > 0
    out.reconstruction_loss.backward()
    main = {name: p.grad for name, p in encoder.encoder.named_parameters()}
    assert all(g is None or not g.any() for g in main.values()), [
        n for n, g in main.items() if g is not None and g.any()
    ]
    for compressor in encoder.compressors:
        assert compressor.conv.weight.grad is not None and compressor.conv.weight.grad.abs().sum() > 0


def test_task_loss_does_not_reach_the_compression_network() -> None:
    encoder, out = two_segments()
    (out.long_hidden.sum() + out.global_hidden.sum()).backward()
    assert all(p.grad is None for p in encoder.compressors.parameters())
    assert encoder.encoder.layer[0].attention.key.weight.grad.abs().sum() > 0


def test_reconstruction_loss_is_zero_for_a_perfect_copy() -> None:
    attention = make_encoder().encoder.layer[0].attention
    h, old = torch.randn(1, 4, 16, dtype=torch.float64), torch.randn(1, 6, 16, dtype=torch.float64)
    ok, valid = torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 6, dtype=torch.bool)
    assert attention_reconstruction_loss(attention, h, ok, old, valid, old.clone(), valid).item() == pytest.approx(
        0.0, abs=1e-20
    )
    assert attention_reconstruction_loss(attention, h, ok, old, valid, old[:, :3], valid[:, :3]).item() > 0


def test_training_on_the_reconstruction_loss_lowers_it() -> None:
    attention = make_encoder().encoder.layer[0].attention
    gen = torch.Generator().manual_seed(1)
    h, old = (
        torch.randn(1, 8, 16, generator=gen, dtype=torch.float64),
        torch.randn(1, 12, 16, generator=gen, dtype=torch.float64),
    )
    ok_h, ok_old = torch.ones(1, 8, dtype=torch.bool), torch.ones(1, 12, dtype=torch.bool)
    compressor = Compressor("conv", 16, 3).double()
    optimizer = torch.optim.Adam(compressor.parameters(), lr=1e-2)

    def loss():
        compressed, valid, _ = compressor(old, ok_old)
        return attention_reconstruction_loss(attention, h, ok_h, old, ok_old, compressed, valid)

    before = loss().item()
    for _ in range(40):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
    assert loss().item() < 0.5 * before


# --- cost per segment and what the keys are ---------------------------------------------------


def test_key_set_per_segment_does_not_grow_with_the_stream(monkeypatch) -> None:
    """Memories are key-only slots: one global query row per segment, 1 + n_cm + n_m keys."""
    seen = []
    real = PreparedAttention.attend

    def spy(self, gq, gk, gv, lq, lk, lv, *args, **kwargs):
        side = self.side
        shapes = (gq.shape, gk.shape, lk.shape, side.l2g_att_mask.shape, side.g2g_att_mask.shape)
        seen.append(tuple(tuple(s) for s in shapes))
        return real(self, gq, gk, gv, lq, lk, lv, *args, **kwargs)

    monkeypatch.setattr(PreparedAttention, "attend", spy)
    encoder = make_encoder(layers=1)
    batch = make_batch(batch=1, long_length=64, global_length=1)  # one global: every segment keeps it
    counts = []
    with torch.no_grad():
        state = None
        for segment, _ in split_segments(batch, 4):
            out = encoder(segment, state)
            state, _ = out.state, counts.append(out.key_counts)
    assert len(seen) == 16
    keys = 1 + 3 + 6  # one global + n_cm + n_m, from the fourth segment on
    assert seen[3:] == [((1, 2, 1, 8), (1, 2, keys, 8), (1, 2, 4, 8), (1, 4, keys), (1, 1, keys))] * 13
    assert [c["memory"] + c["compressed"] for c in counts] == [0, 4, 7, 9] + [9] * 12


def test_global_tokens_see_the_memories() -> None:
    encoder = make_encoder()
    segments = split_segments(make_batch(), 4)
    with torch.no_grad():
        state = encoder(segments[0][0]).state
        with_memory = encoder(segments[1][0], state)
        state.layers[0].memory.mul_(3.0)  # change what layer 0 remembers
        changed = encoder(segments[1][0], state)
    assert not torch.allclose(with_memory.global_hidden, changed.global_hidden)
    assert not torch.allclose(with_memory.long_hidden, changed.long_hidden)


def test_without_memory_the_layer_is_the_etc_layer() -> None:
    encoder = make_encoder(memory=0, compressed=0)
    batch = make_batch(long_length=8)
    with torch.no_grad():
        out = encoder(batch)
        reference = encoder.encoder(batch)
    torch.testing.assert_close(out.global_hidden, reference[0])
    torch.testing.assert_close(out.long_hidden, reference[1])


def test_widened_side_inputs_by_hand() -> None:
    side = make_batch(batch=1, long_length=3, global_length=1).side
    out = widen_with_memory(
        side,
        torch.tensor([[10, 11, 12]]),
        torch.tensor([[True]]),
        torch.tensor([[8, 9]]),
        torch.tensor([[False, True]]),
        max_distance=2,
        memory_label=8,
        compressed_label=9,
    )
    # global keys: [own global, compressed, memory@8, memory@9]; memory@8 is padding
    assert out.l2g_att_mask[0, :, 1:].tolist() == [[1, 0, 1]] * 3
    # key 8 from query 10 is 2 to the left (id 4), key 9 from 10: 1 left (3), from 12: 3 -> clipped 4
    assert out.l2g_relative_att_ids[0, :, 1:].tolist() == [[9, 4, 3], [9, 4, 4], [9, 4, 4]]
    # key-only slots: the one global query row sees them, no rows are added for them
    assert out.g2g_att_mask[0].tolist() == [[side.g2g_att_mask[0, 0, 0].item(), 1, 0, 1]]
    assert out.g2g_relative_att_ids[0, 0, 1:].tolist() == [9, 8, 8]
    assert out.g2l_att_mask.shape == (1, 1, 3)
    assert clipped_distance_ids(torch.tensor([0, 1, 5, -1, -5]), 2).tolist() == [0, 1, 2, 3, 4]


def test_segments_cut_local_windows_and_keep_linked_globals() -> None:
    batch = make_batch(batch=1, long_length=10, global_length=3)
    segments = split_segments(batch, 4)
    assert [s.long_token_ids.shape[1] for s, _ in segments] == [4, 4, 2]
    second = segments[1][0].side.l2l_att_mask[0]  # tokens 4..7, window offsets -2..2
    assert second[0, :2].tolist() == [0, 0] and second[3, 3:].tolist() == [0, 0]
    for segment, kept in segments:
        assert segment.global_token_ids.tolist() == batch.global_token_ids[:, kept].tolist()


def test_errors_name_the_problem() -> None:
    encoder = make_encoder()
    batch = make_batch()
    with pytest.raises(BatchError, match="reserved for memory keys"):
        encoder(EtcBatch(**{**batch.__dict__, "vocab_size": encoder.config.relative_vocab_size}))
    state = encoder.initial_state(3)
    with pytest.raises(BatchError, match="batch size 3"):
        encoder(split_segments(batch, 4)[0][0], state)
    with pytest.raises(GraphattnError, match="compression"):
        CompressiveConfig(compression="zip")
    with pytest.raises(GraphattnError, match="memory_length"):
        CompressiveConfig(memory_length=-1)


def test_enwik8_preset_and_encode_document() -> None:
    preset = CompressiveConfig.enwik8()
    assert (preset.segment_length, preset.memory_length, preset.compressed_length, preset.compression_rate) == (
        768,
        768,
        1152,
        3,
    )
    encoder = make_encoder()
    batch = make_batch(long_length=10, global_length=3)
    with torch.no_grad():
        global_hidden, long_hidden, outputs = encoder.encode_document(batch)
    assert long_hidden.shape == (2, 10, 16) and global_hidden.shape == (2, 3, 16) and len(outputs) == 3
    torch.testing.assert_close(long_hidden[:, 8:], outputs[-1].long_hidden)


def test_encoder_weights_are_an_etc_encoders() -> None:
    encoder = make_encoder()
    plain = EtcEncoder(encoder.config).double()
    plain.load_state_dict(encoder.encoder.state_dict())  # same names, same shapes
