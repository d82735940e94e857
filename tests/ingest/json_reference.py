"""The JSON readers as they were first written: one `add_node` / `add_child` call per node.

Kept as the test reference for the bulk readers (`graphattn.ingest.json`, `graphattn.ingest.mapping`),
which assemble node and edge columns and build each graph in one call: both must give the same
graph, the same LabelWarnings and the same errors. Not used by the package.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from graphattn.graph import DocGraph
from graphattn.ingest.mapping import Spec, _apply, _Build, load_mapping
from graphattn.ingest.nq import _candidate_kind, _nq_annotations, _NqAnnotation, _TokenTable
from graphattn.ingest.records import Record
from graphattn.ingest.records import doc_id_of as _doc_id


class _Text:
    """Builds a document text piece by piece and hands back each piece's span."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0

    def add(self, piece: str, separator: str = "") -> tuple[int, int]:
        if self.length and separator:
            self.parts.append(separator)
            self.length += len(separator)
        start = self.length
        self.parts.append(piece)
        self.length += len(piece)
        return start, self.length

    def text(self) -> str:
        return "".join(self.parts)


# -- HotpotQA --------------------------------------------------------------------------------
def reference_hotpotqa_graph(record: Record | Any) -> DocGraph:
    """HotpotQA, node by node."""
    record = record if isinstance(record, Record) else Record(record)
    question = record.get("question", expect=str).strip()
    if not question:
        raise record.error("question is empty", "question")
    context = record.get("context", expect=list)
    text = _Text()
    question_span = text.add(question)
    paragraphs = []  # (title, title span, [(sentence index, span)])
    for i in range(len(context)):
        title = record.get("context", i, 0, expect=str).strip()
        sentences = record.items("context", i, 1, expect=str)
        title_span = text.add(title, "\n\n")
        spans, separator = [], "\n"
        for j, sentence in enumerate(sentences):
            sentence = sentence.strip()
            if sentence:
                spans.append((j, text.add(sentence, separator)))
                separator = " "
        paragraphs.append((title, title_span, spans))

    facts = record.items("supporting_facts", expect=list) if "supporting_facts" in record.data else []
    supporting: set[tuple[str, int]] = set()
    for k in range(len(facts)):
        supporting.add(
            (record.get("supporting_facts", k, 0, expect=str).strip(), record.get("supporting_facts", k, 1, expect=int))
        )

    graph = DocGraph(text.text(), doc_id=_doc_id(record, "_id"), source=record.file)
    answer = record.get("answer", expect=str, default=None)
    question_node = graph.add_node(
        "q",
        "question",
        question_span,
        answer=answer,
        question_type=record.get("type", expect=str, default=None),
        level=record.get("level", expect=str, default=None),
    )
    matched: set[tuple[str, int]] = set()
    for i, (title, title_span, spans) in enumerate(paragraphs):
        sentence_support = [(title, j) in supporting for j, _ in spans]
        matched.update((title, j) for (j, _), s in zip(spans, sentence_support) if s)
        end = spans[-1][1][1] if spans else title_span[1]
        pid = f"p{i}"
        labelled = "supporting_facts" in record.data  # without it no node says supporting
        said = {"supporting": any(sentence_support)} if labelled else {}
        graph.add_node(pid, "paragraph", (title_span[0], end), title=title, index=i, **said)
        graph.add_child(pid, f"{pid}.title", "title", title_span, **said)
        for (j, span), is_support in zip(spans, sentence_support):
            graph.add_child(
                pid, f"{pid}.s{j}", "sentence", span, index=j, **({"supporting": is_support} if labelled else {})
            )
    question_node.attrs["unmatched_supporting_facts"] = sorted(supporting - matched)
    _warn_unmatched_facts(record, facts, paragraphs, matched)
    if answer is not None:
        _add_hotpotqa_answer(record, graph, answer.strip(), paragraphs, matched)
    return graph


