"""JSON records -> DocGraphs: HotpotQA, WikiHop and Natural Questions (simplified) adapters.

Files: a JSON array of records, one JSON object, or JSON lines (``.jsonl``/``.ndjson``, or any
file whose first line is a complete object); ``.gz`` is read transparently (`graphattn.ingest.records`).
A record that is not what its format expects raises `IngestError` naming the file, the line (JSON
lines) or the record index (arrays: ``$[3]``), and the key path inside the record
(``$[3].context[2][1][0]``).
Other JSON layouts go through the generic, mapping-driven reader in `graphattn.ingest.mapping`.

Node conventions per format (the schemas in ``schemas/`` depend on them):

HotpotQA (``question``, ``context`` = [[title, [sentence, ...]], ...], ``supporting_facts`` =
[[title, sentence index], ...], ``answer``). Text: the question, then each paragraph as its title,
a newline and its sentences joined by spaces; blocks separated by blank lines. Nodes: ``q``
(question; attrs answer, question_type, level), ``p<i>`` (paragraph: title through last sentence;
attrs title, index, supporting), ``p<i>.title`` (title; supporting), ``p<i>.s<j>`` (sentence;
index = position in the record, supporting), ``answer`` (attr answer_type: ``span`` with the
span of the answer string's first occurrence, in a supporting sentence if it has one, else in
any sentence or title, exact case first; ``yes`` / ``no`` without a span). ``contains``:
paragraph -> title, paragraph -> sentence. Empty sentences are left out (their index is
skipped). Labels that match nothing (a supporting fact naming no paragraph or sentence, which the
dataset has a few of; an answer string in no paragraph) are `LabelWarning`s, and the facts are
also kept in the question's ``unmatched_supporting_facts``.

WikiHop (``query``, ``supports`` = [document, ...], ``candidates``, ``answer``). Text, in ETC's
long order: the candidates (one per line), the query, then the documents separated by blank
lines. Nodes: ``c<i>`` (candidate; text, index, is_answer; an answer that is no candidate is a
`LabelWarning` and leaves every is_answer false), ``q`` (query; answer),
``d<i>`` (document; index), ``d<i>.s<j>`` (sentence, spaCy), ``m<k>`` (mention of a candidate
inside a document, found case-insensitively by `text.link_mentions`; ``mention_of`` edge ->
candidate). ``contains``: document -> sentence.

Natural Questions simplified (``question_text``, ``document_text`` = space-separated tokens with
HTML tags as tokens, ``long_answer_candidates`` = [{start_token, end_token, top_level}],
``annotations``). Text: the question, a newline, then the document tokens joined by single spaces
— HTML tag tokens left out unless ``keep_html_tokens``. Token offsets become character spans
with numpy, no loop per token. Nodes: ``q`` (question; short_answers as char spans,
yes_no_answer), ``doc`` (document; url), ``c<i>`` (candidate; kind = paragraph | table | list |
other from its first tag, top_level, index, is_long_answer: an annotator chose it and, as in
nq_eval, at least two annotators (one, for records with a single annotation) gave a long answer),
``answer`` (BERT-joint's target, attr answer_type: ``short`` with the first short answer's span;
else ``yes`` / ``no`` with the long answer's span; else ``long`` with the long answer's span;
else ``null`` without a span). ``contains``: document -> top-level candidate -> candidates nested
inside it (innermost enclosing candidate). Candidates whose tokens are all tags have no text and
are left out (their index is skipped). A long answer that is no candidate, or a short answer
outside the document or without text, is a `LabelWarning`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

from graphattn.errors import IngestError, warn_label
from graphattn.graph import CONTAINS, DocGraph
from graphattn.graph_columns import MISSING
from graphattn.ingest.records import RecordRef, iter_records

__all__ = [
    "ADAPTERS",
    "Record",
    "RecordRef",
    "hotpotqa_graph",
    "iter_records",
    "nq_graph",
    "read_json",
    "wikihop_graph",
]

_MISSING = object()
_JSON_TYPES = {
    str: "a string",
    int: "an integer",
    list: "a list",
    dict: "an object",
    bool: "a boolean",
    float: "a number",
}


class Record:
    """Typed access into one record: every missing key or wrong type names file, line, path."""

    def __init__(self, data: Any, file: str | None = None, line: int | None = None, base_path: tuple = ()):
        self.data, self.file, self.line, self.base_path = data, file, line, tuple(base_path)

    @classmethod
    def of(cls, ref: RecordRef) -> Record:
        return cls(ref.data, ref.file, ref.line, ref.base_path)

    def error(self, message: str, *path: str | int) -> IngestError:
        return IngestError(message, file=self.file, line=self.line, path=(*self.base_path, *path))

    def warn(self, label: str, message: str, *path: str | int) -> None:
        """A `LabelWarning`: the record's label `label` at `path` matches nothing."""
        warn_label(message, label, file=self.file, line=self.line, path=(*self.base_path, *path))

    def get(self, *path: str | int, expect: type | tuple[type, ...] = object, default: Any = _MISSING) -> Any:
        """The value at `path`; `default` (if given) when the last key is absent."""
        value = self.data
        for depth, key in enumerate(path):
            where = path[:depth]
            if isinstance(key, int):
                if not isinstance(value, list):
                    raise self.error(f"expected a list, got {_json_type(value)}", *where)
                if key >= len(value):
                    raise self.error(f"expected at least {key + 1} item(s), got {len(value)}", *where)
                value = value[key]
            else:
                if not isinstance(value, dict):
                    raise self.error(f"expected an object, got {_json_type(value)}", *where)
                if key not in value:
                    if default is not _MISSING and depth == len(path) - 1:
                        return default
                    raise self.error(f"missing key {key!r}", *where)
                value = value[key]
        expected = expect if isinstance(expect, tuple) else (expect,)
        if expect is not object and (
            not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected)
        ):
            names = " or ".join(_JSON_TYPES.get(t, t.__name__) for t in expected)
            raise self.error(f"expected {names}, got {_json_type(value)} {_preview(value)}", *path)
        return value

    def items(self, *path: str | int, expect: type | tuple[type, ...] = object) -> list:
        """Check that `path` holds a list whose items are all of `expect`; return it."""
        values = self.get(*path, expect=list)
        for index in range(len(values)):
            self.get(*path, index, expect=expect)
        return values


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _preview(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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


def _doc_id(record: Record, key: str) -> str | None:
    value = record.get(key, expect=(str, int), default=None)
    return None if value is None else str(value)


# -- HotpotQA --------------------------------------------------------------------------------


def hotpotqa_graph(record: Record | Any) -> DocGraph:
    """One HotpotQA record -> DocGraph (see the module docstring for the conventions).

    The record is checked first; then its text, node rows (``q``, per paragraph ``p<i>``,
    ``p<i>.title`` and its sentences, ``answer`` last), attr columns and edges are assembled
    as lists and arrays, and the graph is built in one `DocGraph.from_columns` call.
    """
    record = record if isinstance(record, Record) else Record(record)
    question = record.get("question", expect=str).strip()
    if not question:
        raise record.error("question is empty", "question")
    titles, sentence_lists = _hotpotqa_context(record, record.get("context", expect=list))
    facts = _hotpotqa_facts(record) if "supporting_facts" in record.data else []
    doc_id = _doc_id(record, "_id")
    answer = record.get("answer", expect=str, default=None)
    question_type = record.get("type", expect=str, default=None)
    level = record.get("level", expect=str, default=None)

    rows = _HotpotRows(question, titles, sentence_lists, facts)
    _warn_unmatched_facts(record, facts, titles, [len(s) for s in sentence_lists], rows.matched_facts)
    found = _hotpotqa_answer(record, rows, answer.strip()) if answer is not None else None

    attrs = rows.attrs
    attrs["answer"][0], attrs["question_type"][0], attrs["level"][0] = answer, question_type, level
    attrs["unmatched_supporting_facts"][0] = sorted(set(facts) - rows.matched_facts)
    n = len(rows.ids)
    if found is not None:  # the row reserved for it
        answer_type, span = found
        rows.ids.append("answer")
        rows.types.append("answer")
        rows.spans[n] = span if span is not None else (-1, -1)
        for column in attrs.values():
            column.append(MISSING)
        attrs["answer_type"] = [*attrs["answer"][1:], answer_type]  # MISSING but in the last row
        attrs["text"] = [*attrs["answer"][1:], answer.strip()]
        n += 1
    return DocGraph.from_columns(
        rows.text,
        rows.ids,
        rows.types,
        rows.spans[:n],
        attrs,
        (rows.contains_src, CONTAINS, rows.contains_dst),
        doc_id=doc_id,
        source=record.file,
    )


def _hotpotqa_context(record: Record, context: list) -> tuple[list[str], list[list[str]]]:
    """(stripped titles, raw sentence lists) of ``context``; a paragraph that is not
    ``[title, [sentence, ...]]`` goes through `Record.get`, which names what is wrong where."""
    titles, sentence_lists = [], []
    for i, paragraph in enumerate(context):
        if not (
            type(paragraph) is list
            and len(paragraph) >= 2
            and type(paragraph[0]) is str
            and type(paragraph[1]) is list
            and all(type(s) is str for s in paragraph[1])
        ):
            paragraph = [record.get("context", i, 0, expect=str), record.items("context", i, 1, expect=str)]
        titles.append(paragraph[0].strip())
        sentence_lists.append(paragraph[1])
    return titles, sentence_lists


def _hotpotqa_facts(record: Record) -> list[tuple[str, int]]:
    """``supporting_facts`` as (stripped title, sentence index) pairs; a fact that is not
    ``[title, index]`` goes through `Record.get`, which names what is wrong where."""
    facts = record.get("supporting_facts", expect=list)
    if all(type(f) is list and len(f) >= 2 and type(f[0]) is str and type(f[1]) is int for f in facts):
        return [(f[0].strip(), f[1]) for f in facts]
    record.items("supporting_facts", expect=list)
    return [
        (record.get("supporting_facts", k, 0, expect=str).strip(), record.get("supporting_facts", k, 1, expect=int))
        for k in range(len(facts))
    ]


class _HotpotRows:
    """Text, node rows, attr columns and `contains` edges of a HotpotQA record.

    The text is the question, then per paragraph ``"\n\n" + title``, then ``"\n"`` and its
    non-empty sentences joined by ``" "``. Rows: ``q``, then per paragraph ``p<i>``,
    ``p<i>.title`` and its non-empty sentences; `types` and `spans` have one more row for the
    ``answer`` the caller may add. Columns are assembled a paragraph at a time (lists: a record
    has tens of nodes, too few for numpy to pay), spans with one running sum: each row advances
    the text by its separator and its own text (title: two newlines; sentence: one character;
    a paragraph: nothing, it has no text of its own), so a row ends at the sum so far and starts
    its own length earlier; a paragraph spans from its title's start to its last row's end.
    """

    def __init__(self, question: str, titles: list[str], sentence_lists: list[list[str]], facts: list[tuple]):
        supported, fact_titles = set(facts), {title for title, _ in facts}
        self.ids, self.types, own, advance = ["q"], ["question"], [len(question)], [len(question)]
        titled, indexes, supporting = [MISSING], [MISSING], [MISSING]
        paragraph_rows: list[int] = []
        self.sentence_rows: list[int] = []
        self.supporting_rows: list[int] = []  # of the sentences that a supporting fact names
        self.matched_facts: set[tuple[str, int]] = set()
        self.contains_src: list[int] = []
        self.contains_dst: list[int] = []
        blocks = []
        for i, (title, sentences) in enumerate(zip(titles, sentence_lists)):
            row = len(self.ids)
            stripped = [s.strip() for s in sentences]
            kept_index = [j for j, s in enumerate(stripped) if s]
            kept = [stripped[j] for j in kept_index] if len(kept_index) < len(stripped) else stripped
            support = [False] * len(kept)
            if title in fact_titles:
                support = [(title, j) in supported for j in kept_index]
                self.matched_facts.update((title, j) for j, s in zip(kept_index, support) if s)
                self.supporting_rows += [row + 2 + k for k, s in enumerate(support) if s]
            paragraph_rows.append(row)
            self.sentence_rows += range(row + 2, row + 2 + len(kept))
            self.contains_src += [row] * (1 + len(kept))
            self.contains_dst += range(row + 1, row + 2 + len(kept))
            self.ids += [f"p{i}", f"p{i}.title", *[f"p{i}.s{j}" for j in kept_index]]
            self.types += ["paragraph", "title", *["sentence"] * len(kept)]
            lengths = [*map(len, kept)]
            own += [0, len(title), *lengths]
            advance += [0, 2 + len(title), *[1 + length for length in lengths]]
            titled += [title, *[MISSING] * (1 + len(kept))]
            indexes += [i, MISSING, *kept_index]
            supporting += [any(support)] * 2 + support
            blocks.append("\n\n" + title + ("\n" + " ".join(kept) if kept else ""))
        self.text = question + "".join(blocks)
        ends = [*accumulate(advance), 0]
        starts = [end - length for end, length in zip(ends, own)] + [0]
        for row, end in zip(paragraph_rows, [*paragraph_rows[1:], len(self.ids)]):
            starts[row], ends[row] = starts[row + 1], ends[end - 1]
        self.spans = np.array([starts, ends], dtype=np.int64).T  # one row more, for the answer
        self.title_rows = [row + 1 for row in paragraph_rows]
        one_row = [MISSING] * len(self.ids)
        self.attrs = {  # in the order `add_node` calls would make the columns
            "answer": one_row,
            "question_type": list(one_row),
            "level": list(one_row),
            **({"title": titled, "index": indexes, "supporting": supporting} if titles else {}),
            "unmatched_supporting_facts": list(one_row),
        }


def _warn_unmatched_facts(
    record: Record, facts: list[tuple[str, int]], titles: list[str], sentence_counts: list[int], matched: set
) -> None:
    """One LabelWarning per supporting fact that names no paragraph, or no sentence of it."""
    counts: dict[str, int] = {}  # title -> sentences in the record (empty ones too), first paragraph of that title
    for title, count in zip(titles, sentence_counts):
        counts.setdefault(title, count)
    for k, (title, index) in enumerate(facts):
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


def _hotpotqa_answer(record: Record, rows: _HotpotRows, answer: str) -> tuple[str, tuple[int, int] | None] | None:
    """(answer_type, span) of the `answer` node: yes / no without a span, else the answer
    string's first occurrence inside one sentence or title (supporting sentences first, then
    every sentence, then the titles; exact case first); None, with a LabelWarning, if none."""
    if answer.lower() in ("yes", "no"):
        return answer.lower(), None
    spans = rows.spans.tolist()
    searched = [spans[row] for row in (*rows.supporting_rows, *rows.sentence_rows, *rows.title_rows)]
    text = rows.text
    for needle, haystack in ((answer, text), (answer.lower(), text.lower() if text.isascii() else None)):
        if not needle or (haystack is not None and needle not in haystack):
            continue
        for start, end in searched:
            if haystack is not None:  # the text itself, or its ASCII lower case: offsets are the text's
                at = haystack.find(needle, start, end)
            else:
                piece = text[start:end]
                if len(piece.lower()) != len(piece):
                    continue  # lowering changed the length: its offsets would not be the text's
                at = piece.lower().find(needle)
                at = at + start if at >= 0 else at
            if at >= 0:
                return "span", (at, at + len(answer))
    record.warn("answer", f"answer {answer!r} is not in any paragraph of the context", "answer")
    return None


# -- WikiHop ---------------------------------------------------------------------------------
def wikihop_graph(record: Record | Any, *, nlp=None) -> DocGraph:
    """One WikiHop record -> DocGraph, sentences and candidate mentions by spaCy (see module doc)."""
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


# -- Natural Questions (simplified) ----------------------------------------------------------
_LIST_TAGS = ("<ul>", "<ol>", "<dl>")


def nq_graph(record: Record | Any, *, keep_html_tokens: bool = False) -> DocGraph:
    """One NQ-simplified record -> DocGraph; token offsets map to char spans vectorized, and the
    graph is built in one `DocGraph.from_columns` call (rows: ``q``, ``doc``, the candidates
    parents first, ``answer``)."""
    record = record if isinstance(record, Record) else Record(record)
    question = record.get("question_text", expect=str).strip()
    document = record.get("document_text", expect=str)
    if not question:
        raise record.error("question_text is empty", "question_text")
    raw_candidates = record.get("long_answer_candidates", expect=list)
    bounds = _nq_candidate_bounds(record, raw_candidates)

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
    doc_id = _doc_id(record, "example_id")

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
    url = record.get("document_url", expect=str, default=None)

    spans = tokens.char_spans(bounds) + offset
    order = np.lexsort((-spans[:, 1], spans[:, 0]))  # by start, longest first: parents first
    order = order[spans[order, 1] > spans[order, 0]]  # candidates with text
    candidates = order.tolist()
    top_level = _nq_top_level(record, raw_candidates, candidates)
    parent_rows = _enclosing_rows(spans[order, 1].tolist(), first_row=2, outer_row=1)
    answer_type, answer_span = _nq_answer(annotations, spans, short_spans, has_long_answer)

    n = 3 + len(candidates)
    doc_span = (offset, len(text)) if tokens.text else (offset, offset)
    node_spans = np.concatenate([[(0, len(question)), doc_span], spans[order], [answer_span or (-1, -1)]])
    before, after = [MISSING] * (2 + len(candidates)), [MISSING]
    attrs = {  # in the order `add_node` calls would make the columns
        "short_answers": [with_text, *before[1:], *after],
        "yes_no_answer": [yes_no, *before[1:], *after],
        "url": [MISSING, url, *before[2:], *after],
    }
    if candidates:
        tags = [tokens.first_token(int(bounds[i, 0])).lower() for i in candidates]
        attrs["kind"] = [MISSING, MISSING, *map(_candidate_kind, tags), *after]
        attrs["top_level"] = [MISSING, MISSING, *top_level, *after]
        attrs["index"] = [MISSING, MISSING, *candidates, *after]
        attrs["is_long_answer"] = [MISSING, MISSING, *[i in long_answers for i in candidates], *after]
    attrs["answer_type"] = [*before, answer_type]
    return DocGraph.from_columns(
        text,
        ["q", "doc", *[f"c{i}" for i in candidates], "answer"],
        ["question", "document", *["candidate"] * len(candidates), "answer"],
        node_spans,
        attrs,
        (parent_rows, CONTAINS, range(2, n - 1)),
        doc_id=doc_id,
        source=record.file,
    )


def _nq_candidate_bounds(record: Record, candidates: list) -> np.ndarray:
    """[n, 2] token ranges of the long-answer candidates; a candidate that is not an object with
    integer ``start_token`` / ``end_token`` goes through `Record.get`, which names what is wrong."""
    if all(
        type(c) is dict and type(c.get("start_token")) is int and type(c.get("end_token")) is int for c in candidates
    ):
        return np.array([(c["start_token"], c["end_token"]) for c in candidates], dtype=np.int64).reshape(-1, 2)
    record.items("long_answer_candidates", expect=dict)
    return np.array(
        [
            [
                record.get("long_answer_candidates", i, "start_token", expect=int),
                record.get("long_answer_candidates", i, "end_token", expect=int),
            ]
            for i in range(len(candidates))
        ],
        dtype=np.int64,
    ).reshape(-1, 2)


def _nq_top_level(record: Record, raw_candidates: list, candidates: list[int]) -> list[bool]:
    """``top_level`` of each candidate (true where absent), checked in the order of `candidates`."""
    values = [raw_candidates[i].get("top_level", True) for i in candidates]
    if all(type(v) is bool for v in values):
        return values
    return [bool(record.get("long_answer_candidates", i, "top_level", expect=bool, default=True)) for i in candidates]


def _enclosing_rows(ends: list[int], first_row: int, outer_row: int) -> list[int]:
    """Row of the innermost enclosing interval of each interval (sorted by start, longest first,
    at rows `first_row`...): the latest earlier one that ends no sooner; `outer_row` if none."""
    parents, open_ends, open_rows = [], [], []
    for row, end in enumerate(ends, first_row):
        while open_ends and open_ends[-1] < end:
            open_ends.pop()
            open_rows.pop()
        parents.append(open_rows[-1] if open_rows else outer_row)
        open_ends.append(end)
        open_rows.append(row)
    return parents


@dataclass
class _NqAnnotation:
    index: int
    long: int  # long-answer candidate index, -1 for none
    short: list[tuple[int, int, int]]  # (index in short_answers, start, end): token ranges inside the document
    yes_no: str


def _nq_annotations(record: Record, n_candidates: int, n_tokens: int) -> list[_NqAnnotation]:
    """The annotations, with LabelWarnings for answers that point at no candidate or no tokens."""
    annotations = record.items("annotations", expect=dict) if "annotations" in record.data else []
    out = []
    for a in range(len(annotations)):
        long = -1
        if "long_answer" in annotations[a]:
            long = record.get("annotations", a, "long_answer", "candidate_index", expect=int, default=-1)
        if long >= n_candidates or long < -1:
            message = f"long answer candidate {long} is not among the {n_candidates} long-answer candidates"
            record.warn("long_answer", message, "annotations", a, "long_answer", "candidate_index")
            long = -1
        short = []
        for k in range(len(record.get("annotations", a, "short_answers", expect=list, default=[]))):
            first = record.get("annotations", a, "short_answers", k, "start_token", expect=int)
            stop = record.get("annotations", a, "short_answers", k, "end_token", expect=int)
            if 0 <= first < stop <= n_tokens:
                short.append((k, first, stop))
            else:
                message = f"short answer tokens [{first}, {stop}) are empty or outside the document's {n_tokens} tokens"
                record.warn("short_answers", message, "annotations", a, "short_answers", k)
        yes_no = record.get("annotations", a, "yes_no_answer", expect=str, default="NONE")
        out.append(_NqAnnotation(a, long, short, yes_no.upper()))
    return out


def _nq_answer(
    annotations: list[_NqAnnotation], candidate_spans: np.ndarray, short_spans: np.ndarray, has_long_answer: bool
) -> tuple[str, tuple[int, int] | None]:
    """BERT-joint's target (answer_type, span): short span; yes/no or long with the long answer's span; null."""
    with_text = [tuple(map(int, s)) for s in short_spans if s[1] > s[0]]
    long = next((a.long for a in annotations if a.long >= 0), -1) if has_long_answer else -1
    long_span = tuple(map(int, candidate_spans[long])) if long >= 0 else None
    long_span = long_span if long_span is not None and long_span[1] > long_span[0] else None
    yes_no = next((a.yes_no.lower() for a in annotations if a.yes_no in ("YES", "NO")), None)
    if with_text:
        return "short", with_text[0]
    if yes_no is not None and long_span is not None:
        return yes_no, long_span
    if long_span is not None:
        return "long", long_span
    return "null", None


def _candidate_kind(first_tag: str) -> str:
    if first_tag == "<p>":
        return "paragraph"
    if first_tag == "<table>":
        return "table"
    return "list" if first_tag in _LIST_TAGS else "other"


class _TokenTable:
    """NQ's space-separated tokens as numpy arrays: which are kept, where each lands in the text.

    Kept tokens are joined by single spaces, so kept token r starts at the sum of the lengths
    (plus one space each) of the kept tokens before it.
    """

    def __init__(self, document: str, keep_html_tokens: bool):
        self.document = document
        codes = np.frombuffer(document.encode("utf-32-le"), dtype=np.uint32)
        spaces = np.flatnonzero(codes == 32)
        self.starts = np.concatenate([[0], spaces + 1]).astype(np.int64)
        self.ends = np.concatenate([spaces, [codes.size]]).astype(np.int64)
        self.count = int(self.starts.size)
        lengths = self.ends - self.starts
        padded = np.append(codes, np.uint32(0))  # so that empty tokens index safely
        is_tag = (lengths >= 2) & (padded[self.starts] == ord("<")) & (padded[np.maximum(self.ends - 1, 0)] == ord(">"))
        kept = (lengths > 0) & (keep_html_tokens | ~is_tag)
        kept_lengths = lengths[kept]
        self.new_starts = np.cumsum(kept_lengths + 1) - (kept_lengths + 1)
        self.new_ends = self.new_starts + kept_lengths
        self.kept_before = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)  # kept tokens before token i
        # Each kept token keeps its characters and the one space after it; the last space goes.
        char_keep = np.repeat(kept, lengths + 1)[: codes.size]
        joined = codes[char_keep].tobytes().decode("utf-32-le")
        self.text = joined[: int(self.new_ends[-1])] if kept_lengths.size else ""

    def char_spans(self, bounds: np.ndarray) -> np.ndarray:
        """[n, 2] token ranges [start, end) -> [n, 2] char spans in `text`; (0, 0) if no kept token."""
        spans = np.zeros((bounds.shape[0], 2), np.int64)
        if bounds.size == 0 or self.new_starts.size == 0:
            return spans
        first = self.kept_before[bounds[:, 0]]
        last = self.kept_before[bounds[:, 1]] - 1
        has_text = last >= first
        spans[has_text, 0] = self.new_starts[first[has_text]]
        spans[has_text, 1] = self.new_ends[last[has_text]]
        return spans

    def first_token(self, index: int) -> str:
        return self.document[self.starts[index] : self.ends[index]]


