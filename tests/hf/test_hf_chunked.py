"""The chunked CPU path's two routes (SDPA per packed document; gathered key tiles for the rest)
against attention over the structure's dense mask: values and gradients, every rule a layer can
bring, padding between and after documents, and the cases that must leave the document route."""

import pytest
import torch

import graphattn.hf as gh
import graphattn.hf.chunked as chunked
from graphattn.hf import LayerMask, LayerRule, Structure
from graphattn.hf.structure import NO_LIMIT

RULES = {
    "bidirectional": LayerRule(),
    "causal": LayerRule(hi=0),
    "sliding 40": LayerRule(-40, 0),
    "window +-25": LayerRule(-25, 25),
    "causal + 3 ahead": LayerRule(-NO_LIMIT, 3),
}
LENGTHS = [5, 150, 1, 300, 64, 129, 400, 33]


def reference(query, key, value, structure: Structure, rule: LayerRule, scale: float) -> torch.Tensor:
    """Attention over the dense [B, N, N] mask; a row that sees nothing outputs zeros."""
    n = structure.shape[1]
    mask, _ = structure.pairs(slice(0, n), torch.arange(n), rule)
    groups = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = (query @ k.transpose(-1, -2) * scale).masked_fill(~mask[:, None], float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)
    return probs @ v


def run(function, batch, rule, seed=0):
    """Output and q / k / v gradients of `function` on random GQA inputs of the batch's shape."""
    structure = batch["attention_mask"]
    structure._plans.clear()
    b, n = structure.shape
    g = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(b, h, n, 16, generator=g, requires_grad=True) for h in (4, 2, 2)]
    if function is reference:
        out = reference(*inputs, structure, rule, 0.25)
    else:
        out = function(*inputs, LayerMask(structure, rule), None, 0.25)
    weights = torch.randn(out.shape, generator=g)
    (out * weights).sum().backward()
    return [out.detach()] + [t.grad for t in inputs]


def close(a, b):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=2e-5, rtol=0)


BATCHES = {
    "one row": lambda: gh.pack_documents([[1] * n for n in LENGTHS]),
    "rows padded": lambda: gh.pack_documents([[1] * n for n in LENGTHS], max_length=500, pad_to_multiple_of=64),
    "THD padding": lambda: gh.pack_documents(
        [[1] * n for n in LENGTHS], max_length=500, pad_documents_to_multiple_of=16
    ),
    "causal override": lambda: gh.pack_documents([[1] * n for n in LENGTHS], causal=True, max_length=500),
    "equal short documents": lambda: gh.pack_documents(
        [[1] * n for n in [16] * 20 + [40, 7] * 6 + [300, 16, 16]], max_length=400, pad_to_multiple_of=32
    ),
}


@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
@pytest.mark.parametrize("make", BATCHES.values(), ids=BATCHES.keys())
def test_packed_documents_take_the_document_route_and_equal_the_dense_mask(make, rule):
    batch = make()
    structure = batch["attention_mask"]
    plan = chunked._document_plan(structure, rule)
    assert plan is not None
    assert bool(plan.groups) == (make is BATCHES["equal short documents"])  # equal short documents: one batch
    close(run(gh.chunked_attention, batch, rule), run(reference, batch, rule))


def test_a_window_over_a_document_too_long_for_its_band_mask_takes_the_tile_route(monkeypatch):
    monkeypatch.setattr(chunked, "BAND_LIMIT", 200)
    batch = gh.pack_documents([[1] * n for n in (150, 300, 90)])
    rule = LayerRule(-40, 0)
    assert chunked._document_plan(batch["attention_mask"], rule) is None
    assert chunked._document_plan(batch["attention_mask"], LayerRule(hi=0)) is not None  # causal: no mask
    close(run(gh.chunked_attention, batch, rule), run(reference, batch, rule))


def test_positions_that_skip_inside_a_document_take_the_tile_route():
    """A window counts positions: with a gap inside a document, offsets are not index offsets."""
    batch = gh.pack_documents([[1] * n for n in (120, 200)])
    structure = batch["attention_mask"]
    positions = structure.positions.clone()
    positions[0, 60:120] += 30  # the first document's second half, 30 positions further on
    skipped = Structure("tree", positions, structure.causal, structure.enter, structure.exit)
    rule = LayerRule(-50, 0)
    assert chunked._document_plan(skipped, rule) is None
    close(
        run(gh.chunked_attention, {"attention_mask": skipped}, rule), run(reference, {"attention_mask": skipped}, rule)
    )


def test_a_prefix_tree_takes_the_tile_route_and_equals_the_dense_mask():
    batch = gh.pack_tree([(-1, [1] * 300), (0, [2] * 200), (0, [3] * 100), (1, [4] * 50), (-1, [5] * 40)])
    rule = LayerRule(-120, 0)
    assert chunked._document_plan(batch["attention_mask"], rule) is None
    close(run(gh.chunked_attention, batch, rule), run(reference, batch, rule))


def test_the_tile_route_gives_the_same_bits_with_and_without_recompute(monkeypatch):
    """Keeping the blocks for the backward pass (small batches) or recomputing them (over
    KEEP_BYTES) changes memory, never a bit of the result."""
    batch = gh.pack_tree([(-1, [1] * 700), (0, [2] * 300), (0, [3] * 200)])
    rule = LayerRule(hi=0)
    kept = run(gh.chunked_attention, batch, rule)
    monkeypatch.setattr(chunked, "KEEP_BYTES", 0)
    recomputed = run(gh.chunked_attention, batch, rule)
    assert all(torch.equal(a, b) for a, b in zip(kept, recomputed))


def test_the_document_route_is_bitwise_deterministic():
    batch = BATCHES["THD padding"]()
    first, second = (run(gh.chunked_attention, batch, LayerRule(-40, 0)) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))