def _warn_unmatched_facts(record: Record, facts: list, paragraphs: list, matched: set) -> None:
    """One LabelWarning per supporting fact that names no paragraph, or no sentence of it."""
    counts: dict[str, int] = {}  # title -> sentences in the record (empty ones too), first paragraph of that title
    for i, (title, _, _) in enumerate(paragraphs):
        counts.setdefault(title, len(record.get("context", i, 1)))
    for k in range(len(facts)):
        title, index = facts[k][0].strip(), facts[k][1]
        if (title, index) in matched:
            continue
        if title not in counts:
            message = f"supporting fact names title {title!r}, which no paragraph of the context has"
            record.warn("supporting_facts", message, "supporting_facts", k, 0)
        elif not 0 <= index < counts[title]:
            message = f"sentence index {index} is out of range: paragraph {title!r} has {counts[title]} sentence(s)"
            record.warn("supporting_facts", message, "supporting_facts", k, 1)
        else:
            message = f"sentence {index} of paragraph {title!r} is empty"
            record.warn("supporting_facts", message, "supporting_facts", k, 1)


def _whole_word(text: str, start: int, end: int) -> bool:
    """No letter or digit joins the answer at [start, end) where the answer's own edge is one."""
    left = not text[start].isalnum() or start == 0 or not text[start - 1].isalnum()
    right = not text[end - 1].isalnum() or end == len(text) or not text[end].isalnum()
    return left and right


def _add_hotpotqa_answer(record: Record, graph: DocGraph, answer: str, paragraphs: list, matched: set) -> None:
    """The `answer` node: yes / no without a span, else the answer string's first whole-word
    occurrence (supporting sentences, then sentences, then titles; exact case, then folded)."""
    if answer.lower() in ("yes", "no"):
        graph.add_node("answer", "answer", None, answer_type=answer.lower(), text=answer)
        return
    supporting = [
        (f"p{i}.s{j}", span)
        for i, (title, _, spans) in enumerate(paragraphs)
        for j, span in spans
        if (title, j) in matched
    ]
    sentences = [(f"p{i}.s{j}", span) for i, (_, _, spans) in enumerate(paragraphs) for j, span in spans]
    others = sentences + [(f"p{i}.title", title_span) for i, (_, title_span, _) in enumerate(paragraphs)]
    for fold in (False, True):
        needle = answer.lower() if fold else answer

        def hits(nodes):
            for node, (start, end) in nodes:
                piece = graph.text[start:end]
                if fold and len(piece.lower()) != len(piece):
                    continue  # lowering changed the length: its offsets would not be the text's
                for found in (
                    re.finditer(f"(?={re.escape(needle)})", piece.lower() if fold else piece) if needle else ()
                ):
                    at = start + found.start()
                    if _whole_word(graph.text, at, at + len(answer)):
                        yield node, at

        first = next(hits(supporting + others), None)
        if first is not None:
            node, at = first
            count = sum(1 for _ in hits(others))
            span = (at, at + len(answer))
            graph.add_node("answer", "answer", span, answer_type="span", text=answer, found_in=node, occurrences=count)
            return
    if answer and any(answer.lower() in graph.text[a:b].lower() for _, (a, b) in others):
        message = f"answer {answer!r} occurs in the context only inside longer words, never as a whole word"
    else:
        message = f"answer {answer!r} is not in any paragraph of the context"
    record.warn("answer", message, "answer")


