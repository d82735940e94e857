"""Keys and values per attention kind and relative tables per query side, on every backend.

etcmodel's unshared projections give a long token one key as seen by long queries (l2l) and
another as seen by global queries (g2l), and likewise for global tokens (l2g, g2g); its relative
tables are one pair per query side. `reference` below computes that straight from the
definition, one softmax per query side over its own keys; every backend is checked against it
on outputs and on gradients of every input, and the shared cases against one plain call.
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import assert_all_close, synthetic_case

import graphattn.kernels.prepared as prepared_module
from graphattn.errors import BatchError
from graphattn.kernels import flex, prepare_attention
from graphattn.kernels.dense import full_labels_and_mask

BACKENDS = ["dense", "blocked", "triton"] + (["flex"] if flex.available() else [])
SCALE = 0.4


def side_scores(q, keys, labels, mask, key_table, bias_table):
    """[B, H, n, N] scores of one query side: (q.k + q.a^K[label]) * scale + b[label], -inf masked."""
    scores = q @ keys.transpose(-1, -2)
    q_dot_a = torch.einsum("bhnd,vhd->bhnv", q, key_table)
    index = labels[:, None].expand(-1, q.shape[1], -1, -1)
    scores = (scores + torch.gather(q_dot_a, -1, index)) * SCALE
    if bias_table is not None:
        scores = scores + bias_table.t()[None, :, None, :].expand(*q.shape[:3], -1).gather(-1, index)
    return scores.masked_fill(~mask[:, None], float("-inf"))


def softmax_rows(scores, values):
    """Softmax over keys with zeros for rows that see nothing, then the weighted values."""
    empty = torch.isinf(scores).all(-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    return probs @ values


def reference(side, s, long_tables, global_tables):
    """The two query sides computed separately, each over its own keys/values and tables."""
    num_global, num_keys = s["global_q"].shape[2], s["g2g_k"].shape[2]
    labels, mask = full_labels_and_mask(side, num_global, s["long_q"].shape[2])
    glob, long = slice(0, num_global), slice(num_global, None)
    global_keys = torch.cat([s["g2g_k"], s["g2l_k"]], 2)
    global_values = torch.cat([s["g2g_v"], s["g2l_v"]], 2)
    long_keys = torch.cat([s["l2g_k"], s["l2l_k"]], 2)
    long_values = torch.cat([s["l2g_v"], s["l2l_v"]], 2)
    global_out = softmax_rows(
        side_scores(s["global_q"], global_keys, labels[:, glob], mask[:, glob], *global_tables), global_values
    )
    long_out = softmax_rows(
        side_scores(s["long_q"], long_keys, labels[:, long], mask[:, long], *long_tables), long_values
    )
    assert num_keys == num_global
    return global_out, long_out


ROLES = ("global_q", "g2g_k", "g2g_v", "long_q", "l2l_k", "l2l_v", "l2g_k", "l2g_v", "g2l_k", "g2l_v")


def per_kind_states(case, *, distinct_kv: bool, seed: int = 5):
    """The case's six states plus l2g/g2l keys and values: new tensors, or the same objects."""
    gq, gk, gv, lq, lk, lv = case.states
    states = dict(global_q=gq, g2g_k=gk, g2g_v=gv, long_q=lq, l2l_k=lk, l2l_v=lv)
    gen = torch.Generator().manual_seed(seed)

    def fresh(like):
        return torch.randn(like.shape, generator=gen, dtype=torch.float64).to(like.dtype).requires_grad_()

    for kind, same in (("l2g", "g2g"), ("g2l", "l2l")):
        for part in "kv":
            states[f"{kind}_{part}"] = fresh(states[f"{same}_{part}"]) if distinct_kv else states[f"{same}_{part}"]
    return states


def global_tables_of(case, *, own: bool, seed: int = 7):
    if not own:
        return case.key_table, case.bias_table
    gen = torch.Generator().manual_seed(seed)
    make = lambda t: torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype).requires_grad_()  # noqa: E731
    return make(case.key_table), make(case.bias_table)


