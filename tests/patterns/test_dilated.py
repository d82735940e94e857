"""LongNet dilated attention against hand-made layouts, the paper's literal formula and the dense
multiplicity reference (outputs and gradients)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn.errors import BatchError
from graphattn.patterns import segment_attention as segment_module
from graphattn.patterns.dilated import (
    LONGNET_SCHEDULE,
    dilated_attention,
    dilated_attention_reference,
    full_layout,
    pair_multiplicity,
)
from graphattn.patterns.segment_attention import _tiles, segment_attention

# The paper's schedule scaled down 128x: same dilations, w/r not always an integer.
SMALL_LONGNET = tuple((w // 128, r) for w, r in LONGNET_SCHEDULE)  # (16,1) (32,2) (64,4) (128,6) (256,12)


def states(batch, heads, length, dim, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, heads, length, dim, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
        for _ in range(3)
    ]


def outputs_and_grads(fn, tensors, grad_seed=1):
    out = fn(*tensors)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed), dtype=out.dtype)
    return [out.detach(), *torch.autograd.grad(out, tensors, grad)]


def assert_matches_reference(
    pairs, causal, batch=2, heads=3, length=23, dim=8, tile_elements=None, key_padding=None, seed=0
):
    tensors = states(batch, heads, length, dim, seed=seed)
    kwargs = dict(causal=causal, key_padding=key_padding)
    got = outputs_and_grads(
        lambda q, k, v: dilated_attention(q, k, v, pairs, tile_elements=tile_elements, **kwargs), tensors
    )
    want = outputs_and_grads(lambda q, k, v: dilated_attention_reference(q, k, v, pairs, **kwargs), tensors)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"{name} differs for {pairs}, causal={causal}")


def test_layout_by_hand() -> None:
    # L = 10, w = 4, r = 2, three heads: offsets 0, 1, 0. Segments [0,4) [4,8) [8,10).
    layout = full_layout(10, 4, 2, 3)
    assert layout.positions[0].tolist() == [[0, 2], [4, 6], [8, 0]]
    assert layout.valid[0].tolist() == [[True, True], [True, True], [True, False]]  # 10 is past the end
    assert layout.positions[1].tolist() == [[1, 3], [5, 7], [9, 0]]
    assert layout.valid[1].tolist() == [[True, True], [True, True], [True, False]]
    assert layout.positions[2].tolist() == layout.positions[0].tolist()
    # w = 5, r = 3: offset 0 keeps 0, 3; offset 1 keeps 1, 4; offset 2 keeps only 2 (5 is outside).
    layout = full_layout(5, 5, 3, 3)
    assert layout.positions[:, 0].tolist() == [[0, 3], [1, 4], [2, 0]]
    assert layout.valid[:, 0].tolist() == [[True, True], [True, True], [True, False]]


def test_segment_longer_than_sequence_is_clamped() -> None:
    layout = full_layout(6, 32768, 12, 2)
    assert layout.positions.shape == (2, 1, 1) and layout.positions[:, 0, 0].tolist() == [0, 1]


def test_multiplicity_by_hand() -> None:
    # L = 4, pairs (2, 1) and (4, 2). Head 0: blocks {0,1} {2,3} and the dilated set {0,2}, so
    # pairs (0,0) and (2,2) are seen twice. Head 1 (offset 1): dilated set {1,3}.
    counts = pair_multiplicity(4, [(2, 1), (4, 2)], heads=2, causal=False)
    assert counts[0].tolist() == [[2, 1, 1, 0], [1, 1, 0, 0], [1, 0, 2, 1], [0, 0, 1, 1]]
    assert counts[1].tolist() == [[1, 1, 0, 0], [1, 2, 0, 1], [0, 0, 1, 1], [0, 1, 1, 2]]
    causal = pair_multiplicity(4, [(2, 1), (4, 2)], heads=2, causal=True)
    assert causal[0].tolist() == [[2, 0, 0, 0], [1, 1, 0, 0], [1, 0, 2, 0], [0, 0, 1, 1]]


def literal_mixture(q, k, v, pairs, causal):
    """The paper's equations with nothing fused: per pair a dense masked softmax with its own
    denominator s_i = sum exp(score), then O = sum_i (s_i / sum_j s_j) O_i."""
    heads, length = q.shape[1], q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    weighted, denominators = 0.0, 0.0
    for pair in pairs:
        sees = pair_multiplicity(length, [pair], heads, causal)[None].bool()  # one pair: 0 or 1
        exp_scores = torch.exp(scores) * sees
        s_i = exp_scores.sum(-1, keepdim=True)
        o_i = (exp_scores @ v) / torch.where(s_i > 0, s_i, torch.ones_like(s_i))
        weighted = weighted + s_i * o_i
        denominators = denominators + s_i
    return weighted / torch.where(denominators > 0, denominators, torch.ones_like(denominators))


@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_the_papers_weighted_mixture(causal) -> None:
    q, k, v = states(1, 4, 19, 4)
    pairs = [(4, 1), (8, 2), (19, 3)]
    torch.testing.assert_close(
        dilated_attention_reference(q, k, v, pairs, causal=causal), literal_mixture(q, k, v, pairs, causal)
    )


def test_shared_keys_count_once_per_pair() -> None:
    """Two identical pairs weigh each key twice, which a softmax normalises away; (2,1)+(4,2)
    double only some keys, so the mixture differs from a softmax over the plain union."""
    q, k, v = states(1, 2, 8, 4)
    doubled = dilated_attention(q, k, v, [(4, 1), (4, 1)])
    torch.testing.assert_close(doubled, dilated_attention(q, k, v, [(4, 1)]))
    mixed = dilated_attention(q, k, v, [(2, 1), (4, 2)])
    union = pair_multiplicity(8, [(2, 1), (4, 2)], 2, False).clamp(max=1)[None]
    scores = (q @ k.transpose(-1, -2) / 2.0).masked_fill(union == 0, float("-inf"))
    assert not torch.allclose(mixed, torch.softmax(scores, -1) @ v)


SCHEDULES = [
    ((4, 1),),
    ((8, 2),),  # no r = 1: head 0's odd rows get no output at all
    ((4, 1), (8, 2)),
    ((5, 1), (7, 3), (16, 4)),
    ((3, 1), (6, 2), (12, 4), (24, 6), (48, 12)),
]


@pytest.fixture(params=["fused", "tiles"])
def forward_path(request, monkeypatch):
    """On CPU the forward is torch's flash kernel; "tiles" switches it off to test the tiled
    forward that CUDA and low precisions use."""
    if request.param == "tiles":
        monkeypatch.setattr(segment_module, "_CPU_FLASH", None)
    return request.param


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pairs", SCHEDULES)
def test_matches_reference(pairs, causal, forward_path) -> None:
    assert_matches_reference(pairs, causal)  # L = 23 is a multiple of none of the w


@pytest.mark.parametrize("heads", [1, 4, 12])
def test_head_counts_and_small_tiles(heads, forward_path) -> None:
    # 7-element tiles force both tiling paths: many segments per tile and rows of one segment.
    assert_matches_reference(((4, 1), (16, 4), (24, 6)), causal=True, heads=heads, length=30, tile_elements=7)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_and_tiled_forward_agree_on_arbitrary_key_masks(causal, monkeypatch) -> None:
    """Any key mask, including rows that see nothing (segment 0 has no key at all; causal rows
    before segment 1's first valid key): out 0 and lse -inf on both paths, and equal elsewhere."""
    q, k, v = states(1, 3, 6, 6)
    q, k, v = (t[0].detach() for t in (q, k, v))  # [N=3, M=6, d=6]
    key_valid = torch.tensor([[False] * 6, [False, False, True, False, True, True], [True] * 6])
    fused = segment_attention(q, k, v, key_valid, causal=causal, scale=0.5)
    monkeypatch.setattr(segment_module, "_CPU_FLASH", None)
    tiled = segment_attention(q, k, v, key_valid, causal=causal, scale=0.5, tile_elements=5)
    torch.testing.assert_close(fused, tiled)
    out, lse = fused
    assert (out[0] == 0).all() and torch.isinf(lse[0]).all()
    if causal:
        assert (out[1, :2] == 0).all() and torch.isinf(lse[1, :2]).all() and torch.isfinite(lse[1, 2:]).all()


def test_scaled_longnet_schedule() -> None:
    assert_matches_reference(SMALL_LONGNET, causal=False, batch=1, heads=4, length=300, dim=4)
    assert_matches_reference(SMALL_LONGNET, causal=True, batch=1, heads=4, length=300, dim=4, tile_elements=4096)


@settings(max_examples=25, deadline=None)
@given(
    length=st.integers(1, 40),
    heads=st.integers(1, 5),
    causal=st.booleans(),
    pairs=st.lists(
        st.tuples(st.integers(1, 24), st.integers(1, 6)).filter(lambda p: p[1] <= p[0]), min_size=1, max_size=4
    ),
    seed=st.integers(0, 1000),
)
def test_property_matches_reference(length, heads, causal, pairs, seed) -> None:
    assert_matches_reference(pairs, causal, batch=1, heads=heads, length=length, dim=3, seed=seed)


def test_rows_no_pair_selects_are_zero_with_finite_grads() -> None:
    q, k, v = states(1, 2, 8, 4)
    out = dilated_attention(q, k, v, [(8, 2)])
    assert out[0, 0, 1::2].abs().max() == 0 and out[0, 1, 0::2].abs().max() == 0
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_key_padding_equals_the_shorter_sequence() -> None:
    padding = torch.tensor([[True] * 17 + [False] * 6, [True] * 23])
    assert_matches_reference(SCHEDULES[4], causal=False, key_padding=padding)
    q, k, v = states(1, 3, 23, 8)
    pairs = ((4, 1), (8, 2), (64, 6))
    padded = dilated_attention(q, k, v, pairs, key_padding=padding[:1])
    short = dilated_attention(q[:, :, :17], k[:, :, :17], v[:, :, :17], pairs)
    torch.testing.assert_close(padded[:, :, :17], short)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_keeps_dtype(dtype) -> None:
    q, k, v = states(1, 2, 40, 16, dtype=dtype)
    out = dilated_attention(q, k, v, SCHEDULES[3], causal=True)
    assert out.dtype == dtype
    want = dilated_attention_reference(*(t.double() for t in (q, k, v)), SCHEDULES[3], causal=True)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)


