"""etcmodel's sharing switches in the encoder: which module serves each role, parameter names,
old configurations, per-side blocks after attention, the embedding projection, and every
backend against dense in each mode."""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from pathlib import Path

import pytest
import torch

from graphattn.errors import GraphattnError
from graphattn.kernels import PreparedAttention, flex, prepare_attention
from graphattn.nn import EtcConfig, EtcEncoder, GlobalLocalAttention

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from kernel_cases import graph_batch  # noqa: E402
from kernel_cases import graph_config as config  # noqa: E402

UNSHARED_REST = dict(  # etcmodel's layout of everything after the projections
    share_att_output_projection=False,
    share_feed_forward_params=False,
    share_relative_tables=False,
    share_attention_norm=False,
    relative_bias=True,
)
MODES = {
    "shared": dict(),
    "per_side": dict(share_qkv_projections=False, share_kv_projections=True),
    "per_kind": dict(share_qkv_projections=False),
    "per_token_kind": dict(share_qkv_projections=False, global_token_projections=True),
}
# The module each role must use, per mode: (query or key/value module name, tokens it projects).
EXPECTED_ROLES = {
    "shared": dict(long_q="query", global_q="query", l2l="", l2g="", g2g="", g2l=""),
    "per_side": dict(long_q="query", global_q="global_query", l2l="", l2g="", g2g="global_", g2l="global_"),
    "per_kind": dict(long_q="query", global_q="global_query", l2l="", l2g="l2g_", g2g="global_", g2l="g2l_"),
    "per_token_kind": dict(long_q="query", global_q="global_query", l2l="", l2g="global_", g2g="global_", g2l=""),
}


@pytest.fixture(scope="module")
def batch():
    return graph_batch()


def heads(x: torch.Tensor) -> torch.Tensor:
    return x.view(*x.shape[:2], 2, 16).transpose(1, 2)


@pytest.mark.parametrize("mode", list(MODES))
def test_each_role_goes_through_the_module_etcmodel_names(mode, batch) -> None:
    """Module output == the kernel called with states projected by hand from the expected modules."""
    torch.manual_seed(0)
    cfg = config(**MODES[mode], **UNSHARED_REST, attention_backend="dense")
    module = GlobalLocalAttention(cfg).double()
    side = batch.side.to_torch()
    g = torch.randn(2, side.global_length, 32, dtype=torch.float64)
    x = torch.randn(2, side.long_length, 32, dtype=torch.float64)
    global_out, long_out = module(g, x, side)

    roles = EXPECTED_ROLES[mode]
    proj = lambda name, tokens: heads(getattr(module, name)(tokens))  # noqa: E731
    tokens = {"l2l": x, "l2g": g, "g2g": g, "g2l": x}
    kv = {kind: (proj(roles[kind] + "key", t), proj(roles[kind] + "value", t)) for kind, t in tokens.items()}
    attention = prepare_attention(side, num_heads=2, head_dim=16, vocab_size=cfg.relative_vocab_size, backend="dense")
    expected_global, expected_long = attention.attend(
        proj(roles["global_q"], g),
        *kv["g2g"],
        proj(roles["long_q"], x),
        *kv["l2l"],
        module.relative_key_table,
        module.relative_bias_table,
        l2g_k=kv["l2g"][0],
        l2g_v=kv["l2g"][1],
        g2l_k=kv["g2l"][0],
        g2l_v=kv["g2l"][1],
        global_tables=(module.global_relative_key_table, module.global_relative_bias_table),
    )
    merge = lambda t: t.transpose(1, 2).reshape(2, -1, 32)  # noqa: E731
    torch.testing.assert_close(global_out, module.global_output(merge(expected_global)))
    torch.testing.assert_close(long_out, module.output(merge(expected_long)))


def test_parameter_names_per_mode() -> None:
    """The names a checkpoint loader maps onto (docs: the 26a mapping table)."""
    names = {
        mode: {n.rsplit(".", 1)[0] for n, _ in GlobalLocalAttention(config(**switches)).named_parameters()}
        for mode, switches in MODES.items()
    }
    common = {"query", "key", "value", "output", "relative_key_table"}
    assert names["shared"] == common
    assert names["per_side"] == common | {"global_query", "global_key", "global_value"}
    assert names["per_token_kind"] == names["per_side"]  # graphattn's earlier layout keeps its names
    assert names["per_kind"] == names["per_side"] | {"l2g_key", "l2g_value", "g2l_key", "g2l_value"}
    unshared = {n for n, _ in GlobalLocalAttention(config(**UNSHARED_REST)).named_parameters()}
    assert {"global_output.weight", "global_relative_key_table", "global_relative_bias_table"} <= unshared
    layer = {n for n, _ in EtcEncoder(config(**UNSHARED_REST, num_hidden_layers=1)).layer[0].named_parameters()}
    assert {"global_attention_norm.weight", "global_intermediate.bias", "global_output.weight"} <= layer
    assert {"global_output_norm.bias", "attention.global_output.bias"} <= layer


