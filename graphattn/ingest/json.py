"""JSON records -> DocGraphs: HotpotQA, WikiHop and Natural Questions (simplified) adapters.

Files: a JSON array of records, one JSON object, or JSON lines (``.jsonl``/``.ndjson``, or any
file whose first line is a complete object); ``.gz`` is read transparently (`graphattn.ingest.records`).
A record that is not what its format expects raises `IngestError` naming the file, the line (JSON
lines) or the record index (arrays: ``$[3]``), and the key path inside the record
(``$[3].context[2][1][0]``).
Other JSON layouts go through the generic, mapping-driven reader in `graphattn.ingest.mapping`.

Node conventions per format (the schemas in ``schemas/`` depend on them):

HotpotQA (``question``, ``context`` = [[title, [sentence, ...]], ...], ``supporting_facts`` =
[[title, sentence index], ...]). Text: the question, then each paragraph as its title, a newline
and its sentences joined by spaces; blocks separated by blank lines. Nodes: ``q`` (question;
attrs answer, question_type, level), ``p<i>`` (paragraph: title through last sentence; attrs title, index,
supporting), ``p<i>.title`` (title; supporting), ``p<i>.s<j>`` (sentence; index = position in the
record, supporting). ``contains``: paragraph -> title, paragraph -> sentence. Empty sentences are
left out (their index is skipped). Supporting facts that name no paragraph or sentence (the
dataset has a few) are kept in the question's ``unmatched_supporting_facts``.

WikiHop (``query``, ``supports`` = [document, ...], ``candidates``, ``answer``). Text, in ETC's
long order: the candidates (one per line), the query, then the documents separated by blank
lines. Nodes: ``c<i>`` (candidate; text, index, is_answer), ``q`` (query; answer),
``d<i>`` (document; index), ``d<i>.s<j>`` (sentence, spaCy), ``m<k>`` (mention of a candidate
inside a document, found case-insensitively by `text.link_mentions`; ``mention_of`` edge ->
candidate). ``contains``: document -> sentence.

Natural Questions simplified (``question_text``, ``document_text`` = space-separated tokens with
HTML tags as tokens, ``long_answer_candidates`` = [{start_token, end_token, top_level}],
``annotations``). Text: the question, a newline, then the document tokens joined by single spaces
— HTML tag tokens left out unless ``keep_html_tokens``. Token offsets become character spans
with numpy, no loop per token. Nodes: ``q`` (question; short_answers as char spans,
yes_no_answer), ``doc`` (document; url), ``c<i>`` (candidate; kind = paragraph | table | list |
other from its first tag, top_level, index, is_long_answer). ``contains``: document -> top-level
candidate -> candidates nested inside it (innermost enclosing candidate). Candidates whose tokens
are all tags have no text and are left out (their index is skipped).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from graphattn.errors import IngestError
from graphattn.graph import DocGraph
from graphattn.ingest.records import RecordRef, iter_records

__all__ = ["ADAPTERS", "Record", "RecordRef", "hotpotqa_graph", "iter_records", "nq_graph", "read_json", "wikihop_graph"]

_MISSING = object()
_JSON_TYPES = {str: "a string", int: "an integer", list: "a list", dict: "an object", bool: "a boolean", float: "a number"}


class Record:
    """Typed access into one record: every missing key or wrong type names file, line, path."""

    def __init__(self, data: Any, file: str | None = None, line: int | None = None, base_path: tuple = ()):
        self.data, self.file, self.line, self.base_path = data, file, line, tuple(base_path)

    @classmethod
    def of(cls, ref: RecordRef) -> "Record":
        return cls(ref.data, ref.file, ref.line, ref.base_path)

    def error(self, message: str, *path: str | int) -> IngestError:
        return IngestError(message, file=self.file, line=self.line, path=(*self.base_path, *path))

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
        if expect is not object and (not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected)):
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
    """One HotpotQA record -> DocGraph (see the module docstring for the conventions)."""
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
        supporting.add((record.get("supporting_facts", k, 0, expect=str).strip(),
                        record.get("supporting_facts", k, 1, expect=int)))

    graph = DocGraph(text.text(), doc_id=_doc_id(record, "_id"), source=record.file)
    question_node = graph.add_node("q", "question", question_span,
                                   answer=record.get("answer", expect=str, default=None),
                                   question_type=record.get("type", expect=str, default=None),
                                   level=record.get("level", expect=str, default=None))
    matched: set[tuple[str, int]] = set()
    for i, (title, title_span, spans) in enumerate(paragraphs):
        sentence_support = [(title, j) in supporting for j, _ in spans]
        matched.update((title, j) for (j, _), s in zip(spans, sentence_support) if s)
        end = spans[-1][1][1] if spans else title_span[1]
        pid = f"p{i}"
        graph.add_node(pid, "paragraph", (title_span[0], end), title=title, index=i, supporting=any(sentence_support))
        graph.add_child(pid, f"{pid}.title", "title", title_span, supporting=any(sentence_support))
        for (j, span), is_support in zip(spans, sentence_support):
            graph.add_child(pid, f"{pid}.s{j}", "sentence", span, index=j, supporting=is_support)
    question_node.attrs["unmatched_supporting_facts"] = sorted(supporting - matched)
    return graph


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
    if answer is not None and answer.strip().lower() not in lowered:
        raise record.error(f"answer {answer!r} is not one of the {len(candidates)} candidates", "answer")

    text = _Text()
    candidate_spans = [text.add(c, "\n") for c in candidates]
    query_span = text.add(query, "\n")
    document_spans = [(i, text.add(s, "\n\n")) for i, s in enumerate(supports) if s]

    graph = DocGraph(text.text(), doc_id=_doc_id(record, "id"), source=record.file)
    answer_index = lowered.index(answer.strip().lower()) if answer is not None else -1
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
    """One NQ-simplified record -> DocGraph; token offsets map to char spans vectorized."""
    record = record if isinstance(record, Record) else Record(record)
    question = record.get("question_text", expect=str).strip()
    document = record.get("document_text", expect=str)
    if not question:
        raise record.error("question_text is empty", "question_text")
    raw_candidates = record.items("long_answer_candidates", expect=dict)
    bounds = np.array([[record.get("long_answer_candidates", i, "start_token", expect=int),
                        record.get("long_answer_candidates", i, "end_token", expect=int)]
                       for i in range(len(raw_candidates))], dtype=np.int64).reshape(-1, 2)

    tokens = _TokenTable(document, keep_html_tokens)
    bad = np.flatnonzero((bounds[:, 0] < 0) | (bounds[:, 1] > tokens.count) | (bounds[:, 0] >= bounds[:, 1]))
    if bad.size:
        i = int(bad[0])
        raise record.error(f"token range [{bounds[i, 0]}, {bounds[i, 1]}) is empty or outside the "
                           f"document's {tokens.count} tokens", "long_answer_candidates", i)
    offset = len(question) + 1
    text = question + "\n" + tokens.text
    graph = DocGraph(text, doc_id=_doc_id(record, "example_id"), source=record.file)

    annotations = record.items("annotations", expect=dict) if "annotations" in record.data else []
    long_answers = {record.get("annotations", a, "long_answer", "candidate_index", expect=int, default=-1)
                    for a in range(len(annotations)) if "long_answer" in annotations[a]}
    short = [(record.get("annotations", a, "short_answers", s, "start_token", expect=int),
              record.get("annotations", a, "short_answers", s, "end_token", expect=int))
             for a in range(len(annotations))
             for s in range(len(record.get("annotations", a, "short_answers", expect=list, default=[])))]
    short_spans = tokens.char_spans(np.array(short, dtype=np.int64).reshape(-1, 2)) + offset
    yes_no = [record.get("annotations", a, "yes_no_answer", expect=str, default="NONE") for a in range(len(annotations))]
    graph.add_node("q", "question", (0, len(question)),
                   short_answers=[tuple(map(int, s)) for s in short_spans if s[1] > s[0]],
                   yes_no_answer=next((y for y in yes_no if y != "NONE"), "NONE"))
    graph.add_node("doc", "document", (offset, len(text)) if tokens.text else (offset, offset),
                   url=record.get("document_url", expect=str, default=None))

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
        graph.add_child(parent, node_id, "candidate", (start, end), kind=_candidate_kind(first_tags[i]),
                        top_level=bool(record.get("long_answer_candidates", int(i), "top_level", expect=bool, default=True)),
                        index=int(i), is_long_answer=int(i) in long_answers)
        open_parents.append((end, node_id))
    return graph


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
        return self.document[self.starts[index]:self.ends[index]]


# -- files -----------------------------------------------------------------------------------
ADAPTERS: dict[str, Callable[..., DocGraph]] = {
    "hotpotqa": hotpotqa_graph,
    "wikihop": wikihop_graph,
    "nq": nq_graph,
}


def read_json(path: str | os.PathLike, format: str | Callable[..., DocGraph], *, progress: bool = False,
              **options: Any) -> Iterator[DocGraph]:
    """Yield one DocGraph per record of `path`, read with a named adapter or a callable.

    `format` is ``"hotpotqa"``, ``"wikihop"``, ``"nq"`` or a callable taking a `Record` (for
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
