"""`causal=None` by default: every layer keeps the model's own rule (bidirectional encoders stay
bidirectional); `causal=True` / `False` mean one thing on every model and what contradicts a layer
is refused in one line; the rule probe is exact over the row's real length; position_ids are
compared once per forward, not in every layer."""

from __future__ import annotations

import pytest
import torch
from hf_models import VOCAB, outputs, random_docs, tiny_model

import graphattn.hf as gh
from graphattn.hf import attention

NAME = gh.register()
TOL = 2e-4
LENGTHS = (9, 3, 14, 6)


def _inputs(batch):
    return {k: batch[k] for k in ("input_ids", "position_ids", "attention_mask")}


def _packed(model, batch):
    model.set_attn_implementation(NAME)
    with torch.no_grad():
        return outputs(model, **_inputs(batch))[0]


def _alone(model, doc, causal_mask=False):
    """A document alone through transformers' SDPA (with a [1, 1, n, n] causal mask if asked)."""
    model.set_attn_implementation("sdpa")
    ids = torch.tensor([doc])
    extra = (
        {"attention_mask": torch.ones(len(doc), len(doc), dtype=torch.bool).tril()[None, None]} if causal_mask else {}
    )
    with torch.no_grad():
        return outputs(model, input_ids=ids, **extra)[0]


@pytest.mark.parametrize("family", ["bert", "modernbert", "llama", "mistral"])
def test_the_default_keeps_each_model_rule_and_the_first_document_equals_itself_alone(family):
    model = tiny_model(family)
    docs = random_docs(LENGTHS, seed=1)
    batch = gh.pack_documents(docs)  # no causal argument: the model decides
    assert batch["attention_mask"].causal is None
    packed = _packed(model, batch)
    start = 0
    for doc in docs:
        torch.testing.assert_close(packed[start : start + len(doc)], _alone(model, doc), atol=TOL, rtol=0)
        start += len(doc)


def test_causal_true_makes_an_encoder_causal_and_changes_nothing_on_a_decoder():
    bert = tiny_model("bert")
    docs = random_docs(LENGTHS, seed=2)
    packed = _packed(bert, gh.pack_documents(docs, causal=True))
    bidirectional = _packed(bert, gh.pack_documents(docs))
    torch.testing.assert_close(packed[: len(docs[0])], _alone(bert, docs[0], causal_mask=True), atol=TOL, rtol=0)
    assert (packed[: len(docs[0])] - bidirectional[: len(docs[0])]).abs().max() > 1e-2  # it is a different model
    llama = tiny_model("llama")
    assert torch.equal(_packed(llama, gh.pack_documents(docs, causal=True)), _packed(llama, gh.pack_documents(docs)))
    assert torch.equal(_packed(bert, gh.pack_documents(docs, causal=False)), bidirectional)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_causal_false_on_a_causal_decoder_is_refused_in_one_line(family):
    model = tiny_model(family)
    batch = gh.pack_documents(random_docs((5, 4), seed=3), causal=False)
    with pytest.raises(gh.GraphattnMaskError, match=rf"causal=False .* the {family} model's layers are causal") as info:
        _packed(model, batch)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_prefix_tree_on_bidirectional_layers_is_refused_unless_made_causal(family):
    model = tiny_model(family)
    segments = [(-1, [3, 4, 5]), (0, [6, 7]), (0, [8, 9, 10])]
    with pytest.raises(gh.GraphattnMaskError, match=r"prefix tree .* bidirectional layers .* causal=True"):
        _packed(model, gh.pack_tree(segments))
    _packed(model, gh.pack_documents([[3, 4, 5], [6, 7]]))  # documents without children are fine
    if family == "bert":  # causal=True: every path computes what it computes alone with a causal mask
        tree = gh.pack_tree(segments, causal=True)
        packed = _packed(model, tree)
        path = [3, 4, 5, 8, 9, 10]
        torch.testing.assert_close(packed[[0, 1, 2, 5, 6, 7]], _alone(model, path, causal_mask=True), atol=TOL, rtol=0)


