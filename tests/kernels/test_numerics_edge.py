"""Softmax at the edge of fp32 (#15 item 10): rows whose scores all lie far below -1e30 still get
their softmax, as in the dense oracle, in every backend; fully masked rows stay zeros.

At that magnitude neighbouring floats are ~1e24 apart, so a true softmax is one-hot or, with
exactly tied scores, uniform: here every key of a row scores the same, so each row's output is
the plain mean of the values it may attend to (and all-masked rows give 0).
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import RESULT_NAMES, assert_all_close, run, synthetic_case

from graphattn.kernels import dense, flex, global_local_attention
from graphattn.kernels.triton.blocks import BlockSizes

BACKENDS = ["blocked", "triton"] + (["flex"] if flex.available() else [])


def mean_of_allowed(case) -> tuple[torch.Tensor, torch.Tensor]:
    """What tied scores give: per query, the mean of the values it may attend to (0 if none)."""
    labels, mask = dense.full_labels_and_mask(case.side, case.states[0].shape[2], case.states[3].shape[2])
    values = torch.cat([case.states[2], case.states[5]], dim=2).detach()
    weights = mask[:, None].to(values.dtype)
    out = weights @ values / weights.sum(-1, keepdim=True).clamp(min=1)
    num_global = case.states[0].shape[2]
    return out[:, :, :num_global], out[:, :, num_global:]


def edge_case(kind: str):
    case = synthetic_case(
        dtype=torch.float32, dim=16, num_long=37, num_global=6, radius=3, num_docs=2, empty_long_rows=2, bias=True
    )
    with torch.no_grad():
        case.key_table.zero_()
        if kind == "huge_states":  # q.k = -1e34 * 16 * scale for every pair: far below -1e30
            direction = torch.ones(16)
            for i, t in enumerate(case.states):
                if i in (0, 3):
                    t.copy_(1e17 * direction.expand_as(t))
                elif i in (1, 4):
                    t.copy_(-1e17 * direction.expand_as(t))
            case.bias_table.zero_()
        else:  # a bias of finfo.min on every label; q and k tiny so that q.k vanishes beside it
            for i in (0, 1, 3, 4):
                case.states[i].zero_()
            case.bias_table.fill_(torch.finfo(torch.float32).min)
    return case


@pytest.mark.parametrize("kind", ["huge_states", "finfo_min_bias"])
def test_dense_gives_the_softmax_below_minus_1e30(kind) -> None:
    case = edge_case(kind)
    with torch.no_grad():
        ours = dense.attention(*case.states, case.side, case.key_table, case.bias_table, 0.25)
    assert_all_close(list(ours), list(mean_of_allowed(case)), 1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["huge_states", "finfo_min_bias"])
def test_every_backend_matches_dense_below_minus_1e30(backend, kind) -> None:
    case = edge_case(kind)
    options = {"block_sizes": BlockSizes(16, 16)} if backend == "triton" else {}
    with torch.no_grad():
        if backend == "triton":
            from graphattn.kernels.triton.attention import attention

            ours = attention(*case.states, case.side, case.key_table, case.bias_table, 0.25, **options)
        elif backend == "flex":
            ours = flex.attention(*case.states, case.side, case.key_table, case.bias_table, 0.25, compiled=False)
        else:
            ours = global_local_attention(
                *case.states, case.side, case.key_table, case.bias_table, backend=backend, scale=0.25
            )
    expected = mean_of_allowed(case)
    assert_all_close(list(ours), list(expected), 1e-6)


# With huge states the exact gradients of q and k are 0 * 1e17 (tied scores: ds sums to zero over
# every row), i.e. any backend's is rounding noise of size ~1e10: only the others are compared.
COMPARED = {"huge_states": ("d_global_v", "d_long_v", "d_bias_table"), "finfo_min_bias": tuple(RESULT_NAMES[2:])}


@pytest.mark.parametrize("backend", ["blocked", "triton"])
@pytest.mark.parametrize("kind", ["huge_states", "finfo_min_bias"])
def test_gradients_match_dense_below_minus_1e30(backend, kind) -> None:
    """The backward recomputes p = exp(s - max - log sum), not exp(s - lse): next to a max of
    -3e38 the log-sum-exp cannot hold log(sum), and every p would come out 1."""
    case = edge_case(kind)
    if backend == "triton":
        from graphattn.kernels.triton.attention import attention

        def fn(*args):
            return attention(*args, block_sizes=BlockSizes(16, 16))
    else:

        def fn(*args):
            return global_local_attention(*args[:9], backend=backend, scale=args[9])

    ours = dict(zip(RESULT_NAMES, run(fn, case, scale=0.25)))
    expected = dict(zip(RESULT_NAMES, run(dense.attention, case, scale=0.25)))
    for name in COMPARED[kind]:
        scale = max(expected[name].abs().max().item(), 1.0)
        torch.testing.assert_close(
            ours[name], expected[name], rtol=1e-5, atol=1e-5 * scale, msg=lambda m: f"{name}: {m}"
        )