def test_shared_modes_pass_no_per_kind_tensors(monkeypatch, batch) -> None:
    seen = []
    real = PreparedAttention.attend

    def spy(self, *args, **kwargs):
        seen.append(sorted(kwargs))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PreparedAttention, "attend", spy)
    for mode, expected in (
        ("shared", []),
        ("per_token_kind", []),
        ("per_side", ["g2l_k", "g2l_v", "l2g_k", "l2g_v"]),
        ("per_kind", ["g2l_k", "g2l_v", "l2g_k", "l2g_v"]),
    ):
        seen.clear()
        with torch.no_grad():
            EtcEncoder(config(**MODES[mode], num_hidden_layers=1)).eval()(batch)
        assert seen == [expected], mode
    seen.clear()
    with torch.no_grad():
        EtcEncoder(config(share_relative_tables=False, num_hidden_layers=1)).eval()(batch)
    assert seen == [["global_tables"]]


def test_a_configuration_saved_before_the_etcmodel_switches_loads_with_its_weights(batch) -> None:
    """Old run.json: share_qkv_projections=False meant global tokens' own Q/K/V."""
    new_fields = {
        "share_kv_projections",
        "share_att_output_projection",
        "share_feed_forward_params",
        "share_relative_tables",
        "share_attention_norm",
        "global_token_projections",
        "embedding_size",
    }
    old = {k: v for k, v in dataclasses.asdict(config(share_qkv_projections=False)).items() if k not in new_fields}
    restored = EtcConfig.from_dict(old)
    assert restored.projection_mode == "per_token_kind"
    old_names = {"query", "key", "value", "global_query", "global_key", "global_value", "output"}
    encoder = EtcEncoder(restored).eval()
    assert {n.split(".")[3] for n in encoder.state_dict() if ".attention." in n} - {"relative_key_table"} == old_names
    torch.manual_seed(1)
    twin = EtcEncoder(restored).eval()
    twin.load_state_dict(encoder.state_dict(), strict=True)
    with torch.no_grad():
        for a, b in zip(encoder(batch), twin(batch)):
            assert torch.equal(a, b)
    assert EtcConfig.from_dict(dataclasses.asdict(config(share_qkv_projections=False))).projection_mode == "per_kind"


def test_sharing_switches_are_checked() -> None:
    with pytest.raises(GraphattnError, match=r"EtcConfig\.global_token_projections"):
        config(global_token_projections=True)
    with pytest.raises(GraphattnError, match=r"EtcConfig\.embedding_size"):
        config(embedding_size=0)
    etc = config(share_qkv_projections=False).etcmodel_layout()
    assert (etc.share_relative_tables, etc.share_attention_norm, etc.relative_bias, etc.hidden_act) == (
        False,
        False,
        True,
        "gelu_tanh",
    )
    assert etc.projection_mode == "per_kind" and etc.share_att_output_projection  # the switches are left alone


def test_global_side_modules_change_only_the_global_side(batch) -> None:
    torch.manual_seed(2)
    encoder = EtcEncoder(config(**UNSHARED_REST, num_hidden_layers=1)).double().eval()
    with torch.no_grad():
        before = encoder(batch)
        layer = encoder.layer[0]
        for module in (layer.global_attention_norm, layer.global_output_norm, layer.global_intermediate):
            edited = copy.deepcopy(encoder)
            name = [n for n, m in layer.named_children() if m is module][0]
            getattr(edited.layer[0], name).bias.add_(0.3)
            after = edited(batch)
            assert not torch.allclose(after[0], before[0]), name
            torch.testing.assert_close(after[1], before[1], rtol=0, atol=0)


def test_embedding_size_projects_token_embeddings_before_types_are_added(batch) -> None:
    torch.manual_seed(3)
    encoder = EtcEncoder(config(embedding_size=8)).eval()
    emb = encoder.embeddings
    assert emb.word_embeddings.weight.shape == (200, 8) and emb.embedding_projection.weight.shape == (32, 8)
    assert EtcEncoder(config()).embeddings.embedding_projection is None
    with torch.no_grad():
        _, long_x = emb(batch)
        ids, types = batch.long_token_ids.long(), batch.long_type_ids.long()
        expected = emb.layer_norm(emb.embedding_projection(emb.word_embeddings(ids)) + emb.token_type_embeddings(types))
    torch.testing.assert_close(long_x, expected)