# -- WikiHop
def reference_wikihop_graph(record: Record | Any, *, nlp=None) -> DocGraph:
    """WikiHop, node by node."""
    from graphattn.ingest import text as text_ingest  # spaCy loads only for the format that needs it

    record = record if isinstance(record, Record) else Record(record)
    query = record.get("query", expect=str).strip()
    candidates = [c.strip() for c in record.items("candidates", expect=str)]
    supports = [s.strip() for s in record.items("supports", expect=str)]
    answer = record.get("answer", expect=str, default=None)
    if not query:
        raise record.error("query is empty", "query")
    for i, candidate in enumerate(candidates):
        if not candidate:
            raise record.error("candidate is empty", "candidates", i)
    lowered = [c.lower() for c in candidates]
    wanted = answer.strip().lower() if answer is not None else None
    if wanted is not None and wanted not in lowered:
        record.warn("answer", f"answer {answer!r} is not one of the {len(candidates)} candidates", "answer")

    text = _Text()
    candidate_spans = [text.add(c, "\n") for c in candidates]
    query_span = text.add(query, "\n")
    document_spans = [(i, text.add(s, "\n\n")) for i, s in enumerate(supports) if s]

    graph = DocGraph(text.text(), doc_id=_doc_id(record, "id"), source=record.file)
    answer_index = lowered.index(wanted) if wanted in lowered else -1
    for i, (candidate, span) in enumerate(zip(candidates, candidate_spans)):
        graph.add_node(f"c{i}", "candidate", span, text=candidate, index=i, is_answer=i == answer_index)
    graph.add_node("q", "query", query_span, answer=answer)
    documents = []
    for i, span in document_spans:
        graph.add_node(f"d{i}", "document", span, index=i)
        documents.append(f"d{i}")
    text_ingest.add_sentences(graph, documents, nlp=nlp)
    text_ingest.link_mentions(graph, {f"c{i}": c for i, c in enumerate(candidates)}, within=documents, nlp=nlp)
    return graph


# -- NQ simplified
def reference_nq_graph(record: Record | Any, *, keep_html_tokens: bool = False) -> DocGraph:
    """NQ simplified, node by node."""
    record = record if isinstance(record, Record) else Record(record)
    question = record.get("question_text", expect=str).strip()
    document = record.get("document_text", expect=str)
    if not question:
        raise record.error("question_text is empty", "question_text")
    raw_candidates = record.items("long_answer_candidates", expect=dict)
    bounds = np.array(
        [
            [
                record.get("long_answer_candidates", i, "start_token", expect=int),
                record.get("long_answer_candidates", i, "end_token", expect=int),
            ]
            for i in range(len(raw_candidates))
        ],
        dtype=np.int64,
    ).reshape(-1, 2)

    tokens = _TokenTable(document, keep_html_tokens)
    bad = np.flatnonzero((bounds[:, 0] < 0) | (bounds[:, 1] > tokens.count) | (bounds[:, 0] >= bounds[:, 1]))
    if bad.size:
        i = int(bad[0])
        raise record.error(
            f"token range [{bounds[i, 0]}, {bounds[i, 1]}) is empty or outside the document's {tokens.count} tokens",
            "long_answer_candidates",
            i,
        )
    offset = len(question) + 1
    text = question + "\n" + tokens.text
    graph = DocGraph(text, doc_id=_doc_id(record, "example_id"), source=record.file)

    annotations = _nq_annotations(record, len(raw_candidates), tokens.count)
    has_long_answer = sum(a.long >= 0 for a in annotations) >= min(2, len(annotations)) and len(annotations) > 0
    long_answers = {a.long for a in annotations if a.long >= 0} if has_long_answer else set()
    short = [(a.index, k, first, stop) for a in annotations for k, first, stop in a.short]
    short_spans = tokens.char_spans(np.array([s[2:] for s in short], dtype=np.int64).reshape(-1, 2)) + offset
    for (a, k, _, _), (start, end) in zip(short, short_spans):
        if end <= start:
            message = "short answer covers no text (only HTML tag tokens)"
            record.warn("short_answers", message, "annotations", a, "short_answers", k)
    yes_no = next((a.yes_no for a in annotations if a.yes_no != "NONE"), "NONE")
    with_text = [tuple(map(int, s)) for s in short_spans if s[1] > s[0]]
    graph.add_node("q", "question", (0, len(question)), short_answers=with_text, yes_no_answer=yes_no)
    graph.add_node(
        "doc",
        "document",
        (offset, len(text)) if tokens.text else (offset, offset),
        url=record.get("document_url", expect=str, default=None),
    )

    spans = tokens.char_spans(bounds) + offset
    first_tags = [tokens.first_token(int(s)).lower() for s in bounds[:, 0]]
    open_parents: list[tuple[int, str]] = []  # enclosing candidates: (end char, node id)
    for i in np.lexsort((-spans[:, 1], spans[:, 0])):  # by start, longest first: parents first
        start, end = (int(x) for x in spans[i])
        if end <= start:
            continue
        while open_parents and open_parents[-1][0] < end:
            open_parents.pop()
        parent = open_parents[-1][1] if open_parents else "doc"
        node_id = f"c{i}"
        graph.add_child(
            parent,
            node_id,
            "candidate",
            (start, end),
            kind=_candidate_kind(first_tags[i]),
            top_level=bool(record.get("long_answer_candidates", int(i), "top_level", expect=bool, default=True)),
            index=int(i),
            **({"is_long_answer": int(i) in long_answers} if "annotations" in record.data else {}),
        )
        open_parents.append((end, node_id))
    if "annotations" in record.data:  # without: unlabelled
        _add_nq_answer(graph, annotations, spans, short_spans, has_long_answer)
    return graph


