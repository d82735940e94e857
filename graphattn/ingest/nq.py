"""Natural Questions (simplified) records -> DocGraphs.

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
outside the document or without text, is a `LabelWarning`. A record without ``annotations`` is
unlabelled: no ``answer`` node and no is_long_answer, so its targets are IGNORE, not "no answer".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphattn.graph import CONTAINS, DocGraph
from graphattn.graph.columns import MISSING
from graphattn.ingest.records import Record, doc_id_of

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
    doc_id = doc_id_of(record, "example_id")

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

    labelled = "annotations" in record.data  # without: unlabelled (no answer node, no is_long_answer), not "no answer"
    doc_span = (offset, len(text)) if tokens.text else (offset, offset)
    answer_rows = [[answer_span or (-1, -1)]] if labelled else []
    node_spans = np.concatenate([[(0, len(question)), doc_span], spans[order], *answer_rows])
    before, after = [MISSING] * (2 + len(candidates)), [MISSING] * labelled
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
        if labelled:
            attrs["is_long_answer"] = [MISSING, MISSING, *[i in long_answers for i in candidates], *after]
    if labelled:
        attrs["answer_type"] = [*before, answer_type]
    return DocGraph.from_columns(
        text,
        ["q", "doc", *[f"c{i}" for i in candidates], *["answer"] * labelled],
        ["question", "document", *["candidate"] * len(candidates), *["answer"] * labelled],
        node_spans,
        attrs,
        (parent_rows, CONTAINS, range(2, 2 + len(candidates))),
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
