"""The dense oracle against a hand-computed example and a loop-per-pair reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import assert_all_close, compiler_case, run, synthetic_case

from graphattn.contract import SideInputs
from graphattn.kernels import dense

T = lambda rows, dtype=torch.int32: torch.tensor(rows, dtype=dtype)  # noqa: E731


def tiny_side() -> SideInputs:
    """G = 1, L = 2, r = 1. Long 0 cannot see key -1, long 1 cannot see key 2, global 0 does
    not see long 1, long 1 does not see global 0."""
    return SideInputs(
        l2l_att_mask=T([[[0, 1, 1], [1, 1, 0]]]),
        g2g_att_mask=T([[[1]]]),
        l2g_att_mask=T([[[1], [0]]]),
        g2l_att_mask=T([[[1, 0]]]),
        l2l_relative_att_ids=T([[[0, 0, 1], [1, 0, 0]]]),
        g2g_relative_att_ids=T([[[0]]]),
        l2g_relative_att_ids=T([[[1], [0]]]),
        g2l_relative_att_ids=T([[[1, 1]]]),
    )


def softmax_out(scores: list[float], values: list[float]) -> float:
    weights = [math.exp(s) for s in scores]
    return sum(w * v for w, v in zip(weights, values)) / sum(weights)


def test_hand_computed_example() -> None:
    # d = 1, one head, scale 1; label 1 adds q * 1 to the score and bias 0.5.
    f = lambda *x: torch.tensor(x, dtype=torch.float64).view(1, 1, -1, 1)  # noqa: E731
    gq, gk, gv = f(1.0), f(0.0), f(10.0)
    lq, lk, lv = f(1.0, 2.0), f(1.0, -1.0), f(1.0, 2.0)
    key_table = torch.tensor([[[0.0]], [[1.0]]], dtype=torch.float64)
    bias_table = torch.tensor([[0.0], [0.5]], dtype=torch.float64)
    g_out, l_out = dense.attention(gq, gk, gv, lq, lk, lv, tiny_side(), key_table, bias_table, 1.0)
    # global 0: g0 (label 0): 1*0 = 0; long 0 (label 1): 1*1 + 1*1 + 0.5 = 2.5
    assert g_out.item() == pytest.approx(softmax_out([0.0, 2.5], [10.0, 1.0]))
    # long 0 (q=1): g0 label 1: 0 + 1 + 0.5; itself label 0: 1; long 1 label 1: -1 + 1 + 0.5
    assert l_out[0, 0, 0, 0].item() == pytest.approx(softmax_out([1.5, 1.0, 0.5], [10.0, 1.0, 2.0]))
    # long 1 (q=2): long 0 label 1: 2 + 2 + 0.5; itself label 0: -2
    assert l_out[0, 0, 1, 0].item() == pytest.approx(softmax_out([4.5, -2.0], [1.0, 2.0]))


def test_full_labels_and_mask_layout() -> None:
    labels, mask = dense.full_labels_and_mask(tiny_side(), 1, 2)
    assert mask[0].int().tolist() == [[1, 1, 0], [1, 1, 1], [0, 1, 1]]
    assert labels[0].tolist() == [[0, 1, 1], [1, 0, 1], [0, 1, 0]]


def loop_reference(gq, gk, gv, lq, lk, lv, side, key_table, bias_table, scale):
    """Straight from the definition: one Python loop per (batch, head, query, key)."""
    num_global, _num_long, radius = gq.shape[2], lq.shape[2], side.local_radius
    q, k, v = (torch.cat([a, b], 2) for a, b in ((gq, lq), (gk, lk), (gv, lv)))
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                scores, values = [], []
                for j in range(q.shape[2]):
                    gi, gj = i < num_global, j < num_global
                    li, lj = i - num_global, j - num_global
                    if gi and gj:
                        allowed, label = side.g2g_att_mask[b, i, j], side.g2g_relative_att_ids[b, i, j]
                    elif gi:
                        allowed, label = side.g2l_att_mask[b, i, lj], side.g2l_relative_att_ids[b, i, lj]
                    elif gj:
                        allowed, label = side.l2g_att_mask[b, li, j], side.l2g_relative_att_ids[b, li, j]
                    elif abs(lj - li) <= radius:
                        column = lj - li + radius
                        allowed, label = side.l2l_att_mask[b, li, column], side.l2l_relative_att_ids[b, li, column]
                    else:
                        allowed, label = 0, 0
                    if allowed:
                        score = (q[b, h, i] @ (k[b, h, j] + key_table[label, h])) * scale
                        scores.append(score + (bias_table[label, h] if bias_table is not None else 0.0))
                        values.append(v[b, h, j])
                if scores:
                    out[b, h, i] = torch.softmax(torch.stack(scores), 0) @ torch.stack(values)
    return out[:, :, :num_global], out[:, :, num_global:]


@settings(max_examples=12, deadline=None)
@given(
    num_long=st.integers(1, 12),
    num_global=st.integers(0, 4),
    radius=st.integers(1, 5),
    hard=st.booleans(),
    docs=st.integers(1, 2),
    empty=st.integers(0, 2),
    seed=st.integers(0, 1000),
)
def test_dense_equals_loop_reference(num_long, num_global, radius, hard, docs, empty, seed) -> None:
    case = synthetic_case(
        batch=2,
        heads=2,
        dim=3,
        num_long=num_long,
        num_global=num_global,
        radius=radius,
        seed=seed,
        num_docs=docs,
        hard_g2l=hard,
        hard_l2g=hard,
        mention_links=2,
        empty_long_rows=min(empty, num_long),
        empty_global_rows=min(empty, num_global),
    )
    expected = run(loop_reference, case, grads=False)
    actual = run(dense.attention, case, grads=False)
    assert_all_close(actual, expected, 1e-12)


def test_compiler_batch_matches_loop_reference() -> None:
    case = compiler_case(num_long=24, doc_lengths=((7, 9), (12,)), sentences_per_doc=2, hard_g2l=True)
    assert_all_close(run(dense.attention, case, grads=False), run(loop_reference, case, grads=False), 1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_empty_rows_give_zeros_and_finite_gradients(dtype) -> None:
    case = synthetic_case(dtype=dtype, empty_long_rows=3, empty_global_rows=2)
    results = run(dense.attention, case)
    global_out, long_out = results[:2]
    assert global_out.dtype == dtype and long_out.dtype == dtype
    empty_long = (case.side.l2l_att_mask.sum(-1) + case.side.l2g_att_mask.sum(-1)) == 0  # [B, L]
    empty_global = (case.side.g2g_att_mask.sum(-1) + case.side.g2l_att_mask.sum(-1)) == 0
    assert empty_long.any() and empty_global.any()
    assert (long_out.transpose(1, 2)[empty_long] == 0).all()
    assert (global_out.transpose(1, 2)[empty_global] == 0).all()
    assert all(torch.isfinite(g).all() for g in results[2:])