# -- files -----------------------------------------------------------------------------------
def _openkp_graph(record: Record | Any) -> DocGraph:
    from graphattn.ingest.openkp import openkp_graph  # its own module (it imports this one)

    return openkp_graph(record)


ADAPTERS: dict[str, Callable[..., DocGraph]] = {
    "hotpotqa": hotpotqa_graph,
    "wikihop": wikihop_graph,
    "nq": nq_graph,
    "openkp": _openkp_graph,
}


def read_json(
    path: str | os.PathLike, format: str | Callable[..., DocGraph], *, progress: bool = False, **options: Any
) -> Iterator[DocGraph]:
    """Yield one DocGraph per record of `path`, read with a named adapter or a callable.

    `format` is ``"hotpotqa"``, ``"wikihop"``, ``"nq"``, ``"openkp"`` (`graphattn.ingest.openkp`) or a callable
    taking a `Record` (for
    the generic reader pass ``functools.partial(mapping.json_graph, mapping=...)``); `options`
    go to the adapter (``nlp=`` for WikiHop, ``keep_html_tokens=`` for NQ).
    """
    adapter = ADAPTERS.get(format) if isinstance(format, str) else format
    if adapter is None:
        raise IngestError(f"unknown JSON format {format!r}; known: {', '.join(ADAPTERS)}", file=str(path))
    records = iter_records(path)
    if progress:
        from tqdm import tqdm

        records = tqdm(records, desc=f"ingest {Path(path).name}", unit="rec")
    for ref in records:
        yield adapter(Record.of(ref), **options)
