"""Multi-turn prefix trees keep every root-to-leaf path exact (sliding-window layers included);
`check_parity` measures it on any batch and finds what differs; `tree_token_ratio` counts the
tokens a tree saves."""

from __future__ import annotations

import pytest
import torch
from hf_models import outputs, random_docs, tiny_model

import graphattn.hf as gh

NAME = gh.register()
TOL = 2e-4


def _multi_turn(seed: int = 3):
    """P -> A -> {R0, R1}, P -> B -> {R2, R3}: a prompt, two first turns, two replies to each."""
    p, a, r0, r1, b, r2, r3 = random_docs((6, 4, 3, 7, 5, 2, 6), seed=seed)
    segments = [(-1, p), (0, a), (1, r0), (1, r1), (0, b), (4, r2), (4, r3)]
    paths = [p + a + r0, p + a + r1, p + b + r2, p + b + r3]
    return segments, paths


def _deep(seed: int = 4):
    """Five levels, fan-out 1 to 3, and a second root in the same row."""
    lengths = (5, 3, 4, 2, 6, 1, 3, 2, 4, 5)
    parents = (-1, 0, 0, 1, 1, 3, 3, 2, -1, 8)
    return list(zip(parents, random_docs(lengths, seed=seed)))


def _paths_of(segments):
    children = {p for p, _ in segments}
    paths = []
    for leaf in range(len(segments)):
        if leaf in children:
            continue
        chain, s = [], leaf
        while s >= 0:
            chain.insert(0, s)
            s = segments[s][0]
        paths.append([t for s in chain for t in segments[s][1]])
    return paths


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("shape", ["multi_turn", "deep"])
def test_every_root_to_leaf_path_of_a_tree_equals_itself_alone(family, shape):
    segments = _multi_turn()[0] if shape == "multi_turn" else _deep()
    tree = gh.pack_tree(segments)
    model = tiny_model(family)  # qwen2: a window of 4 on one layer; mistral: 5 on every layer
    model.set_attn_implementation(NAME)
    with torch.no_grad():
        packed = outputs(model, **{k: tree[k] for k in ("input_ids", "position_ids", "attention_mask")})[0]
    model.set_attn_implementation("eager")  # the reference: each path alone, the model's own eager attention
    found = 0
    for row, index in gh.leaf_paths(tree):
        path = tree["input_ids"][row, index].tolist()
        assert path in _paths_of(segments)
        with torch.no_grad():
            alone = outputs(model, input_ids=torch.tensor([path]))[0]
        torch.testing.assert_close(packed[index], alone, atol=TOL, rtol=0)
        found += 1
    assert found == len(_paths_of(segments))
    model.set_attn_implementation(NAME)
    report = gh.check_parity(model, tree)
    assert report.max_diff < TOL and report.paths == found


def test_check_parity_reports_the_largest_difference_and_where():
    model = tiny_model("llama")
    model.set_attn_implementation(NAME)
    segments, paths = _multi_turn()
    tree = gh.pack_tree(segments)
    report = gh.check_parity(model, tree, compare="log_probs")
    assert report.compare == "log_probs" and report.paths == 4 and report.tokens == sum(map(len, paths))
    assert report.max_diff < TOL
    assert "max |packed - alone| of log_probs" in str(report)
    # the positions of a user's own packing are wrong for the second document: check_parity finds it
    docs = random_docs((7, 9), seed=5)
    batch = gh.pack_documents(docs)
    shifted = batch["position_ids"].clone()
    shifted[0, 7:] *= 2  # every other position: RoPE sees offsets twice as large
    structure = gh.Structure(**{**vars(batch["attention_mask"]), "positions": shifted, "_plans": {}})
    bad = dict(batch, position_ids=shifted, attention_mask=structure)
    report = gh.check_parity(model, bad)
    assert report.max_diff > 1e-3
    assert (report.row, report.path) == (0, 1) and 7 <= report.token < 16
    assert gh.check_parity(model, batch).max_diff < TOL


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_check_parity_on_encoders_compares_hidden_states(family):
    model = tiny_model(family)
    model.set_attn_implementation(NAME)
    model.train()
    batch = gh.pack_documents(random_docs((9, 3, 14, 6), seed=1), max_length=20)
    report = gh.check_parity(model, batch)
    assert report.compare == "last_hidden_state" and report.paths == 4 and report.max_diff < TOL
    assert model.training  # the mode it had is given back
    if family == "bert":  # causal=True: compared with each document alone under a causal mask
        causal = gh.check_parity(model, gh.pack_tree(_multi_turn()[0], causal=True))
        assert causal.max_diff < TOL and causal.paths == 4
    with pytest.raises(gh.GraphattnMaskError, match="needs a model with logits"):
        gh.check_parity(model, batch, compare="log_probs")


