"""Whole-word span decoding (graphattn.train.spans) on hand-spelled tokens and logits."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from graphattn.train.spans import (
    NgramScores,
    SpanScores,
    best_ngrams,
    best_spans,
    instance_keyphrases,
    instance_span,
    word_boundaries,
    word_edges,
)

NEG = torch.finfo(torch.float32).min


def instance(text: str, pieces: list[tuple[int, int]], doc: list[int] | None = None, texts: list[str] | None = None):
    """An EtcInstance's text side: [CLS] (no characters), then `pieces` as (start, end) offsets."""
    spans = np.array([(-1, -1), *pieces], dtype=np.int32)
    return SimpleNamespace(
        long_char_spans=spans,
        long_doc_index=np.array([0, *(doc or [0] * len(pieces))], dtype=np.int32),
        texts=texts or [text],
        long_length=len(spans),
    )


# "the method works": the, m, ##eth, ##od, works  (long positions 1..5 after [CLS] at 0)
METHOD = instance("the method works", [(0, 3), (4, 5), (5, 8), (8, 10), (11, 16)])


def logits(values: list[float]) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float32)


def span_scores(start: list[float], end: list[float], types=("null", "span", "yes", "no"), kind: int = 1) -> SpanScores:
    type_logits = torch.full((1, len(types)), -5.0)
    type_logits[0, kind] = 5.0
    s, e = logits(start), logits(end)
    return SpanScores(s, e, type_logits, s[:, 0] + e[:, 0], tuple(types), 30)


def test_word_edges_of_sub_word_pieces():
    can_start, can_end, doc = word_edges(METHOD)
    assert can_start.tolist() == [False, True, True, False, False, True]  # "m" starts "method"; "eth", "od" do not
    assert can_end.tolist() == [False, True, False, False, True, True]  # "od" ends it; "m", "eth" do not
    assert doc.tolist() == [-1] + [0] * 5  # one line; [CLS] is on none


def test_a_word_split_into_pieces_never_yields_eth():
    # the raw argmax is start = end = "##eth" (position 3): the whole-word decoder answers "method"
    start = [0.0, 0.0, 4.0, 9.0, 0.0, 0.0]
    end = [0.0, 0.0, 0.0, 9.0, 5.0, 0.0]
    answer = instance_span(span_scores(start, end), 0, METHOD, n_best=10)
    assert answer["text"] == "method" and (answer["char_start"], answer["char_end"]) == (4, 10)
    assert answer["score"] == pytest.approx(9.0) and answer["type"] == "span"
    texts = [a["text"] for a in answer["n_best"]]
    assert texts[0] == "method" and "eth" not in texts
    assert all(t in {"the", "method", "works"} or " " in t for t in texts)
    for a in answer["n_best"]:
        assert "the method works"[a["char_start"] : a["char_end"]] == a["text"]
    scores = [a["score"] for a in answer["n_best"]]
    assert scores == sorted(scores, reverse=True)
    assert len(answer["n_best"]) == 6  # the, method, works, the method, method works, the method works


def test_max_answer_length_counts_tokens():
    start = [0.0, 5.0, 0.0, 0.0, 0.0, 0.0]
    end = [0.0, 0.0, 0.0, 0.0, 0.0, 5.0]
    assert instance_span(span_scores(start, end), 0, METHOD)["text"] == "the method works"
    short = instance_span(span_scores(start, end), 0, METHOD, max_answer_length=4)
    assert short["text"] in {"the method", "the", "method works", "method", "works"}
    assert all(len(a["text"].split()) <= 2 for a in short["n_best"])  # 5 tokens no longer fit


def test_yes_no_and_null_types():
    start, end = [0.0, 3.0, 0.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0, 0.0, 0.0]
    yes = instance_span(span_scores(start, end, kind=2), 0, METHOD)
    assert (yes["type"], yes["text"], yes["char_start"], yes["char_end"]) == ("yes", "yes", -1, -1)
    assert yes["n_best"][0]["text"] == "the"  # the spans stay available
    null = instance_span(span_scores(start, end, kind=0), 0, METHOD)
    assert (null["type"], null["text"]) == ("null", "")
    assert null["margin"] == pytest.approx(6.0 - 0.0)


