"""pack_documents, pack_tree and the collator with hand-spelled expected tensors; the structure's
tiles against the dense mask; and the errors for what graphattn cannot honour."""

from __future__ import annotations

import pytest
import torch
from hf_models import outputs, random_docs, tiny_model

import graphattn.hf as gh
from graphattn.kernels.structure import dense_region_tiles

NAME = gh.register()


def _dense(structure, rule=None):
    rule = rule or gh.LayerRule()
    n = structure.shape[1]
    return structure.pairs(slice(0, n), torch.arange(n), rule)[0]


def test_pack_documents_spells_positions_labels_and_the_mask():
    batch = gh.pack_documents([[5, 6, 7], [8, 9]], causal=True, pad_to_multiple_of=3, return_labels=True)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9, -100]]
    expected = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 0],
    ]
    assert _dense(batch["attention_mask"])[0].int().tolist() == expected
    encoder = gh.pack_documents([[5, 6, 7], [8, 9]], causal=False)
    assert _dense(encoder["attention_mask"])[0].int().tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 1],
        [0, 0, 0, 1, 1],
    ]


def test_pack_tree_spells_ancestors_positions_and_predecessors():
    # root [1 2] -> a [3] -> c [5]; root -> b [4]; laid out in the given order: 1 2 3 4 5
    tree = gh.pack_tree([(-1, [1, 2]), (0, [3]), (0, [4]), (1, [5])], causal=True, return_labels=True)
    assert tree["position_ids"].tolist() == [[0, 1, 2, 2, 3]]
    assert tree["predecessor"].tolist() == [[-1, 0, 1, 1, 2]]
    assert tree["labels"].tolist() == [[-100, 2, -100, -100, -100]]
    assert _dense(tree["attention_mask"])[0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 1, 0, 1],
    ]
    window = gh.LayerRule(lo=-1, hi=0)  # a causal window of 2 positions along the path
    assert _dense(tree["attention_mask"], window)[0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 1, 1, 0, 0],
        [0, 1, 0, 1, 0],
        [0, 0, 1, 0, 1],
    ]


@pytest.mark.parametrize("rule", [gh.LayerRule(), gh.LayerRule(hi=0), gh.LayerRule(lo=-5, hi=0), gh.LayerRule(-3, 3)])
def test_tiles_cover_every_allowed_pair_and_full_tiles_are_exact(rule):
    docs = gh.pack_documents(random_docs((13, 2, 30, 7, 1, 19), seed=8), causal=False, pad_to_multiple_of=8)
    segments = [(-1, [1] * 9), (0, [2] * 12), (0, [3] * 5), (1, [4] * 8), (-1, [5] * 6)]
    causal = gh.pack_documents(random_docs((5, 17, 11), seed=9))["attention_mask"]
    trees = [gh.pack_tree(segments, causal=c)["attention_mask"] for c in (False, True)]
    for structure in (docs["attention_mask"], causal, *trees):
        dense = _dense(structure, rule)
        exact = dense_region_tiles(dense, 4, 4)
        any_, full = structure.tiles(rule, 4)
        assert not (exact.any & ~any_).any()  # conservative: never misses a pair
        assert torch.equal(full, exact.full)


def test_the_collator_packs_dataset_rows():
    datasets = pytest.importorskip("datasets")
    rows = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], "text": ["a", "b", "c"]})
    loader = torch.utils.data.DataLoader(
        rows, batch_size=3, collate_fn=gh.PackingCollator(max_length=5, return_labels=True)
    )
    batch = next(iter(loader))
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]
    model = tiny_model("llama")
    model.set_attn_implementation(NAME)
    loss = model(**batch, use_cache=False).loss
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match=r"rows\[0\]: no 'tokens' column"):
        gh.PackingCollator(input_key="tokens")([{"input_ids": [1]}])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: gh.pack_documents([[1, 2], []]), r"docs\[1\]: empty document"),
        (lambda: gh.pack_documents([[1, 2, 3]], max_length=2), r"docs\[0\]: 3 tokens do not fit max_length=2"),
        (lambda: gh.pack_documents([[1.5]]), r"docs\[0\]\[0\]: expected an integer token id, got 1.5"),
        (lambda: gh.pack_tree([(-1, [1]), (2, [2])]), r"segments\[1\]: parent 2 must be -1 or an earlier segment"),
        (lambda: gh.pack_tree([(-1, [1]), [2]]), r"segments\[1\]: expected \(parent_index, tokens\)"),
        (lambda: gh.pack_documents([[1]], max_length=1 << 30), r"max_length: expected an integer in 1\.\."),
    ],
)
def test_bad_input_names_the_place(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_what_graphattn_cannot_honour_is_refused_never_ignored():
    batch = gh.pack_documents(random_docs((4, 5), seed=9))
    inputs = {k: batch[k] for k in ("input_ids", "position_ids", "attention_mask")}
    model = tiny_model("llama")
    model.set_attn_implementation(NAME)
    with pytest.raises(gh.GraphattnMaskError, match="position_ids differ"):
        outputs(model, **dict(inputs, position_ids=torch.arange(9)[None]))
    cache = model(**inputs, use_cache=True).past_key_values  # a whole-sequence prefill is fine
    step = gh.pack_documents([[7]])
    with pytest.raises(gh.GraphattnMaskError, match="without a KV cache"):
        model(input_ids=step["input_ids"], attention_mask=step["attention_mask"], past_key_values=cache)
    dropout = tiny_model("llama", attention_dropout=0.1)
    dropout.set_attn_implementation(NAME)
    dropout.train()
    with pytest.raises(gh.GraphattnMaskError, match="attention dropout 0.1 in training"):
        outputs(dropout, **inputs)
    dropout.eval()
    outputs(dropout, **inputs)  # no dropout at evaluation: nothing to refuse
    labelled = gh.Structure("graph", batch["position_ids"], num_labels=3)
    with pytest.raises(gh.GraphattnMaskError, match="attach_relative_bias"):
        outputs(model, **dict(inputs, attention_mask=labelled))


def test_the_model_rule_is_read_from_its_mask_function():
    from transformers.masking_utils import (
        causal_mask_function,
        sliding_window_bidirectional_mask_function,
        sliding_window_causal_mask_function,
    )

    from graphattn.hf.attention import _probe_rule

    assert _probe_rule(causal_mask_function, 16) == gh.LayerRule(hi=0)
    assert _probe_rule(sliding_window_causal_mask_function(4), 16) == gh.LayerRule(lo=-3, hi=0)
    assert _probe_rule(sliding_window_bidirectional_mask_function(2), 16) == gh.LayerRule(lo=-2, hi=2)
    with pytest.raises(gh.GraphattnMaskError, match="more than the key - query offset"):
        _probe_rule(lambda b, h, q, k: (k <= q) & (k > 3), 16)  # an overlay tied to absolute positions


def test_an_attention_call_without_our_mask_and_a_model_without_attention_modules_are_refused():
    from graphattn.hf.attention import make_attention

    structure = gh.pack_documents([[1, 2]])["attention_mask"]
    q = torch.zeros(1, 2, 2, 4)
    with pytest.raises(gh.GraphattnMaskError, match="does not build its masks through transformers.masking_utils"):
        make_attention("auto")(torch.nn.Identity(), q, q, q, structure)
    with pytest.raises(ValueError, match="backend: expected one of"):
        make_attention("cuda")
    with pytest.raises(gh.GraphattnMaskError, match="no module on transformers' attention interface"):
        gh.attach_relative_bias(torch.nn.Sequential(torch.nn.Linear(2, 2)), 4)
