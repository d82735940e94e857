"""Hostile inputs to pack_documents, pack_tree and PackingCollator: each is refused before anything
is allocated, in one line naming the argument and the index."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphattn.hf as gh
from graphattn.hf.inputs import MAX_TOKENS

HUGE = 1 << 40


def _huge_view() -> torch.Tensor:
    """A 2^40-token strided view of one element: nothing is allocated until someone copies it."""
    return torch.zeros(1, dtype=torch.long).expand(HUGE)


def _huge_array() -> np.ndarray:
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.int64), shape=(HUGE,), strides=(0,))


CASES = {
    # documents
    "a single 1-D tensor as docs": (
        lambda: gh.pack_documents(torch.tensor([5, 6, 7])),
        r"docs: .*1-D tensor.*\[docs\]",
    ),
    "a 2-D tensor as docs": (lambda: gh.pack_documents(torch.ones(2, 3, dtype=torch.long)), r"docs: .*2-D tensor"),
    "a 2-D array as docs": (lambda: gh.pack_documents(np.ones((2, 3), np.int64)), r"docs: .*2-D array"),
    "a 2-D array as one document": (
        lambda: gh.pack_documents([np.ones((2, 3), np.int64)]),
        r"docs\[0\]: .*shape \(2, 3\)",
    ),
    "a flat list of ints as docs": (lambda: gh.pack_documents([5, 6, 7]), r"docs\[0\]: .*got 5 \(a single document"),
    "docs None": (lambda: gh.pack_documents(None), r"docs: expected a list of documents .*got None"),
    "docs a string": (lambda: gh.pack_documents("5 6 7"), r"docs: expected a list of documents"),
    "no documents": (lambda: gh.pack_documents([]), r"docs: no documents"),
    "an empty document": (lambda: gh.pack_documents([[1], []]), r"docs\[1\]: empty document"),
    "a None document": (lambda: gh.pack_documents([[1], None]), r"docs\[1\]: expected a list of integer token ids"),
    "a string document": (lambda: gh.pack_documents(["abc"]), r"docs\[0\]: expected a list of integer token ids"),
    # token ids
    "a negative id": (lambda: gh.pack_documents([[1, 2], [3, -1]]), r"docs\[1\]\[1\]: token id -1 is negative"),
    "-100 as a token": (lambda: gh.pack_documents([[1, -100]]), r"docs\[0\]\[1\]: token id -100 is negative"),
    "a float id": (lambda: gh.pack_documents([[1, 1.5]]), r"docs\[0\]\[1\]: expected an integer token id, got 1\.5"),
    "a whole float id": (lambda: gh.pack_documents([[2.0]]), r"docs\[0\]\[0\]: expected an integer token id, got 2\.0"),
    "a bool id": (lambda: gh.pack_documents([[1, True]]), r"docs\[0\]\[1\]: expected an integer token id, got True"),
    "a numpy bool id": (lambda: gh.pack_documents([[np.bool_(1)]]), r"docs\[0\]\[0\]: expected an integer token id"),
    "a string id": (lambda: gh.pack_documents([[1, "5"]]), r"docs\[0\]\[1\]: expected an integer token id, got '5'"),
    "a None id": (lambda: gh.pack_documents([[None]]), r"docs\[0\]\[0\]: expected an integer token id, got None"),
    "a 2^70 id": (lambda: gh.pack_documents([[1, 1 << 70]]), r"docs\[0\]\[1\]: token id \d+ is out of range"),
    "a uint64 id over int64": (
        lambda: gh.pack_documents([np.array([1, 1 << 63], np.uint64)]),
        r"docs\[0\]\[1\]: token id \d+ is out of range",
    ),
    "a float tensor": (lambda: gh.pack_documents([torch.ones(3)]), r"docs\[0\]: expected integer token ids, got dtype"),
    "a bool tensor": (lambda: gh.pack_documents([torch.ones(3, dtype=torch.bool)]), r"docs\[0\]: .*dtype torch\.bool"),
    "a negative id in a tensor": (
        lambda: gh.pack_documents([torch.tensor([4, 5, -3])]),
        r"docs\[0\]\[2\]: token id -3 is negative",
    ),
    "a 2^40-token strided tensor": (lambda: gh.pack_documents([_huge_view()]), rf"docs\[0\]: {HUGE} tokens, over"),
    "a 2^40-token strided array": (lambda: gh.pack_documents([_huge_array()]), rf"docs\[0\]: {HUGE} tokens, over"),
    "too many tokens in all": (
        lambda: gh.pack_documents([torch.zeros(1, dtype=torch.long).expand(MAX_TOKENS)] * 2),
        rf"docs: {2 * MAX_TOKENS} tokens in all, over the limit",
    ),
    # max_length
    "max_length nan": (lambda: gh.pack_documents([[1]], max_length=float("nan")), r"max_length: .*got nan"),
    "max_length 2.5": (lambda: gh.pack_documents([[1]], max_length=2.5), r"max_length: .*got 2\.5"),
    "max_length True": (lambda: gh.pack_documents([[1]], max_length=True), r"max_length: .*got True"),
    "max_length '8'": (lambda: gh.pack_documents([[1]], max_length="8"), r"max_length: .*got '8'"),
    "max_length 0": (
        lambda: gh.pack_documents([[1]], max_length=0),
        r"max_length: expected an integer in 1\.\..*got 0",
    ),
    "max_length 2^30": (lambda: gh.pack_documents([[1]], max_length=1 << 30), r"max_length: .*got 1073741824"),
    # padding
    "pad_to_multiple_of 0": (lambda: gh.pack_documents([[1]], pad_to_multiple_of=0), r"pad_to_multiple_of: .*got 0"),
    "pad_to_multiple_of -4": (lambda: gh.pack_documents([[1]], pad_to_multiple_of=-4), r"pad_to_multiple_of: .*got -4"),
    "pad_to_multiple_of 2.5": (lambda: gh.pack_documents([[1]], pad_to_multiple_of=2.5), r"pad_to_multiple_of: .*2\.5"),
    "pad_to_multiple_of None": (
        lambda: gh.pack_tree([(-1, [1])], pad_to_multiple_of=None),
        r"pad_to_multiple_of: .*None",
    ),
    "a huge row multiple": (
        lambda: gh.pack_documents([[1], [2]], max_length=1, pad_to_multiple_of=MAX_TOKENS),
        r"a batch of 2 rows x 16777216 tokens is over the limit",
    ),
    "per-document padding 0": (
        lambda: gh.pack_documents([[1]], pad_documents_to_multiple_of=0),
        r"pad_documents_to_multiple_of: .*got 0",
    ),
    "per-document padding over the limit": (
        lambda: gh.pack_documents([[1]] * 4, pad_documents_to_multiple_of=MAX_TOKENS),
        r"67108864 tokens with padding, over the limit",
    ),
    "pad_token_id -1": (lambda: gh.pack_documents([[1]], pad_token_id=-1), r"pad_token_id: .*got -1"),
    "pad_token_id 0.5": (lambda: gh.pack_documents([[1]], pad_token_id=0.5), r"pad_token_id: .*got 0\.5"),
    # causal and flags
    "causal 'no'": (lambda: gh.pack_documents([[1]], causal="no"), r"causal: expected None, True or False, got 'no'"),
    "causal 0": (lambda: gh.pack_tree([(-1, [1])], causal=0), r"causal: expected None, True or False, got 0"),
    "return_labels 'yes'": (lambda: gh.pack_documents([[1]], return_labels="yes"), r"return_labels: expected True or"),
    "return_flash_kwargs 1": (
        lambda: gh.pack_documents([[1]], return_flash_kwargs=1),
        r"return_flash_kwargs: expected",
    ),
    "return_seq_idx None": (lambda: gh.pack_tree([(-1, [1])], return_seq_idx=None), r"return_seq_idx: expected True"),
    # trees
    "a parent 1.7": (lambda: gh.pack_tree([(-1, [1]), (1.7, [2])]), r"segments\[1\]: parent must be an integer .*1\.7"),
    "a parent '0'": (lambda: gh.pack_tree([(-1, [1]), ("0", [2])]), r"segments\[1\]: parent must be an integer .*'0'"),
    "a parent None": (lambda: gh.pack_tree([(-1, [1]), (None, [2])]), r"segments\[1\]: parent must be .*None"),
    "a parent True": (lambda: gh.pack_tree([(-1, [1]), (True, [2])]), r"segments\[1\]: parent must be .*True"),
    "a parent ahead": (
        lambda: gh.pack_tree([(-1, [1]), (1, [2])]),
        r"segments\[1\]: parent 1 must be -1 or an earlier",
    ),
    "a parent -2": (lambda: gh.pack_tree([(-2, [1])]), r"segments\[0\]: parent -2 must be -1"),
    "a segment not a pair": (
        lambda: gh.pack_tree([(-1, [1]), [2]]),
        r"segments\[1\]: expected \(parent_index, tokens\)",
    ),
    "an empty segment": (lambda: gh.pack_tree([(-1, [1]), (0, [])]), r"segments\[1\]: empty segment"),
    "a negative id in a tree": (lambda: gh.pack_tree([(-1, [1]), (0, [2, -5])]), r"segments\[1\] tokens\[1\]: token"),
    "a 2^40-token tree segment": (lambda: gh.pack_tree([(-1, _huge_view())]), rf"segments\[0\] tokens: {HUGE} tokens"),
    "segments a tensor": (lambda: gh.pack_tree(torch.tensor([1, 2])), r"segments: expected a list of \(parent_index"),
    "no segments": (lambda: gh.pack_tree([]), r"segments: no segments"),
    # the collator
    "a None row": (lambda: gh.PackingCollator()([{"input_ids": [1]}, None]), r"rows\[1\]: expected a dict of columns"),
    "a list row": (lambda: gh.PackingCollator()([[1, 2]]), r"rows\[0\]: expected a dict of columns, got list"),
    "rows a dict": (lambda: gh.PackingCollator()({"input_ids": [[1]]}), r"rows: expected a list of dataset rows"),
    "no rows": (lambda: gh.PackingCollator()([]), r"rows: no rows"),
    "a missing column": (lambda: gh.PackingCollator()([{"ids": [1]}]), r"rows\[0\]: no 'input_ids' column"),
    "a None input_ids": (lambda: gh.PackingCollator()([{"input_ids": None}]), r"rows\[0\]\['input_ids'\]: expected"),
    "a negative id in a row": (
        lambda: gh.PackingCollator()([{"input_ids": [1]}, {"input_ids": [2, -7]}]),
        r"rows\[1\]\['input_ids'\]\[1\]: token id -7 is negative",
    ),
    "a 2^40-token row": (
        lambda: gh.PackingCollator()([{"input_ids": _huge_view()}]),
        rf"\['input_ids'\]: {HUGE} tokens",
    ),
    "labels shorter than the row": (
        lambda: gh.PackingCollator()([{"input_ids": [1, 2], "labels": [1]}]),
        r"rows\[0\]\['labels'\]: 1 values for 2 tokens",
    ),
    "a label -5": (
        lambda: gh.PackingCollator()([{"input_ids": [1, 2], "labels": [1, -5]}]),
        r"rows\[0\]\['labels'\]\[1\]: label -5 is negative \(expected >= 0 or -100",
    ),
    "labels on some rows only": (
        lambda: gh.PackingCollator()([{"input_ids": [1], "labels": [1]}, {"input_ids": [2]}]),
        r"rows\[1\]: no 'labels' column, unlike rows\[0\]",
    ),
    "a completion_mask of 2": (
        lambda: gh.PackingCollator()([{"input_ids": [1, 2], "completion_mask": [0, 2]}]),
        r"rows\[0\]\['completion_mask'\]\[1\]: expected 0 or 1, got 2",
    ),
    "seq_lengths that do not sum": (
        lambda: gh.PackingCollator()([{"input_ids": [1, 2, 3], "seq_lengths": [1, 1]}]),
        r"rows\[0\]\['seq_lengths'\]: expected positive lengths summing to the row's 3 tokens",
    ),
    "a padded row": (
        lambda: gh.PackingCollator()([{"input_ids": [1, 2, 0], "attention_mask": [1, 1, 0]}]),
        r"rows\[0\]\['attention_mask'\]: the row holds padding",
    ),
    "a row too long": (
        lambda: gh.PackingCollator(max_length=2)([{"input_ids": [1]}, {"input_ids": [1, 2, 3]}]),
        r"rows\[1\]\['input_ids'\]: 3 tokens do not fit max_length=2",
    ),
    "collator max_length nan": (lambda: gh.PackingCollator(max_length=float("nan")), r"max_length: .*got nan"),
    "collator causal 'no'": (lambda: gh.PackingCollator(causal="no"), r"causal: expected None, True or False"),
    "collator input_key 5": (lambda: gh.PackingCollator(input_key=5), r"input_key: expected a column name"),
    "collator pad_to_multiple_of -4": (lambda: gh.PackingCollator(pad_to_multiple_of=-4), r"pad_to_multiple_of: .*-4"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_input_is_refused_in_one_line_naming_the_argument(case):
    call, message = CASES[case]
    with pytest.raises(ValueError, match=message) as error:
        call()
    assert "\n" not in str(error.value)


def test_what_is_accepted_is_what_was_meant():
    ids = [3, 4, 5]
    expected = gh.pack_documents([ids])["input_ids"]
    for form in (tuple(ids), np.array(ids, np.int32), np.array(ids, np.uint8), torch.tensor(ids), range(3, 6)):
        assert torch.equal(gh.pack_documents([form])["input_ids"], expected)
    assert torch.equal(gh.pack_documents([[np.int64(3), 4, 5]])["input_ids"], expected)
    assert gh.pack_documents([[1]], max_length=np.int64(4))["input_ids"].tolist() == [[1]]
    assert gh.pack_tree([(np.int64(-1), [1]), (np.int32(0), [2])])["position_ids"].tolist() == [[0, 1]]
    labels = gh.PackingCollator()([{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}])["labels"]
    assert labels.tolist() == [[-100, 2, 3]]