def test_tiles_cover_every_row_once_within_budget() -> None:
    for segments, rows, budget in [(5, 3, 20), (3, 10, 25), (2, 4, 16), (4, 6, 1)]:
        seen = torch.zeros(segments, rows, dtype=torch.long)
        for seg, q_rows in _tiles(segments, rows, budget):
            seen[seg, q_rows] += 1
            n_tile = (seg.stop - seg.start) * (q_rows.stop - q_rows.start) * rows
            assert n_tile <= max(budget, rows)
        assert (seen == 1).all()


@pytest.mark.parametrize(
    "pairs, message",
    [([], "at least one"), ([(4, 8)], "larger than segment"), ([(0, 1)], ">= 1"), ([(4,)], "pair of two ints")],
)
def test_bad_schedules_name_the_pair(pairs, message) -> None:
    q, k, v = states(1, 1, 8, 2)
    with pytest.raises(BatchError, match=message):
        dilated_attention(q, k, v, pairs)


def test_mismatched_states_are_batch_errors() -> None:
    q, k, v = states(1, 2, 8, 4)
    with pytest.raises(BatchError, match=r"\$\.k"):
        dilated_attention(q, k[:, :1], v, [(4, 1)])
    with pytest.raises(BatchError, match="key_padding"):
        dilated_attention(q, k, v, [(4, 1)], key_padding=torch.ones(1, 7, dtype=torch.bool))