BACKENDS = ["blocked", "triton"] + (["flex"] if flex.available() else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["shared", "per_side", "per_kind"])
def test_every_backend_equals_dense_in_each_mode(backend, mode, batch) -> None:
    torch.manual_seed(4)
    dtype = torch.float64 if backend == "blocked" else torch.float32
    cfg = config(**MODES[mode], **UNSHARED_REST, num_hidden_layers=1, attention_backend="dense")
    dense = EtcEncoder(cfg).to(dtype).eval()
    other = copy.deepcopy(dense)
    for module in other.modules():
        if hasattr(module, "config"):
            module.config = dataclasses.replace(module.config, attention_backend=backend)
    if backend == "flex":
        for module in other.modules():
            if isinstance(module, GlobalLocalAttention):
                module.prepare = _eager_flex(module.prepare)
    grad = backend != "flex"  # no FlexAttention backward on CPU
    results = []
    for encoder in (dense, other):
        with torch.set_grad_enabled(grad):
            global_hidden, long_hidden = encoder(batch)
            outs = [global_hidden, long_hidden]
            if grad:
                loss = global_hidden.square().sum() + long_hidden.sin().sum()
                outs += torch.autograd.grad(loss, list(encoder.parameters()), allow_unused=True)
        results.append(outs)
    tolerance = 1e-9 if dtype == torch.float64 else 2e-4
    for i, (a, b) in enumerate(zip(*results)):
        if a is None or b is None:
            assert a is None and b is None, i
            continue
        scale = max(a.abs().max().item(), 1.0)
        assert (a - b).abs().max().item() <= tolerance * scale, i


def _eager_flex(prepare):
    def run(structure, device=None):
        prepared = prepare(structure, device)
        prepared._plan.compiled = False
        return prepared

    return run


def test_the_bias_table_convention_matches_etcmodel_after_dividing_by_sqrt_d() -> None:
    """etcmodel adds its bias before the 1/sqrt(d) scale, graphattn after it: the same scores
    come out when graphattn's table is etcmodel's divided by sqrt(d) (what a loader does)."""
    from graphattn.kernels.dense import run as dense_run

    gen = torch.Generator().manual_seed(5)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    d = 4
    gq, gk, gv = rand(1, 1, 1, d), rand(1, 1, 1, d), rand(1, 1, 1, d)  # one global token
    lq, lk, lv = rand(1, 1, 2, d), rand(1, 1, 2, d), rand(1, 1, 2, d)  # two long tokens
    a, b_etc = rand(3, 1, d), rand(3, 1)
    # rows: global query, long 0, long 1; columns: global key, long 0, long 1
    labels = torch.tensor([[[0, 2, 1], [0, 0, 0], [0, 0, 0]]])
    mask = torch.tensor([[[True, True, True], [False] * 3, [False] * 3]])
    ours, _ = dense_run((labels, mask), (gq, gk, gv, lq, lk, lv), a, b_etc / math.sqrt(d), 1 / math.sqrt(d))
    keys, values = torch.cat([gk, lk], 2)[0, 0], torch.cat([gv, lv], 2)[0, 0]
    q, row = gq[0, 0, 0], labels[0, 0]
    etc_scores = (keys @ q + (a[row, 0] * q).sum(-1) + b_etc[row, 0]) / math.sqrt(d)  # etcmodel's order
    torch.testing.assert_close(ours[0, 0, 0], torch.softmax(etc_scores, 0) @ values)


def test_the_mlm_head_decodes_through_narrow_tied_embeddings() -> None:
    from graphattn.nn.pretraining_heads import MlmHead

    cfg = config(embedding_size=8)
    encoder = EtcEncoder(cfg)
    head = MlmHead(cfg, encoder.embeddings.word_embeddings)
    logits = head(torch.randn(2, 5, 32))
    assert logits.shape == (2, 5, 200) and head.dense.weight.shape == (8, 32)
    logits.sum().backward()
    assert encoder.embeddings.word_embeddings.weight.grad is not None  # the decoder is the tied table


def test_a_pattern_without_per_kind_arguments_is_refused_with_a_clear_error(batch) -> None:
    class SharedOnly:
        def attend(self, global_q, global_k, global_v, long_q, long_k, long_v, rel_key_table, rel_bias_table=None):
            return global_q, long_q

    module = GlobalLocalAttention(config(**MODES["per_side"]))
    g, x = torch.randn(2, 3, 32), torch.randn(2, 5, 32)
    with pytest.raises(GraphattnError, match="SharedOnly takes one set of keys.*needs g2l_k, g2l_v, l2g_k, l2g_v"):
        module(g, x, SharedOnly())
    out = GlobalLocalAttention(config()).eval()(g, x, SharedOnly())  # shared: nothing extra is passed
    assert out[0].shape == (2, 3, 32) and out[1].shape == (2, 5, 32)