def test_punctuation_quotes_and_cjk():
    text = "set the 'cmdheight' option. 東京"
    edges = word_boundaries(text)
    assert edges[0] and edges[3] and edges[8] and edges[9] and not edges[12] and edges[18] and edges[19]
    assert edges[len(text)] and edges[len(text) - 1] and edges[len(text) - 2]  # each ideograph is a word
    # 'cmdh + eight': the piece "cmdh" (9, 13) may start a word but not end one
    inst = instance(text, [(0, 3), (4, 7), (8, 9), (9, 13), (13, 18), (18, 19)])
    start = [0.0, 0.0, 0.0, 8.0, 0.0, 0.0, 0.0]
    end = [0.0, 0.0, 0.0, 0.0, 9.0, 0.0, 1.0]
    answer = instance_span(span_scores(start, end), 0, inst)
    assert answer["text"] == "'cmdheight'" and text[answer["char_start"] : answer["char_end"]] == "'cmdheight'"


def test_accents_and_underscores_belong_to_their_word():
    text = "cafe\u0301 snake_case"
    edges = word_boundaries(text)
    assert not edges[4] and edges[5] and not edges[11] and not edges[12] and edges[len(text)]


def test_a_span_never_crosses_packed_documents():
    inst = instance("", [(0, 1), (2, 3), (0, 1)], doc=[0, 0, 1], texts=["a b", "c"])
    start = [0.0, 9.0, 0.0, 0.0]
    end = [0.0, 0.0, 0.0, 9.0]
    answer = instance_span(span_scores(start, end), 0, inst, n_best=10)
    assert answer["text"] != "" and all(a["text"] in {"a", "b", "a b", "c"} for a in answer["n_best"])


def test_a_span_never_runs_into_the_next_line():
    text = "Thames Barrier\nThe barrier"
    inst = instance(text, [(0, 6), (7, 14), (15, 18), (19, 26)])
    start = [0.0, 9.0, 0.0, 0.0, 0.0]
    end = [0.0, 0.0, 0.0, 0.0, 9.0]  # the raw best runs from the title into the sentence
    answer = instance_span(span_scores(start, end), 0, inst, n_best=20)
    assert "\n" not in "".join(a["text"] for a in answer["n_best"])
    assert {a["text"] for a in answer["n_best"]} == {
        "Thames",
        "Barrier",
        "Thames Barrier",
        "The",
        "barrier",
        "The barrier",
    }


def test_best_spans_is_batched_and_pads_with_minus_infinity():
    can_start = torch.tensor([[False, True, True], [False, True, False]])
    can_end = torch.tensor([[False, True, True], [False, True, False]])
    doc = torch.zeros(2, 3, dtype=torch.long)
    start = torch.tensor([[NEG, 1.0, 2.0], [NEG, 1.0, 7.0]])
    end = torch.tensor([[NEG, 1.0, 3.0], [NEG, 2.0, 7.0]])
    starts, ends, scores = best_spans(start, end, can_start, can_end, doc, max_answer_length=2, n_best=3)
    assert starts[0].tolist() == [2, 1, 1] and ends[0].tolist() == [2, 2, 1]
    assert scores[0].tolist() == [5.0, 4.0, 2.0]
    assert (starts[1, 0], ends[1, 0], float(scores[1, 0])) == (1, 1, 3.0)
    assert torch.isinf(scores[1, 1:]).all()  # the second row has one whole-word span
    with pytest.raises(ValueError, match="at least 1"):
        best_spans(start, end, can_start, can_end, doc, n_best=0)


def test_keyphrase_ngrams_are_whole_words():
    # n-gram scores [1, N=3, L=6]: the best raw n-grams are "eth" (1-gram at 3) and "m eth" (2-gram at 2)
    scores = torch.zeros(1, 3, 6)
    scores[0, 0, 3] = 9.0
    scores[0, 1, 2] = 8.0
    scores[0, 2, 2] = 7.0  # "m eth od" = "method"
    scores[0, 0, 5] = 6.0  # "works"
    phrases = instance_keyphrases(NgramScores(scores), 0, METHOD, top_k=3)
    assert [p["text"] for p in phrases[:2]] == ["method", "works"]
    assert all(p["text"] in {"the", "method", "works", "the method", "method works"} for p in phrases)
    can_start, can_end, doc = (torch.from_numpy(a)[None] for a in word_edges(METHOD))
    starts, lengths, best = best_ngrams(scores, can_start, can_end, doc, top_k=2)
    assert starts[0].tolist() == [2, 5] and lengths[0].tolist() == [3, 1] and best[0].tolist() == [7.0, 6.0]