def attend(backend, case, states, global_tables):
    options = {"compiled": False} if backend == "flex" else {}
    attention = prepare_attention(
        case.side, num_heads=2, head_dim=16, vocab_size=case.vocab, backend=backend, **options
    )
    extra = {name: states[name] for name in ("l2g_k", "l2g_v", "g2l_k", "g2l_v")}
    return attention.attend(
        states["global_q"],
        states["g2g_k"],
        states["g2g_v"],
        states["long_q"],
        states["l2l_k"],
        states["l2l_v"],
        case.key_table,
        case.bias_table,
        SCALE,
        global_tables=global_tables,
        **extra,
    )


def outputs_and_grads(fn, inputs):
    """Outputs, then gradients of a fixed random projection of them w.r.t. every distinct input."""
    outs = list(fn())
    gen = torch.Generator().manual_seed(3)
    weights = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype) for t in outs]
    if not torch.is_grad_enabled():
        return outs
    loss = sum((t.double() * w.double()).sum() for t, w in zip(outs, weights))
    return outs + list(torch.autograd.grad(loss, inputs, allow_unused=True))


@pytest.fixture(scope="module")
def case32():
    return synthetic_case(dtype=torch.float32, dim=16, num_long=21, num_global=5, radius=3, num_docs=2, mention_links=3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "distinct_kv, own_tables", [(True, True), (True, False), (False, True)], ids=["kv+tables", "kv", "tables"]
)
def test_per_kind_states_and_per_side_tables_match_the_reference(backend, distinct_kv, own_tables, case32) -> None:
    case = case32
    states = per_kind_states(case, distinct_kv=distinct_kv)
    global_tables = global_tables_of(case, own=own_tables)
    inputs = list(dict.fromkeys([*states.values(), case.key_table, case.bias_table, *global_tables]))
    grad = backend != "flex"  # FlexAttention has no backward on CPU
    with torch.set_grad_enabled(grad):
        actual = outputs_and_grads(lambda: attend(backend, case, states, global_tables), inputs)
        expected = outputs_and_grads(
            lambda: reference(
                case.side,
                {k: v.double() for k, v in states.items()},
                (case.key_table.double(), case.bias_table.double()),
                tuple(t.double() for t in global_tables),
            ),
            inputs,
        )
    assert_all_close(actual, expected, 2e-5)


def test_shared_states_run_the_backend_once_and_unshared_once_per_side(monkeypatch, case32) -> None:
    calls = []
    real = prepared_module._run

    def spy(module, plan, states, tables, scale, queries):
        calls.append((queries, tables[2] is not None, tuple(map(id, states))))
        return real(module, plan, states, tables, scale, queries)

    monkeypatch.setattr(prepared_module, "_run", spy)
    shared = per_kind_states(case32, distinct_kv=False)
    with torch.no_grad():
        attend("blocked", case32, shared, (case32.key_table, case32.bias_table))
        assert calls == [("both", False, tuple(map(id, case32.states)))]  # the same tensors, no copy
        calls.clear()
        attend("blocked", case32, per_kind_states(case32, distinct_kv=True), global_tables_of(case32, own=True))
    assert [c[:2] for c in calls] == [("global", True), ("long", True)]


def test_blocked_computes_only_the_query_side_asked_for(case32) -> None:
    """The side asked for as both sides give it (a one-chunk pass runs on the calling thread,
    where MKL may use several threads: the same values, not always the same bits), the other
    side zeros."""
    from graphattn.kernels import blocked

    attention = prepare_attention(case32.side, num_heads=2, head_dim=16, vocab_size=case32.vocab, backend="blocked")
    args = (attention.plan, tuple(case32.states), case32.key_table, case32.bias_table, SCALE)
    with torch.no_grad():
        both = blocked.run(*args)
        only_global = blocked.run(*args, queries="global")
        only_long = blocked.run(*args, queries="long")
    assert_all_close([only_global[0], only_long[1]], [both[0], both[1]], 1e-6)
    assert not only_global[1].any() and not only_long[0].any()


def test_per_kind_states_and_tables_are_checked(case32) -> None:
    states = per_kind_states(case32, distinct_kv=True)
    states["g2l_k"] = states["g2l_k"][:, :, :-1]
    with pytest.raises(BatchError) as err:
        attend("blocked", case32, states, None)
    assert "g2l_k" in str(err.value)
    states = per_kind_states(case32, distinct_kv=False)
    with pytest.raises(BatchError) as err:
        attend("blocked", case32, states, (case32.key_table[:-1], None))
    assert "global_rel_key_table" in str(err.value)