def test_check_parity_refuses_in_one_line():
    batch = gh.pack_documents([[1, 2, 3], [4, 5]])
    eager = tiny_model("llama")
    eager.set_attn_implementation("eager")
    with pytest.raises(gh.GraphattnMaskError, match=r"attention is 'eager', not graphattn"):
        gh.check_parity(eager, batch)
    model = tiny_model("llama")
    model.set_attn_implementation(NAME)
    with pytest.raises(gh.GraphattnMaskError, match="expected the structure of pack_documents"):
        gh.check_parity(model, dict(batch, attention_mask=torch.ones(1, 5)))
    with pytest.raises(gh.GraphattnMaskError, match="got a graph structure"):
        gh.check_parity(model, dict(batch, attention_mask=gh.Structure("graph", batch["position_ids"])))
    with pytest.raises(ValueError, match="compare: expected one of"):
        gh.check_parity(model, batch, compare="probs")


def test_tree_token_ratio_counts_tokens_against_all_paths():
    segments, paths = _multi_turn()
    tree = gh.pack_tree(segments)
    assert gh.tree_token_ratio(tree) == pytest.approx(33 / sum(map(len, paths)))  # 33 / 60
    assert gh.tree_token_ratio(tree["attention_mask"]) == gh.tree_token_ratio(tree)
    deep = _deep()
    tokens = sum(len(t) for _, t in deep)
    assert gh.tree_token_ratio(gh.pack_tree(deep)) == pytest.approx(tokens / sum(map(len, _paths_of(deep))))
    docs = gh.pack_documents(random_docs((5, 9, 2, 7), seed=6), max_length=12, pad_to_multiple_of=8)
    assert gh.tree_token_ratio(docs) == 1.0  # documents share nothing; padding is not counted


def test_a_multi_turn_tree_gives_the_parameter_gradients_of_its_paths_run_alone():
    """Every path alone with its own output weights, summed, against the tree once: a shared token's
    weight in the tree is the sum of its weights in the paths through it."""
    model = tiny_model("qwen2")  # a full layer and a sliding-window layer
    tree = gh.pack_tree(_multi_turn()[0])
    paths = gh.leaf_paths(tree)
    g = torch.Generator().manual_seed(8)
    weights = [torch.randn(index.numel(), model.config.vocab_size, generator=g) for _, index in paths]
    model.set_attn_implementation("eager")
    model.zero_grad()
    for (row, index), w in zip(paths, weights):
        (outputs(model, input_ids=tree["input_ids"][row, index][None])[0] * w).sum().backward()
    alone = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.set_attn_implementation(NAME)
    model.zero_grad()
    packed = outputs(model, **{k: tree[k] for k in ("input_ids", "position_ids", "attention_mask")})[0]
    total = torch.zeros_like(packed)
    for (_, index), w in zip(paths, weights):
        total.index_add_(0, index, w)
    (packed * total).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == alone.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], alone[name], atol=TOL, rtol=TOL, msg=name)
