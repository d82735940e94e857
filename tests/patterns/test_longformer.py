"""Longformer encoder mode: HF transformers' LongformerSelfAttention reproduced exactly, the
dilated pattern against a dense masked reference, backends, config, compiled inputs, encoder."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from graphattn.compile import compile_instance
from graphattn.errors import BatchError, CompileError, GraphattnError
from graphattn.graph import DocGraph
from graphattn.patterns.longformer import (
    LongformerAttention,
    LongformerConfig,
    LongformerEncoder,
    check_global_positions,
    lm_schedule,
    load_hf_self_attention,
)
from graphattn.patterns.longformer_inputs import collate_longformer, global_copy_positions, global_positions_from_mask
from graphattn.schema import load_schema
from graphattn.tokenize import SpacyWordTokenizer

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
LONGFORMER_SCHEMA = SCHEMAS / "longformer.yaml"


def small_config(**overrides) -> LongformerConfig:
    base = dict(
        vocab_size=50,
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=1,
        intermediate_size=64,
        attention_window=8,
        hidden_dropout_prob=0.0,
        attention_backend="blocked",
    )
    return LongformerConfig(**{**base, **overrides})


def close(actual, expected, rel=1e-5, what=""):
    """Within `rel` of the largest expected value, at least 1 (values here are O(1); a gradient
    that is exactly 0 in theory, like a key bias's, is ~1e-15 in practice)."""
    scale = max(expected.abs().max().item(), 1.0)
    torch.testing.assert_close(actual, expected, rtol=rel, atol=rel * scale, msg=lambda m: f"{what}: {m}")


# -- HF transformers' LongformerSelfAttention -----------------------------------------------------
def hf_attention(window: int):
    transformers = pytest.importorskip("transformers")
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    config = transformers.LongformerConfig(
        hidden_size=32, num_attention_heads=4, attention_window=[window], attention_probs_dropout_prob=0.0
    )
    return LongformerSelfAttention(config, layer_id=0).eval()


def hf_inputs(lengths, global_rows, window, seed=0):
    """Hidden states padded to a multiple of the window (as LongformerModel does) and HF's float
    mask: -10000 padding, 0 local, +10000 global."""
    padded = math.ceil(max(lengths) / window) * window
    hidden = torch.randn(len(lengths), padded, 32, generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(len(lengths), padded)
    for b, (length, rows) in enumerate(zip(lengths, global_rows)):
        mask[b, length:] = -10000.0
        mask[b, rows] = 10000.0
    return hidden, mask


def run_hf(hf, hidden, mask):
    is_global = mask > 0
    return hf(
        hidden,
        attention_mask=mask,
        is_index_masked=mask < 0,
        is_index_global_attn=is_global,
        is_global_attn=bool(is_global.any()),
    )[0]


@pytest.mark.parametrize("window", [4, 6, 8, 16])
def test_matches_hf_longformer(window):
    hf = hf_attention(window)
    ours = LongformerAttention(small_config(attention_window=window))
    load_hf_self_attention(ours, hf.state_dict())
    lengths, global_rows = (21, 13), ([0, 5, 6, 20], [12, 0])
    hidden, mask = hf_inputs(lengths, global_rows, window)
    hidden.requires_grad_()
    expected = run_hf(hf, hidden, mask)
    # ours runs on the unpadded length, with the globals in another order and one empty slot
    length = max(lengths)
    positions = torch.tensor([[20, 0, 6, 5], [0, 12, -1, -1]])
    got = ours.context(hidden[:, :length], positions, mask[:, :length] > -1)
    real = torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]
    close(got[real], expected[:, :length][real], what="output")
    assert torch.equal(got[~real], torch.zeros_like(got[~real]))  # padded rows are zeros, as HF's

    upstream = torch.randn(got.shape, generator=torch.Generator().manual_seed(1)) * real[..., None]
    ours_grad = torch.autograd.grad(got, hidden, upstream)[0][:, :length]
    hf_grad = torch.autograd.grad(expected[:, :length], hidden, upstream)[0][:, :length]
    close(ours_grad, hf_grad, what="d hidden")


def test_matches_hf_without_global_positions():
    hf = hf_attention(6)
    ours = LongformerAttention(small_config(attention_window=6))
    load_hf_self_attention(ours, hf.state_dict())
    hidden, mask = hf_inputs((17, 12), ([], []), 6, seed=2)
    expected = run_hf(hf, hidden, mask)
    got = ours.context(hidden, torch.zeros(2, 0, dtype=torch.long), mask == 0)
    real = mask == 0
    close(got[real], expected[real])


# -- dilated pattern against a dense masked reference ---------------------------------------------
def reference_context(att: LongformerAttention, hidden, positions, long_mask):
    """From the definition, over dense [L, L] masks: a non-global query sees its dilated window and
    every global position (local projections, one softmax); a global position's row uses the
    global projections over every real token; padded rows are zeros."""
    batch, length, _ = hidden.shape
    split = lambda x: x.view(batch, -1, att.num_heads, att.head_dim).transpose(1, 2)  # noqa: E731
    q, k, v = (split(p(hidden)) for p in (att.query, att.key, att.value))
    is_global = torch.zeros(batch, length, dtype=torch.bool)
    for b in range(batch):
        is_global[b, positions[b][positions[b] >= 0]] = True
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    heads = []
    for h, d in enumerate(att.dilations):
        window = ((i - j).abs() <= d * att.radius) & ((i - j) % d == 0)
        mask = (window[None] | is_global[:, None, :]) & long_mask[:, None, :]
        scores = (q[:, h] @ k[:, h].transpose(-1, -2) / math.sqrt(att.head_dim)).masked_fill(~mask, -math.inf)
        heads.append(torch.softmax(scores, dim=-1) @ v[:, h])
    out = torch.stack(heads, dim=1)
    gq, gk, gv = (split(p(hidden)) for p in (att.global_query, att.global_key, att.global_value))
    scores = (gq @ gk.transpose(-1, -2) / math.sqrt(att.head_dim)).masked_fill(~long_mask[:, None, None, :], -math.inf)
    global_rows = torch.softmax(scores, dim=-1) @ gv
    out = torch.where(is_global[:, None, :, None], global_rows, out) * long_mask[:, None, :, None]
    return out.transpose(1, 2).reshape(batch, length, -1)


def random_module(config, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    att = LongformerAttention(config).to(dtype)
    for p in att.parameters():  # separate global weights: the check must tell them apart
        torch.nn.init.normal_(p, std=0.3)
    return att


@pytest.mark.parametrize("backend", ["dense", "blocked"])
@pytest.mark.parametrize("dilations, window", [((1, 2, 1, 3), 4), ((4, 4, 2, 2), 6), ((1, 1, 1, 1), 2)])
def test_dilated_matches_reference(backend, dilations, window):
    att = random_module(
        small_config(attention_window=window, attention_dilation=[list(dilations)], attention_backend=backend)
    )
    hidden = torch.randn(2, 29, 32, dtype=torch.float64, requires_grad=True)
    long_mask = torch.arange(29)[None, :] < torch.tensor([[29], [22]])
    positions = torch.tensor([[3, 28, 10], [21, -1, -1]])
    got = att.context(hidden, positions, long_mask)
    expected = reference_context(att, hidden, positions, long_mask)
    close(got, expected, rel=1e-10, what="output")
    leaves = [hidden, *att.parameters()]
    upstream = torch.randn(got.shape, dtype=got.dtype, generator=torch.Generator().manual_seed(4))
    used = [p for p in leaves if p is not None and p is not att.output.weight and p is not att.output.bias]
    for g, e in zip(torch.autograd.grad(got, used, upstream), torch.autograd.grad(expected, used, upstream)):
        close(g, e, rel=1e-10, what="gradient")


def test_triton_matches_dense():
    pytest.importorskip("triton")
    config = small_config(
        num_attention_heads=2, attention_window=6, attention_dilation=[[1, 3]], attention_backend="triton"
    )
    att = random_module(config, dtype=torch.float32)
    hidden = torch.randn(1, 44, 32, requires_grad=True)
    positions, long_mask = torch.tensor([[0, 30]]), torch.arange(44)[None, :] < 41
    got = att.context(hidden, positions, long_mask)
    att.backend = "dense"
    expected = att.context(hidden, positions, long_mask)
    close(got, expected, what="output")
    upstream = torch.randn(got.shape, generator=torch.Generator().manual_seed(2))
    for g, e in zip(
        torch.autograd.grad(got, [hidden, *att.parameters()], upstream, allow_unused=True),
        torch.autograd.grad(expected, [hidden, *att.parameters()], upstream, allow_unused=True),
    ):
        if e is not None:
            close(g, e, what="gradient")


def test_window_covering_everything_is_full_attention():
    """Without globals and with w/2 >= L, every real token attends every real token (BERT)."""
    att = random_module(small_config(attention_window=64))
    hidden = torch.randn(2, 19, 32, dtype=torch.float64)
    long_mask = torch.arange(19)[None, :] < torch.tensor([[19], [11]])
    got = att.context(hidden, torch.zeros(2, 0, dtype=torch.long), long_mask)
    split = lambda x: x.view(2, 19, 4, 8).transpose(1, 2)  # noqa: E731
    full = (
        torch.nn.functional.scaled_dot_product_attention(
            split(att.query(hidden)),
            split(att.key(hidden)),
            split(att.value(hidden)),
            attn_mask=long_mask[:, None, None, :],
        )
        .transpose(1, 2)
        .reshape(2, 19, 32)
    )
    close(got[long_mask], full[long_mask], rel=1e-10)


# -- projections -------------------------------------------------------------------------------------
def test_global_projections_start_as_copies_and_shared_ablation_agrees():
    encoder = LongformerEncoder(small_config(num_hidden_layers=2))
    for layer in encoder.layer:
        att = layer.attention
        for local, glob in ((att.query, att.global_query), (att.key, att.global_key), (att.value, att.global_value)):
            assert torch.equal(local.weight, glob.weight) and torch.equal(local.bias, glob.bias)
    separate = encoder.layer[0].attention
    shared = LongformerAttention(small_config(share_qkv_projections=True))
    assert not hasattr(shared, "global_query")
    shared.load_state_dict({k: v for k, v in separate.state_dict().items() if not k.startswith("global_")})
    hidden, positions = torch.randn(1, 12, 32), torch.tensor([[0, 7]])
    close(shared.context(hidden, positions), separate.context(hidden, positions))


# -- config --------------------------------------------------------------------------------------------
def test_config_expands_windows_and_dilations():
    config = small_config(num_hidden_layers=3, attention_window=[4, 8, 16], attention_dilation=[1, 2, [1, 1, 3, 3]])
    assert config.attention_window == (4, 8, 16)
    assert config.attention_dilation == ((1, 1, 1, 1), (2, 2, 2, 2), (1, 1, 3, 3))
    assert LongformerConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(attention_window=5), "even"),
        (dict(attention_window=[4, 4]), "2 windows given for num_hidden_layers=1"),
        (dict(attention_dilation=0), "stride >= 1"),
        (dict(attention_dilation=[[1, 2]]), "2 dilations for num_attention_heads=4"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(GraphattnError, match=message):
        small_config(**overrides)


def test_lm_schedule_follows_the_paper():
    windows, dilations = lm_schedule(12, 8, 32, 8192)
    assert windows[0] == 32 and windows[-1] == 8192 and list(windows) == sorted(windows)
    assert all(w % 2 == 0 for w in windows)
    # Table 12: gaps 0 on layers 0-5, 1 on 6-7, 2 on 8-9, 3 on 10-11, on 2 heads (our strides: gap + 1)
    assert [row[-1] for row in dilations] == [1] * 6 + [2, 2, 3, 3, 4, 4]
    assert all(row[:6] == (1,) * 6 and row[6] == row[7] for row in dilations)
    _, large = lm_schedule(30, 12, 512, 23040)
    assert [row[-1] for row in large] == [1] * 15 + [2] * 5 + [3] * 5 + [4] * 5
    assert LongformerConfig.char_lm_small().attention_dilation[10] == (1,) * 6 + (4, 4)


# -- global positions ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "positions, message",
    [([[0, 9]], "outside"), ([[0, 7]], "padding"), ([[2, 2]], "global twice"), ([[-2]], "outside")],
)
def test_bad_global_positions(positions, message):
    long_mask = torch.arange(9)[None, :] < 7
    with pytest.raises(BatchError, match=message):
        check_global_positions(torch.tensor(positions), long_mask)


def test_positions_from_hf_mask():
    mask = torch.tensor([[0, 1, 0, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    assert global_positions_from_mask(mask).tolist() == [[1, 3], [0, -1], [-1, -1]]


# -- compiled inputs -------------------------------------------------------------------------------------
TEXT = "red fox\nblue\nwhich color ?\n\nthe red fox ran . it was fast ."


def span(text: str, part: str) -> tuple[int, int]:
    start = text.index(part)
    return start, start + len(part)


def wikihop_like_graph() -> DocGraph:
    graph = DocGraph(TEXT, doc_id="w1")
    graph.add_node("c0", "candidate", span(TEXT, "red fox"))
    graph.add_node("c1", "candidate", span(TEXT, "blue"))
    graph.add_node("q", "query", span(TEXT, "which color ?"))
    graph.add_node("d0", "document", span(TEXT, "the red fox ran . it was fast ."))
    graph.add_child("d0", "d0.s0", "sentence", span(TEXT, "the red fox ran ."))
    return graph


@pytest.fixture
def words():
    """Word tokens; ids 1..5 exist (ETC's [unused] global-token ids that wikihop.yaml names)."""
    return SpacyWordTokenizer([f"[unused{i}]" for i in range(5)], grow=True)


def test_schema_globals_are_copies_of_long_positions(words):
    inst = compile_instance(wikihop_like_graph(), LONGFORMER_SCHEMA, words)
    assert [inst.long_token_text(i) for i in range(inst.long_length)] == [
        "",
        "red",
        "fox",
        "blue",
        "which",
        "color",
        "?",
        "the",
        "red",
        "fox",
        "ran",
        ".",
        "it",
        "was",
        "fast",
        ".",
    ]
    assert inst.global_node_ids == ["<cls>", "c0", "c0", "c1", "q", "q", "q"]
    positions = global_copy_positions(inst, LONGFORMER_SCHEMA)
    assert positions.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert inst.global_token_ids.tolist() == inst.long_token_ids[positions].tolist()  # copies, token for token


def test_node_globals_are_rejected(words):
    schema = load_schema(SCHEMAS / "wikihop.yaml")  # candidates and documents are `global: node`
    inst = compile_instance(wikihop_like_graph(), schema, words)
    with pytest.raises(CompileError, match=r"global 0 \('c0', type 'candidate'\) is not a copy.*global: per_token"):
        global_copy_positions(inst, schema)


def test_prefix_without_long_copy_is_rejected(words):
    import yaml

    data = yaml.safe_load(LONGFORMER_SCHEMA.read_text())
    data["long_prefix"] = []
    with pytest.raises(CompileError, match="add 'cls' to long_prefix"):
        global_copy_positions(compile_instance(wikihop_like_graph(), data, words), data)


def test_collate_pads_positions(words):
    short = DocGraph("blue ?\n\nsky", doc_id="w2")
    short.add_node("q", "query", (0, 6))
    short.add_node("d", "document", (8, 11))
    instances = [
        compile_instance(wikihop_like_graph(), LONGFORMER_SCHEMA, words),
        compile_instance(short, LONGFORMER_SCHEMA, words),
    ]
    batch, positions = collate_longformer(instances, LONGFORMER_SCHEMA)
    assert positions.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, -1, -1, -1, -1]]
    assert positions.shape[1] == batch.global_token_ids.shape[1]


# -- the encoder ------------------------------------------------------------------------------------------
def test_encoder_end_to_end(words):
    graph = wikihop_like_graph()
    short = DocGraph("blue ?\n\nsky", doc_id="w2")
    short.add_node("q", "query", (0, 6))
    short.add_node("d", "document", (8, 11))
    instances = [compile_instance(g, LONGFORMER_SCHEMA, words) for g in (graph, short)]
    batch, positions = collate_longformer(instances, LONGFORMER_SCHEMA)
    config = small_config(
        vocab_size=words.vocab_size, num_hidden_layers=2, attention_window=[2, 4], attention_dilation=[1, [1, 1, 2, 3]]
    )
    torch.manual_seed(0)
    encoder = LongformerEncoder(config).eval()
    global_hidden, long_hidden = encoder(batch, positions)
    assert global_hidden.shape == (2, 7, 32) and long_hidden.shape == (2, 16, 32)
    assert torch.equal(global_hidden[0], long_hidden[0, positions[0]])
    assert torch.equal(global_hidden[1, 3:], torch.zeros(4, 32))  # empty slots

    # the short instance alone (no padding) gives the same real rows
    alone_batch, alone_positions = collate_longformer(instances[1:], LONGFORMER_SCHEMA)
    _, alone = encoder(alone_batch, alone_positions)
    close(long_hidden[1, : alone.shape[1]], alone[0])

    encoder.train()
    encoder.config.gradient_checkpointing = True
    _, again = encoder(batch, positions)
    close(again, long_hidden)
    again.sum().backward()
    assert all(p.grad is not None for p in encoder.parameters())
