"""Global key slots past the global queries are keys only (how compressive memories enter):
every backend gives what the dense oracle gives on the full square side inputs for the rows
that exist, and computes no query rows for the extra slots."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import assert_all_close, synthetic_case

from graphattn.contract import SideInputs
from graphattn.kernels import dense, flex, prepare_attention
from graphattn.kernels.triton.blocks import BlockSizes

QUERIES = 4  # of the case's 7 global slots; the other 3 are keys only


def key_only(side: SideInputs, queries: int) -> SideInputs:
    """Drop the global query rows past `queries` (g2g and g2l rows); keys stay."""
    values = side.as_dict()
    for name in ("g2g_att_mask", "g2g_relative_att_ids", "g2l_att_mask", "g2l_relative_att_ids"):
        values[name] = values[name][:, :queries].contiguous()
    return SideInputs(**values)


def outputs_and_grads(fn, states, params, seed=1):
    outs = fn(states)
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype) for o in outs]
    loss = sum((o * w).sum() for o, w in zip(outs, weights))
    return list(outs) + list(torch.autograd.grad(loss, params, allow_unused=True))


BACKENDS = ["dense", "blocked", "triton"] + (["flex"] if flex.available() else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_key_only_global_slots_match_the_square_oracle(backend) -> None:
    dtype = torch.float32
    case = synthetic_case(
        dtype=dtype, dim=16, num_long=23, num_global=7, radius=3, num_docs=2, mention_links=4, empty_global_rows=1
    )
    side = key_only(case.side, QUERIES)
    options = (
        {"block_sizes": BlockSizes(16, 16)} if backend == "triton" else {"compiled": False} if backend == "flex" else {}
    )
    attention = prepare_attention(side, num_heads=2, head_dim=16, vocab_size=case.vocab, backend=backend, **options)
    assert (attention.shape.num_global, attention.shape.num_global_keys) == (QUERIES, 7)
    grads = backend != "flex"  # FlexAttention has no CPU backward
    gq, gk, gv, lq, lk, lv = case.states
    params = [gk, gv, lq, lk, lv, case.key_table, case.bias_table]

    def ours(states):
        return attention.attend(gq[:, :, :QUERIES], *states[1:], case.key_table, case.bias_table, 0.4)

    def oracle(states):
        global_out, long_out = dense.attention(*states, case.side, case.key_table, case.bias_table, 0.4)
        return global_out[:, :, :QUERIES], long_out

    with torch.set_grad_enabled(grads):
        if grads:
            expected, actual = (
                outputs_and_grads(oracle, case.states, params),
                outputs_and_grads(ours, case.states, params),
            )
        else:
            expected, actual = list(oracle(case.states)), list(ours(case.states))
    assert actual[0].shape == (2, 2, QUERIES, 16)
    assert_all_close(actual, expected, 1e-5)


def test_more_global_queries_than_keys_is_refused() -> None:
    case = synthetic_case(dtype=torch.float32, dim=16, num_global=7)
    attention = prepare_attention(
        key_only(case.side, QUERIES), num_heads=2, head_dim=16, vocab_size=case.vocab, backend="blocked"
    )
    with pytest.raises(Exception, match="global"):
        attention.attend(*case.states, case.key_table, case.bias_table)
