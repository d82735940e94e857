"""Plain text: paragraphs, spaCy sentences, candidate mentions."""

from __future__ import annotations

import re

import pytest
import spacy
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn.errors import IngestError
from graphattn.ingest.text import default_nlp, link_mentions, paragraph_spans, sentence_spans, text_to_graph

TEXT = "Dr. Smith lives in New York City. He likes new york!\n\n  \t\nSecond paragraph here? Yes.\n\n\n"


def test_paragraphs_and_sentences():
    graph = text_to_graph(TEXT, doc_id="t")
    assert graph.span_text("doc") == TEXT.strip()
    assert [graph.span_text(p.id) for p in graph.nodes_of_type("paragraph")] == [
        "Dr. Smith lives in New York City. He likes new york!",
        "Second paragraph here? Yes.",
    ]
    assert [(s.id, graph.span_text(s.id)) for s in graph.nodes_of_type("sentence")] == [
        ("p0.s0", "Dr. Smith lives in New York City."),
        ("p0.s1", "He likes new york!"),
        ("p1.s0", "Second paragraph here?"),
        ("p1.s1", "Yes."),
    ]
    contains = {(e.src, e.dst) for e in graph.edges_of("contains")}
    assert contains == {
        ("doc", "p0"),
        ("doc", "p1"),
        ("p0", "p0.s0"),
        ("p0", "p0.s1"),
        ("p1", "p1.s0"),
        ("p1", "p1.s1"),
    }


def test_mentions_are_case_insensitive_token_aligned_and_longest_first():
    graph = text_to_graph(
        TEXT + " Newyorkers and new yorkers? İstanbul.",
        candidates=["dr. smith", "New York", "new york city", "istanbul", "absent"],
    )
    mentions = [(graph.span_text(m.id), m.attrs["candidate"]) for m in graph.nodes_of_type("mention")]
    # "New York City" is one mention of the longer candidate, not also one of "New York";
    # "Newyorkers"/"new yorkers" are not token-aligned matches.
    assert mentions == [("Dr. Smith", "c0"), ("New York City", "c2"), ("new york", "c1"), ("İstanbul", "c3")]
    assert {(e.src, e.dst) for e in graph.edges_of("mention_of")} == {
        ("m0", "c0"),
        ("m1", "c2"),
        ("m2", "c1"),
        ("m3", "c3"),
    }
    assert graph.node("c4").span is None and graph.node("c4").attrs["text"] == "absent"


def test_user_pipeline_is_used_as_given():
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer", config={"punct_chars": ["|"]})
    graph = text_to_graph("one. two | three. four", nlp=nlp)
    assert [graph.span_text(s.id) for s in graph.nodes_of_type("sentence")] == ["one. two |", "three. four"]


def test_paragraphs_longer_than_max_length_are_cut_at_whitespace():
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.max_length = 40
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi"
    spans = sentence_spans(text, 0, len(text), nlp)
    assert all(e - s <= 40 for s, e in spans)
    assert " ".join(text[s:e] for s, e in spans) == text


def test_empty_text_is_an_error():
    with pytest.raises(IngestError, match="empty document"):
        text_to_graph(" \n\n ", source="blank.txt")
    with pytest.raises(IngestError, match="candidate 1 must be a non-empty string"):
        text_to_graph("a b", candidates=["a", " "])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="ab .!\n", min_size=0, max_size=30), min_size=1, max_size=6))
def test_spans_tile_the_text_without_whitespace_edges(blocks):
    text = "\n\n".join(blocks)
    paragraphs = paragraph_spans(text)
    for start, end in paragraphs:
        assert end > start and not text[start].isspace() and not text[end - 1].isspace()
        assert re.search(r"\n[ \t]*\n", text[start:end]) is None  # no blank line inside a paragraph
        sentences = sentence_spans(text, start, end, default_nlp())
        assert all(start <= s < e <= end for s, e in sentences)
        assert "".join(text[s:e] for s, e in sentences).replace(" ", "").replace("\n", "") == text[start:end].replace(
            " ", ""
        ).replace("\n", "")
    assert "".join(text[s:e] for s, e in paragraphs).replace(" ", "").replace("\n", "") == text.replace(
        " ", ""
    ).replace("\n", "")


def test_link_mentions_inside_regions_only():
    graph = text_to_graph("Paris is nice.\n\nI like Paris.")
    graph.add_node("city", "candidate", None, text="paris")
    ids = link_mentions(graph, {"city": "paris"}, within=["p1"], prefix="x")
    assert ids == ["x0"] and graph.span_text("x0") == "Paris" and graph.node("x0").span[0] > graph.node("p1").span[0]