def _add_nq_answer(
    graph: DocGraph,
    annotations: list[_NqAnnotation],
    candidate_spans: np.ndarray,
    short_spans: np.ndarray,
    has_long_answer: bool,
) -> None:
    """BERT-joint's target as an `answer` node: short span; yes/no or long with the long answer's span; null."""
    with_text = [tuple(map(int, s)) for s in short_spans if s[1] > s[0]]
    long = next((a.long for a in annotations if a.long >= 0), -1) if has_long_answer else -1
    long_span = tuple(map(int, candidate_spans[long])) if long >= 0 else None
    long_span = long_span if long_span is not None and long_span[1] > long_span[0] else None
    yes_no = next((a.yes_no.lower() for a in annotations if a.yes_no in ("YES", "NO")), None)
    if with_text:
        graph.add_node("answer", "answer", with_text[0], answer_type="short")
    elif yes_no is not None and long_span is not None:
        graph.add_node("answer", "answer", long_span, answer_type=yes_no)
    elif long_span is not None:
        graph.add_node("answer", "answer", long_span, answer_type="long")
    else:
        graph.add_node("answer", "answer", None, answer_type="null")


# -- mapping-driven
def reference_json_graph(record: Record | Any, mapping: Mapping | str | os.PathLike | Spec) -> DocGraph:
    """The mapping-driven reader, node by node."""
    record = record if isinstance(record, Record) else Record(record)
    spec = load_mapping(mapping)
    build = _Build(record)
    doc_id = record.get(spec.id, expect=(str, int)) if spec.id else None
    top = Spec(fields=spec.fields, each=spec.each, separator=spec.separator, attrs=spec.attrs, links=spec.links)
    _apply(build, top, record.data, (), parent="doc" if spec.root else None)
    graph = DocGraph("".join(build.parts), doc_id=None if doc_id is None else str(doc_id), source=record.file)
    if spec.root:
        graph.add_node("doc", spec.root, (0, len(graph.text)))
    for node_id, node_type, span, attrs, parent, relation in build.nodes:
        graph.add_node(node_id, node_type, span, **attrs)
        if parent is not None and relation is not None:
            graph.add_edge(parent, relation, node_id)
    for src, relation, target, path in build.links:
        targets = target if isinstance(target, list) else [target]
        for i, dst in enumerate(targets):
            where = path if not isinstance(target, list) else (*path, i)
            if not isinstance(dst, (str, int)) or isinstance(dst, bool):
                raise record.error(f"a link must name a node id (string or integer), got {dst!r}", *where)
            if str(dst) not in graph.nodes:
                raise record.error(f"link to node id {str(dst)!r}, which this record does not define", *where)
            graph.add_edge(src, relation, str(dst))
    return graph
