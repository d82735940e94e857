"""Tiny random Llama, Qwen2 (GQA + a sliding-window layer), BERT and ModernBERT (a local layer):
a packed row computes what each document computes alone, values and parameter gradients; a
prefix tree computes what each root-to-leaf sequence computes alone."""

from __future__ import annotations

import pytest
import torch
from hf_models import DECODERS, ENCODERS, VOCAB, outputs, random_docs, tiny_model

import graphattn.hf as gh

NAME = gh.register()
TOL = 2e-4
LENGTHS = (9, 3, 14, 6)  # longer than Qwen2's window of 4 and ModernBERT's of 2 each side


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _alone(model, docs, weights):
    """Each document run alone with the model's own eager attention: outputs, and the gradient of
    sum(weights * outputs) over all documents."""
    model.set_attn_implementation("eager")
    model.zero_grad()
    outs = []
    for doc, w in zip(docs, weights):
        out = outputs(model, input_ids=torch.tensor([doc]))[0]
        (out * w).sum().backward()
        outs.append(out.detach())
    return outs, _grads(model)


@pytest.mark.parametrize("family", DECODERS + ENCODERS)
def test_a_packed_row_equals_each_document_alone_in_values_and_parameter_gradients(family):
    model = tiny_model(family)
    docs = random_docs(LENGTHS, seed=1)
    batch = gh.pack_documents(docs)  # causal=None: the model's own rule, bidirectional for an encoder
    width = VOCAB if family in DECODERS else model.config.hidden_size
    weights = [torch.randn(len(d), width, generator=torch.Generator().manual_seed(i)) for i, d in enumerate(docs)]
    alone, alone_grads = _alone(model, docs, weights)

    model.set_attn_implementation(NAME)
    model.zero_grad()
    packed = outputs(
        model, input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]
    )[0]
    (packed * torch.cat(weights)).sum().backward()
    start = 0
    for doc, ref in zip(docs, alone):
        torch.testing.assert_close(packed[start : start + len(doc)].detach(), ref, atol=TOL, rtol=0)
        start += len(doc)
    grads = _grads(model)
    assert grads.keys() == alone_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], alone_grads[name], atol=TOL, rtol=TOL, msg=name)


@pytest.mark.parametrize("family", ["qwen2", "modernbert"])
def test_changing_one_document_moves_no_other_documents_outputs(family):
    model = tiny_model(family)
    model.set_attn_implementation(NAME)
    docs = random_docs(LENGTHS, seed=2)
    changed = [list(d) for d in docs]
    changed[2] = [(t % (VOCAB - 1)) + 1 for t in reversed(changed[2])]
    runs = []
    for ds in (docs, changed):
        b = gh.pack_documents(ds)
        with torch.no_grad():
            runs.append(
                outputs(
                    model, input_ids=b["input_ids"], position_ids=b["position_ids"], attention_mask=b["attention_mask"]
                )[0]
            )
    starts = [0, 9, 12, 26, 32]
    for d in range(4):
        same = torch.equal(runs[0][starts[d] : starts[d + 1]], runs[1][starts[d] : starts[d + 1]])
        assert same == (d != 2), d


@pytest.mark.parametrize("family", DECODERS)
def test_a_prefix_tree_equals_every_root_to_leaf_sequence_alone(family):
    model = tiny_model(family)
    g = torch.Generator().manual_seed(3)
    seg = lambda n: torch.randint(1, VOCAB, (n,), generator=g).tolist()  # noqa: E731
    segments = [(-1, seg(5)), (0, seg(3)), (0, seg(4)), (1, seg(2)), (1, seg(6)), (2, seg(1)), (-1, seg(3))]
    tree = gh.pack_tree(segments)
    model.set_attn_implementation(NAME)
    with torch.no_grad():
        packed = outputs(
            model, input_ids=tree["input_ids"], position_ids=tree["position_ids"], attention_mask=tree["attention_mask"]
        )[0]
    model.set_attn_implementation("eager")
    starts, lengths = [], []
    at = 0
    for _, tokens in segments:
        starts.append(at)
        lengths.append(len(tokens))
        at += len(tokens)
    leaves = [s for s in range(len(segments)) if all(p != s for p, _ in segments)]
    for leaf in leaves:
        path, s = [], leaf
        while s >= 0:
            path.insert(0, s)
            s = segments[s][0]
        index = torch.cat([torch.arange(starts[s], starts[s] + lengths[s]) for s in path])
        with torch.no_grad():
            alone = outputs(model, input_ids=tree["input_ids"][:, index])[0]
        torch.testing.assert_close(packed[index], alone, atol=TOL, rtol=0)
    assert tree["position_ids"][0].tolist()[:12] == [0, 1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 8]


def test_a_batch_of_rows_with_different_document_counts_pads_and_matches():
    model = tiny_model("llama").eval()
    docs = random_docs((7, 6, 5, 2, 3), seed=4)
    batch = gh.pack_documents(docs, max_length=12, return_labels=True)
    assert batch["input_ids"].shape == (3, 11)  # padded to the longest row
    model.set_attn_implementation(NAME)
    with torch.no_grad():
        packed = outputs(
            model,
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=batch["attention_mask"],
        )
    model.set_attn_implementation("eager")
    where = [(0, 0), (1, 0), (1, 6), (2, 0), (2, 2)]  # (row, start) of each document
    for doc, (row, start) in zip(docs, where):
        with torch.no_grad():
            alone = outputs(model, input_ids=torch.tensor([doc]))[0]
        torch.testing.assert_close(packed[row, start : start + len(doc)], alone, atol=TOL, rtol=0)
    assert batch["labels"][2].tolist()[5:] == [-100] * 6  # padding


def test_gradients_are_deterministic_on_the_chunked_path():
    model = tiny_model("qwen2")
    model.set_attn_implementation(NAME)
    batch = gh.pack_documents(random_docs((150, 40, 90), seed=10), return_labels=True)
    runs = []
    for _ in range(2):
        model.zero_grad()
        model(**batch, use_cache=False).loss.backward()
        runs.append(_grads(model))
    assert all(torch.equal(runs[0][name], runs[1][name]) for name in runs[0])
