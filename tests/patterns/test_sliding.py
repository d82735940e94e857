"""Dilated sliding windows folded onto the global-local kernels (graphattn.patterns.sliding).

The reference is written straight from the definition: query i attends keys j with
|i - j| <= d*r and (i - j) divisible by d (where the key is allowed), plus every allowed global
key, in one softmax, over a dense [L, L] mask. Every backend must match it on outputs and
gradients; Triton runs under TRITON_INTERPRET=1 with d_head 16 and L <= 48.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn.errors import BatchError
from graphattn.patterns.sliding import (
    dilated_window_attention,
    fold_states,
    fold_tokens,
    global_rows_attention,
    group_heads,
    unfold_states,
    window_side_inputs,
    windowed_attention,
)


def masked_softmax(scores, mask):
    """Softmax over allowed keys; a row with none gives zeros (and zero gradients, not NaN)."""
    probs = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1)
    return probs * mask.any(dim=-1, keepdim=True)


def reference(q, k, v, key_ok, radius, dilations, global_k=None, global_v=None, global_ok=None):
    """Dense masked attention from the definition; empty rows give zeros."""
    length = q.shape[2]
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    outs = []
    for h, d in enumerate(dilations):
        window = ((i - j).abs() <= d * radius) & ((i - j) % d == 0)
        mask = window[None] & key_ok[:, None, :]
        scores = q[:, h] @ k[:, h].transpose(-1, -2) / math.sqrt(q.shape[-1])
        values = v[:, h]
        if global_k is not None:
            g_scores = q[:, h] @ global_k[:, h].transpose(-1, -2) / math.sqrt(q.shape[-1])
            scores = torch.cat([g_scores, scores], dim=-1)
            mask = torch.cat([global_ok[:, None, :].expand(-1, length, -1), mask], dim=-1)
            values = torch.cat([global_v[:, h], values], dim=1)
        outs.append(masked_softmax(scores, mask) @ values)
    return torch.stack(outs, dim=1)


def make_case(batch, heads, length, dim, num_global, *, dtype=torch.float64, seed=0, drop=0.2):
    gen = torch.Generator().manual_seed(seed)
    leaf = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()  # noqa: E731
    q, k, v = (leaf(batch, heads, length, dim) for _ in range(3))
    key_ok = torch.rand(batch, length, generator=gen) >= drop
    gk, gv = (leaf(batch, heads, num_global, dim) for _ in range(2))
    global_ok = torch.rand(batch, num_global, generator=gen) >= 0.3
    return [q, k, v, gk, gv], key_ok, global_ok


def assert_matches(ours, expected, leaves, rel=1e-5):
    """Outputs and gradients (under one random upstream) within `rel` of the largest value (at
    least 1: inputs are O(1), and a gradient that is exactly 0 in theory is ~1e-17 in practice)."""

    def close(a, e, what):
        if e.numel() == 0:
            return
        scale = max(e.abs().max().item(), 1.0)
        torch.testing.assert_close(a, e, rtol=rel, atol=rel * scale, msg=lambda m: f"{what}: {m}")

    close(ours, expected, "output")
    upstream = torch.randn(expected.shape, generator=torch.Generator().manual_seed(3), dtype=expected.dtype)
    got = torch.autograd.grad(ours, leaves, upstream, allow_unused=True)
    want = torch.autograd.grad(expected, leaves, upstream, allow_unused=True)
    for n, (g, w) in enumerate(zip(got, want)):
        close(g if g is not None else torch.zeros_like(w), w, f"grad {n}")


# -- folding, by hand ----------------------------------------------------------------------------
def test_fold_tokens_by_hand():
    x = torch.arange(7)[None]  # positions 0..6, dilation 3
    assert fold_tokens(x, 3, fill=-1).tolist() == [[0, 3, 6], [1, 4, -1], [2, 5, -1]]
    assert fold_tokens(x, 1) is x


def test_fold_states_by_hand_and_back():
    x = torch.arange(2 * 5, dtype=torch.float32).view(2, 1, 5, 1)  # batch 2, positions 0..4 and 5..9
    folded = fold_states(x, 2)
    assert folded.squeeze(-1).squeeze(1).tolist() == [[0, 2, 4], [1, 3, 0], [5, 7, 9], [6, 8, 0]]
    assert torch.equal(unfold_states(folded, 2, 5), x)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 3), heads=st.integers(1, 3), length=st.integers(1, 30), dilation=st.integers(1, 7))
def test_fold_round_trip(batch, heads, length, dilation):
    x = torch.randn(batch, heads, length, 2)
    folded = fold_states(x, dilation)
    assert folded.shape == (batch * dilation, heads, -(-length // dilation), 2)
    assert torch.equal(unfold_states(folded, dilation, length), x)
    positions = torch.arange(length).expand(batch, length)
    # fold_tokens puts position p where fold_states puts it
    where = fold_tokens(positions, dilation, fill=-1)
    states = fold_states(positions[:, None, :, None].float(), dilation)[:, 0, :, 0]
    assert torch.equal(torch.where(where >= 0, where.float(), 0.0), states)


def test_group_heads():
    assert group_heads([1, 2, 1, 4, 2]) == [(1, [0, 2]), (2, [1, 4]), (4, [3])]


def test_bad_arguments_name_the_problem():
    x = torch.zeros(1, 2, 5, 4)
    ok = torch.ones(1, 5, dtype=torch.bool)
    with pytest.raises(BatchError, match="3 dilations given for 2 heads"):
        windowed_attention(x, x, x, ok, 1, [1, 2, 3])
    with pytest.raises(BatchError, match="dilation must be >= 1"):
        dilated_window_attention(x, x, x, ok, 1, 0)


def test_window_side_inputs_by_hand():
    key_ok = torch.tensor([[True, True, False, True, True]])
    side = window_side_inputs(key_ok, 1, torch.tensor([[True, False]]))
    # column c of row i is key i - 1 + c; keys outside the sequence and disallowed keys are 0
    assert side.l2l_att_mask[0].int().tolist() == [[0, 1, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 0]]
    assert side.l2g_att_mask[0].int().tolist() == [[1, 0]] * 5
    assert not side.g2g_att_mask.any() and not side.g2l_att_mask.any()
    for name, ids in side.as_dict().items():
        if name.endswith("ids"):
            assert not ids.any(), name


def test_side_inputs_stay_linear_in_memory():
    """The band is a view of the padded key mask; the rectangular masks and ids are expanded
    views: nothing is stored per (query, key) pair."""
    length, radius, num_global = 5000, 64, 40
    side = window_side_inputs(
        torch.ones(1, length, dtype=torch.bool), radius, torch.ones(1, num_global, dtype=torch.bool)
    )
    stored = sum(t.untyped_storage().nbytes() for t in side.as_dict().values())
    assert stored < 2 * (length + 2 * radius) + 8 * num_global + 64
    assert side.l2l_att_mask.shape == (1, length, 2 * radius + 1)


# -- against the dense reference -----------------------------------------------------------------
@pytest.mark.parametrize("backend", ["dense", "blocked"])
@pytest.mark.parametrize(
    "dilations, radius, length",
    [([1], 3, 20), ([2, 2], 2, 23), ([1, 3], 2, 23), ([1, 2, 4], 3, 29), ([5, 1], 1, 17)],
)
def test_dilated_windows_match_reference(backend, dilations, radius, length):
    leaves, key_ok, global_ok = make_case(2, len(dilations), length, 8, num_global=3)
    q, k, v, gk, gv = leaves
    ours = windowed_attention(q, k, v, key_ok, radius, dilations, gk, gv, global_ok, backend=backend)
    assert_matches(ours, reference(q, k, v, key_ok, radius, dilations, gk, gv, global_ok), leaves, rel=1e-10)


@pytest.mark.parametrize("backend", ["dense", "blocked"])
def test_without_globals(backend):
    leaves, key_ok, _ = make_case(1, 2, 19, 4, num_global=0)
    q, k, v = leaves[:3]
    ours = windowed_attention(q, k, v, key_ok, 2, [3, 1], backend=backend)
    assert_matches(ours, reference(q, k, v, key_ok, 2, [3, 1]), [q, k, v], rel=1e-10)


def test_fully_masked_queries_give_zeros():
    leaves, _, _ = make_case(1, 1, 9, 4, num_global=1)
    q, k, v, gk, gv = leaves
    key_ok = torch.zeros(1, 9, dtype=torch.bool)
    out = dilated_window_attention(
        q, k, v, key_ok, 2, 2, gk, gv, torch.zeros(1, 1, dtype=torch.bool), backend="blocked"
    )
    assert torch.equal(out, torch.zeros_like(out))


@settings(max_examples=15, deadline=None)
@given(
    batch=st.integers(1, 2),
    length=st.integers(1, 33),
    radius=st.integers(1, 5),
    dilations=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    num_global=st.integers(0, 3),
    seed=st.integers(0, 1000),
)
def test_blocked_property(batch, length, radius, dilations, num_global, seed):
    leaves, key_ok, global_ok = make_case(batch, len(dilations), length, 4, num_global, seed=seed)
    q, k, v, gk, gv = leaves
    ours = windowed_attention(q, k, v, key_ok, radius, dilations, gk, gv, global_ok, backend="blocked")
    assert_matches(ours, reference(q, k, v, key_ok, radius, dilations, gk, gv, global_ok), leaves, rel=1e-10)


def test_global_rows_match_reference():
    leaves, key_ok, _ = make_case(2, 2, 21, 8, num_global=3)
    q, k, v, gq, _ = leaves
    ours = global_rows_attention(gq, k, v, key_ok, backend="blocked")
    scores = gq @ k.transpose(-1, -2) / math.sqrt(8)
    expected = masked_softmax(scores, key_ok[:, None, None, :].expand_as(scores)) @ v
    assert_matches(ours, expected, [gq, k, v], rel=1e-10)


# -- Triton, under the interpreter -------------------------------------------------------------
@pytest.mark.parametrize("dilations, length", [([1, 3], 40), ([2, 2], 45)])
def test_triton_matches_dense(dilations, length):
    pytest.importorskip("triton")
    leaves, key_ok, global_ok = make_case(1, 2, length, 16, num_global=2, dtype=torch.float32, seed=5)
    q, k, v, gk, gv = leaves
    ours = windowed_attention(q, k, v, key_ok, 3, dilations, gk, gv, global_ok, backend="triton")
    oracle = windowed_attention(q, k, v, key_ok, 3, dilations, gk, gv, global_ok, backend="dense")
    assert_matches(ours, oracle, leaves)


def test_triton_global_rows_match_dense():
    pytest.importorskip("triton")
    leaves, key_ok, _ = make_case(1, 2, 37, 16, num_global=3, dtype=torch.float32, seed=6)
    q, k, v, gq, _ = leaves
    ours = global_rows_attention(gq, k, v, key_ok, backend="triton")
    assert_matches(ours, global_rows_attention(gq, k, v, key_ok, backend="dense"), [gq, k, v])
