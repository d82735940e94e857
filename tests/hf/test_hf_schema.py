"""The schema route: a DocGraph + relation schema as one flat sequence for BERT (encoder) and
Llama (decoder), with the per-layer, per-head relative bias; and the FlexAttention path against
the chunked one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_models import outputs, random_docs, tiny_model

import graphattn.hf as gh
from graphattn.ingest.json import read_json
from graphattn.tokenize import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
NAME = gh.register()
FLEX = gh.register("graphattn_flex_test", backend="flex")
TOL = 2e-4


@pytest.fixture(scope="module")
def hotpot():
    tokenizer = load_tokenizer(str(REPO / "examples/data/tokenizer.json"))
    graphs = list(read_json(REPO / "examples/data/hotpotqa_sample.json", "hotpotqa"))[:2]
    return gh.compile_schema(graphs, str(REPO / "schemas/hotpotqa.yaml"), tokenizer)


def _model(family: str):
    return tiny_model(family, vocab_size=3000)  # the shipped tokenizer's vocabulary


def _inputs(batch, family):
    keys = ("input_ids", "position_ids", "attention_mask") + (("token_type_ids",) if family == "bert" else ())
    return {k: batch[k] for k in keys}


def _reference(model, batch, family, tables=None):
    """The model with eager attention on the same tokens and the dense mask (+ the bias)."""
    structure = batch["attention_mask"]
    mask, labels = gh.dense_mask(structure)
    additive = torch.where(mask, 0.0, torch.finfo(torch.float32).min)[:, None]
    if tables is not None:
        additive = additive + tables[:, labels].permute(1, 0, 2, 3)
    model.set_attn_implementation("eager")
    inputs = dict(_inputs(batch, family), attention_mask=additive)
    return outputs(model, **inputs), mask.any(-1)


@pytest.mark.parametrize("family, causal", [("bert", False), ("llama", True)])
def test_zero_initialised_labels_compute_what_the_model_computes_without_graphattn(hotpot, family, causal):
    batch = dict(hotpot)
    batch["attention_mask"] = gh.Structure(**{**vars(hotpot["attention_mask"]), "causal": causal, "_plans": {}})
    model = _model(family)
    tables = gh.attach_relative_bias(model, batch["attention_mask"].num_labels)
    assert len(tables) == 2 and all(t.shape == (4, 28) and not t.any() for t in tables)
    model.set_attn_implementation(NAME)
    with torch.no_grad():
        ours = outputs(model, **_inputs(batch, family))
        ref, rows = _reference(model, batch, family)
    torch.testing.assert_close(ours[rows], ref[rows], atol=TOL, rtol=0)


def test_a_learned_bias_is_added_by_label_and_its_gradient_is_deterministic(hotpot):
    model = _model("bert")
    tables = gh.attach_relative_bias(model, hotpot["attention_mask"].num_labels)
    shared = torch.randn(4, 28, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for t in tables:
            t.copy_(shared)
    model.set_attn_implementation(NAME)
    runs = []
    for _ in range(2):
        model.zero_grad()
        out = outputs(model, **_inputs(hotpot, "bert"))
        out.square().mean().backward()
        runs.append((out.detach(), [t.grad.clone() for t in tables]))
    with torch.no_grad():
        ref, rows = _reference(model, hotpot, "bert", shared)
    torch.testing.assert_close(runs[0][0][rows], ref[rows], atol=TOL, rtol=0)
    for a, b in zip(runs[0][1], runs[1][1]):
        assert a.abs().sum() > 0 and torch.equal(a, b)


def test_the_flex_path_equals_the_chunked_path(hotpot):
    model = _model("bert")
    tables = gh.attach_relative_bias(model, hotpot["attention_mask"].num_labels)
    with torch.no_grad():
        for i, t in enumerate(tables):
            t.copy_(torch.randn(4, 28, generator=torch.Generator().manual_seed(i)))
    runs = []
    for name in (NAME, FLEX):
        model.set_attn_implementation(name)
        batch = dict(hotpot, attention_mask=gh.Structure(**{**vars(hotpot["attention_mask"]), "_plans": {}}))
        with torch.no_grad():
            runs.append(outputs(model, **_inputs(batch, "bert")))
    rows = gh.dense_mask(hotpot["attention_mask"])[0].any(-1)
    torch.testing.assert_close(runs[0][rows], runs[1][rows], atol=TOL, rtol=0)

    llama = tiny_model("qwen2")
    a, b, c = random_docs((139, 58, 97), seed=7)
    tree = gh.pack_tree([(-1, a), (0, b), (0, c)])
    docs = gh.pack_documents(random_docs((130, 20, 200), seed=6))
    for batch in (tree, docs):
        runs = []
        for name in (NAME, FLEX):
            llama.set_attn_implementation(name)
            fresh = gh.Structure(**{**vars(batch["attention_mask"]), "_plans": {}})
            with torch.no_grad():
                runs.append(
                    outputs(
                        llama, input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=fresh
                    )
                )
        torch.testing.assert_close(runs[0], runs[1], atol=TOL, rtol=0)