def test_the_rule_probe_is_exact_over_the_row_length():
    from transformers.masking_utils import (
        causal_mask_function,
        chunked_causal_mask_function,
        sliding_window_bidirectional_mask_function,
        sliding_window_causal_mask_function,
    )

    probe = attention._probe_rule
    # a window wider than any fixed probe, named nowhere: read exactly, never taken for "no limit"
    assert probe(sliding_window_causal_mask_function(100), 300) == gh.LayerRule(lo=-99, hi=0)
    assert probe(sliding_window_bidirectional_mask_function(150), 1000) == gh.LayerRule(lo=-150, hi=150)
    # a window as wide as the row allows every offset the row holds: no limit is then exact
    assert probe(sliding_window_causal_mask_function(100), 50) == gh.LayerRule(hi=0)
    assert probe(sliding_window_causal_mask_function(100), 101) == gh.LayerRule(lo=-99, hi=0)
    assert probe(causal_mask_function, 1) == gh.LayerRule(hi=0)  # causal even on a one-token row
    with pytest.raises(gh.GraphattnMaskError, match="more than the key - query offset"):
        probe(chunked_causal_mask_function(8, torch.zeros(1, dtype=torch.long)), 64)
    with pytest.raises(gh.GraphattnMaskError, match="more than the key - query offset"):
        probe(lambda b, h, q, k: (k <= q) | ((q >= 10) & (q < 13) & (k >= 10) & (k < 13)), 40)  # an image block
    table = torch.zeros(1, 16, dtype=torch.bool)
    with pytest.raises(gh.GraphattnMaskError, match=r"cannot be read as a rule on offsets \(IndexError\)"):
        probe(lambda b, h, q, k: table[b, k], 40)  # indexes a tensor sized for another row


def test_documents_longer_than_a_wide_window_keep_the_window_in_a_model():
    model = tiny_model("mistral", sliding_window=40)
    docs = random_docs((70, 50), seed=4)
    packed = _packed(model, gh.pack_documents(docs))
    torch.testing.assert_close(packed[:70], _alone(model, docs[0]), atol=TOL, rtol=0)
    torch.testing.assert_close(packed[70:], _alone(model, docs[1]), atol=TOL, rtol=0)


def test_position_ids_are_compared_once_per_forward_not_in_every_layer(monkeypatch):
    model = tiny_model("llama", num_hidden_layers=4)
    model.set_attn_implementation(NAME)
    batch = gh.pack_documents(random_docs((6, 5), seed=5))
    structure = batch["attention_mask"]
    compared = []
    equal = torch.equal

    def counting(a, b):
        if b is structure.positions:
            compared.append(1)
        return equal(a, b)

    monkeypatch.setattr(attention.torch, "equal", counting)
    with torch.no_grad():
        outputs(model, **_inputs(batch))
        assert len(compared) == 1  # 4 layers, one comparison
        outputs(model, **_inputs(batch))
        assert len(compared) == 1  # the same, unchanged position tensor: its verdict is kept
        outputs(model, **dict(_inputs(batch), position_ids=batch["position_ids"].clone()))
        assert len(compared) == 2  # a new position tensor: compared again, once
        wrong = batch["position_ids"].clone()
        wrong[0, -1] = 9
        with pytest.raises(gh.GraphattnMaskError, match="position_ids differ"):
            outputs(model, **dict(_inputs(batch), position_ids=wrong))
        copy = batch["position_ids"].clone()
        outputs(model, **dict(_inputs(batch), position_ids=copy))
        copy[0, -1] = 9  # changed in place after its check: checked again, refused
        with pytest.raises(gh.GraphattnMaskError, match="position_ids differ"):
            outputs(model, **dict(_inputs(batch), position_ids=copy))


def test_the_collator_follows_the_model_too():
    rows = [{"input_ids": d} for d in random_docs((5, 7, 4), seed=6)]
    assert gh.PackingCollator(max_length=12)(rows)["attention_mask"].causal is None
    assert gh.PackingCollator(max_length=12, causal=True)(rows)["attention_mask"].causal is True
    assert VOCAB > max(max(r["input_ids"]) for r in rows)


def test_the_rule_of_transformers_mask_functions_is_probed_once_per_kind_and_length(monkeypatch):
    from transformers.masking_utils import sliding_window_causal_mask_function

    probed = []
    probe = attention._probe_rule
    monkeypatch.setattr(attention, "_probe_rule", lambda f, n: probed.append(n) or probe(f, n))
    monkeypatch.setattr(attention, "_RULES", {})
    model = tiny_model("qwen2")  # a full and a sliding layer type
    model.set_attn_implementation(NAME)
    for lengths in ((5, 6), (7, 4), (8, 9)):  # 11, 11, 17 tokens
        batch = gh.pack_documents(random_docs(lengths, seed=7))
        with torch.no_grad():
            outputs(model, **_inputs(batch))
    assert sorted(probed) == [11, 11, 17, 17]
    window = 3
    custom = lambda b, h, q, k: (k <= q) & (k > q - window)  # noqa: E731 - not transformers': probed every time
    assert attention._rule_of(custom, 20) == attention._rule_of(custom, 20) == gh.LayerRule(lo=-2, hi=0)
    assert probed[-2:] == [20, 20]
    assert attention._rule_of(sliding_window_causal_mask_function(6), 20) == gh.LayerRule(lo=-5, hi=0)
