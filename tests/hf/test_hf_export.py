"""The ecosystem's formats: varlen kwargs and seq_idx equal transformers' DataCollatorWithFlattening
for the same documents; multi-row and THD-padded batches describe their buffer; Magi ranges expanded
to a dense mask equal the structure's own; a tree is never flattened."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_models import VOCAB, outputs, random_docs, tiny_model

import graphattn.hf as gh

NAME = gh.register()
DOC_SETS = [(3, 2), (1,), (7, 1, 1, 12, 4), (5, 5, 5, 5)]
EXPORTED = ("input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k")


def _collator(rows):
    from transformers import DataCollatorWithFlattening

    return DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(rows)


def _same(ours: dict, theirs: dict) -> None:
    for key in EXPORTED:
        assert ours[key].dtype == theirs[key].dtype, key
        assert torch.equal(ours[key], theirs[key]), key
    for key in ("max_length_q", "max_length_k"):
        assert type(ours[key]) is type(theirs[key]) is int and ours[key] == theirs[key], key


@pytest.mark.parametrize("lengths", DOC_SETS)
def test_the_exports_equal_transformers_flattening_collator(lengths):
    docs = random_docs(lengths, seed=len(lengths))
    ours = gh.pack_documents(docs, return_labels=True, return_flash_kwargs=True, return_seq_idx=True)
    _same(ours, _collator([{"input_ids": d} for d in docs]))
    collated = gh.PackingCollator(return_labels=True, return_flash_kwargs=True, return_seq_idx=True)(
        [{"input_ids": d} for d in docs]
    )
    _same(collated, _collator([{"input_ids": d} for d in docs]))


def test_rows_labels_are_exported_as_the_collator_exports_them():
    docs = random_docs((6, 4, 9), seed=3)
    rows = [{"input_ids": d, "labels": [-100] * (len(d) // 2) + d[len(d) // 2 :]} for d in docs]
    ours = gh.PackingCollator(return_flash_kwargs=True, return_seq_idx=True)(rows)
    _same(ours, _collator(rows))


def test_several_rows_describe_the_flattened_buffer_each_padding_token_its_own_sequence():
    docs = random_docs((7, 6, 5, 2, 3), seed=4)
    batch = gh.pack_documents(docs, max_length=12, return_flash_kwargs=True, return_seq_idx=True)
    assert batch["input_ids"].shape == (3, 11)
    cu, flat = batch["cu_seq_lens_q"], batch["input_ids"].reshape(-1)
    assert cu.dtype == torch.int32 and int(cu[-1]) == flat.numel()
    pieces = [flat[int(a) : int(b)].tolist() for a, b in zip(cu[:-1], cu[1:])]
    assert pieces == [docs[0], *[[0]] * 4, docs[1], docs[2], docs[3], docs[4], *[[0]] * 6]
    assert batch["max_length_q"] == batch["max_length_k"] == 7
    assert batch["seq_idx"].shape == (3, 11) and batch["seq_idx"].dtype == torch.int32
    sizes = (cu[1:] - cu[:-1]).long()
    assert torch.equal(batch["seq_idx"].reshape(-1).long(), torch.repeat_interleave(torch.arange(len(sizes)), sizes))
    # varlen attention over the buffer (one block per sequence) is the structure's own mask on real tokens
    block = batch["seq_idx"].reshape(-1)
    varlen = block[:, None] == block[None, :]
    structure = gh.pack_documents(docs, causal=False, max_length=12)["attention_mask"]
    mask, _ = gh.dense_mask(structure)
    real = structure.real_tokens().reshape(-1)
    dense = torch.block_diag(*mask)
    assert torch.equal(varlen[real][:, real], dense[real][:, real])


@pytest.mark.parametrize("lengths", DOC_SETS)
def test_a_padded_row_equals_trls_padding_free_collator(lengths):
    pytest.importorskip("trl")
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    docs = random_docs(lengths, seed=7)
    theirs = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, pad_to_multiple_of=8)(
        [{"input_ids": d} for d in docs]
    )
    ours = gh.pack_documents(
        docs, pad_to_multiple_of=8, return_labels=True, return_flash_kwargs=True, return_seq_idx=True
    )
    _same(ours, theirs)


def test_thd_padding_pads_each_document_and_says_where_it_starts():
    docs = random_docs((3, 2, 4, 5), seed=5)
    batch = gh.pack_documents(
        docs, pad_documents_to_multiple_of=4, return_flash_kwargs=True, return_seq_idx=True, return_labels=True
    )
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5, 9, 14]  # the real lengths (TransformerEngine's cu_seqlens)
    assert batch["cu_seq_lens_padded"].tolist() == [0, 4, 8, 12, 20]
    assert batch["cu_seq_lens_padded"].dtype == torch.int32
    flat = batch["input_ids"].reshape(-1)
    for d, doc in enumerate(docs):
        start = int(batch["cu_seq_lens_padded"][d])
        assert flat[start : start + len(doc)].tolist() == doc
        assert batch["seq_idx"][0, start : int(batch["cu_seq_lens_padded"][d + 1])].tolist() == [d] * (
            int(batch["cu_seq_lens_padded"][d + 1]) - start
        )
    assert batch["labels"][0].tolist()[3] == -100 and batch["position_ids"][0].tolist()[:8] == [0, 1, 2, 0, 0, 1, 0, 0]
    # the padding sits between documents and attends nothing: each document computes what it computes alone
    model = tiny_model("llama")
    model.set_attn_implementation(NAME)
    with torch.no_grad():
        packed = outputs(
            model,
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=batch["attention_mask"],
        )[0]
    model.set_attn_implementation("eager")
    for d, doc in enumerate(docs):
        start = int(batch["cu_seq_lens_padded"][d])
        with torch.no_grad():
            alone = outputs(model, input_ids=torch.tensor([doc]))[0]
        torch.testing.assert_close(packed[start : start + len(doc)], alone, atol=2e-4, rtol=0)
    # the collator pads the same way; rows keep max_length with the padding counted
    rows = gh.PackingCollator(max_length=8, pad_documents_to_multiple_of=4)([{"input_ids": d} for d in docs])
    assert rows["input_ids"].shape == (3, 8) and rows["cu_seq_lens_padded"].tolist() == [0, 4, 8, 16, 24]
    with pytest.raises(
        ValueError, match=r"docs\[0\]: 5 tokens \(8 padded to a multiple of 4\) do not fit max_length=6"
    ):
        gh.pack_documents([[1] * 5], max_length=6, pad_documents_to_multiple_of=4)


def test_a_tree_is_never_flattened_to_cu_seq_lens():
    segments = [(-1, [1, 2]), (0, [3]), (0, [4])]
    for call in (
        lambda: gh.pack_tree(segments, return_flash_kwargs=True),
        lambda: gh.pack_tree(segments, return_seq_idx=True),
        lambda: gh.pack_tree(segments)["attention_mask"].to_flash_kwargs(),
        lambda: gh.pack_tree(segments)["attention_mask"].to_seq_idx(padded_documents=True),
    ):
        with pytest.raises(ValueError, match="a prefix tree cannot be flattened to cu_seq_lens") as error:
            call()
        assert "\n" not in str(error.value)
    roots = gh.pack_tree([(-1, [1, 2]), (-1, [3])], return_flash_kwargs=True, return_seq_idx=True)
    assert roots["cu_seq_lens_q"].tolist() == [0, 2, 3] and roots["seq_idx"].tolist() == [[0, 0, 1]]


# -- MagiAttention ranges -------------------------------------------------------------------------


def _expand(q_ranges, k_ranges, types, n: int) -> torch.Tensor:
    """How many slices cover each (query, key) pair; causal slices bottom-right aligned."""
    count = torch.zeros(n, n, dtype=torch.int64)
    for (q0, q1), (k0, k1), kind in zip(q_ranges.tolist(), k_ranges.tolist(), types):
        i = torch.arange(q0, q1)[:, None]
        j = torch.arange(k0, k1)[None, :]
        allowed = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool)
        if kind == "causal":
            allowed = (j - k0) <= (i - q0) + ((k1 - k0) - (q1 - q0))
        else:
            assert kind == "full"
        count[q0:q1, k0:k1] += allowed.long()
    return count


def _random_tree(seed: int, count: int, preorder: bool) -> list[tuple[int, list[int]]]:
    g = np.random.default_rng(seed)
    parents = [-1] + [int(g.integers(-1, i)) if g.random() < 0.9 else -1 for i in range(1, count)]
    if preorder:  # lay the same forest out depth-first
        children: dict[int, list[int]] = {}
        for s, p in enumerate(parents):
            children.setdefault(p, []).append(s)
        order, stack = [], list(reversed(children[-1]))
        while stack:
            s = stack.pop()
            order.append(s)
            stack.extend(reversed(children.get(s, [])))
        new = {s: i for i, s in enumerate(order)}
        parents = [-1 if parents[s] < 0 else new[parents[s]] for s in order]
    return [(p, g.integers(1, VOCAB, int(g.integers(1, 6))).tolist()) for p in parents]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_magi_ranges_expand_to_the_structures_own_mask_each_pair_once(seed, causal):
    for preorder in (False, True):
        segments = _random_tree(seed, 12, preorder)
        structure = gh.pack_tree(segments, causal=causal, pad_to_multiple_of=8)["attention_mask"]
        q, k, types = structure.to_magi_ranges()
        assert q.dtype == k.dtype == torch.int32 and q.shape == k.shape == (len(types), 2)
        n = structure.shape[1]
        count = _expand(q, k, types, n)
        mask, _ = gh.dense_mask(structure)
        assert count.max() <= 1  # no pair twice
        assert torch.equal(count.bool(), mask[0])
        if preorder:  # one slice per segment and one for its descendants: O(segments), not per token
            assert len(types) <= 2 * len(segments)


def test_magi_ranges_of_packed_documents_one_slice_each_per_row():
    docs = random_docs((7, 6, 5, 2, 3), seed=4)
    structure = gh.pack_documents(docs, max_length=12, causal=True)["attention_mask"]
    mask, _ = gh.dense_mask(structure)
    for row in range(3):
        q, k, types = structure.to_magi_ranges(row=row)
        assert torch.equal(q, k) and set(types) == {"causal"}
        assert torch.equal(_expand(q, k, types, structure.shape[1]).bool(), mask[row])
    assert gh.pack_documents(docs, max_length=12)["attention_mask"].to_magi_ranges(row=1, causal=False)[0].tolist() == [
        [0, 6],
        [6, 11],
    ]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s: s.to_magi_ranges(), r"to_magi_ranges: the structure has 3 rows; pass row=0\.\.2"),
        (lambda s: s.to_magi_ranges(row=3, causal=True), r"row must be an integer in 0\.\.2, got 3"),
        (lambda s: s.to_magi_ranges(row=True, causal=True), r"row must be an integer in 0\.\.2, got True"),
        (lambda s: s.to_magi_ranges(row=0), r"leaves causality to each layer \(causal=None\)"),
        (lambda s: s.to_magi_ranges(row=0, causal="yes"), r"causal must be None, True or False, got 'yes'"),
    ],
)
def test_magi_refusals_are_one_line(call, message):
    structure = gh.pack_documents(random_docs((7, 6, 5, 2, 3), seed=4), max_length=12)["attention_mask"]
    with pytest.raises(ValueError, match=message) as error:
        call(structure)
    assert "\n" not in str(error.value)


def test_the_schema_route_has_no_varlen_or_magi_form():
    graph = gh.Structure("graph", torch.zeros(1, 4, dtype=torch.long), num_labels=3)
    for call in (graph.to_flash_kwargs, graph.to_seq_idx, graph.to_magi_ranges, graph.sum):
        with pytest.raises(ValueError, match="schema route"):
            call()
