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
span of the answer string's first whole-word occurrence, in a supporting sentence if it has one,
else in any sentence or title, exact case first; attrs found_in, the node it was taken from, and
occurrences, how many whole-word occurrences the sentences and titles hold; ``yes`` / ``no``
without a span; an answer found only inside longer words, as "class" in "Subclasses", is a
`LabelWarning` and makes no answer node). ``contains``:
paragraph -> title, paragraph -> sentence. Empty sentences are left out (their index is
skipped). Labels that match nothing (a supporting fact naming no paragraph or sentence, which the
dataset has a few of; an answer string in no paragraph) are `LabelWarning`s, and the facts are
also kept in the question's ``unmatched_supporting_facts``. A record without ``supporting_facts``
(a test set, documents to predict on) is unlabelled: no node has the supporting attr, so the
`supporting` target is IGNORE throughout instead of every sentence a "not supporting".

WikiHop (``query``, ``supports`` = [document, ...], ``candidates``, ``answer``). Text, in ETC's
long order: the candidates (one per line), the query, then the documents separated by blank
lines. Nodes: ``c<i>`` (candidate; text, index, is_answer; an answer that is no candidate is a
`LabelWarning` and leaves every is_answer false), ``q`` (query; answer),
``d<i>`` (document; index), ``d<i>.s<j>`` (sentence, spaCy), ``m<k>`` (mention of a candidate
inside a document, found case-insensitively by `text.link_mentions`; ``mention_of`` edge ->
candidate). ``contains``: document -> sentence.

Natural Questions simplified: `graphattn.ingest.nq`.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

from graphattn.errors import IngestError
from graphattn.graph import CONTAINS, DocGraph
from graphattn.graph.columns import MISSING
from graphattn.ingest.nq import nq_graph
from graphattn.ingest.openkp import openkp_graph
from graphattn.ingest.records import Record, RecordRef, doc_id_of, iter_records

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
    doc_id = doc_id_of(record, "_id")
    answer = record.get("answer", expect=str, default=None)
    question_type = record.get("type", expect=str, default=None)
    level = record.get("level", expect=str, default=None)

    rows = _HotpotRows(question, titles, sentence_lists, facts)
    _warn_unmatched_facts(record, facts, titles, [len(s) for s in sentence_lists], rows.matched_facts)
    found = _hotpotqa_answer(record, rows, answer.strip()) if answer is not None else None

    attrs = rows.attrs
    if "supporting_facts" not in record.data:  # unlabelled, not "no sentence supports"
        attrs.pop("supporting", None)
    attrs["answer"][0], attrs["question_type"][0], attrs["level"][0] = answer, question_type, level
    attrs["unmatched_supporting_facts"][0] = sorted(set(facts) - rows.matched_facts)
    n = len(rows.ids)
    if found is not None:  # the row reserved for it
        answer_type, match = found
        rows.ids.append("answer")
        rows.types.append("answer")
        rows.spans[n] = match.span if match is not None else (-1, -1)
        for column in attrs.values():
            column.append(MISSING)
        attrs["answer_type"] = [MISSING] * n + [answer_type]  # only the answer row has these
        attrs["text"] = [MISSING] * n + [answer.strip()]
        if match is not None:  # which occurrence: the node it was taken from, and how many there are
            attrs["found_in"] = [MISSING] * n + [match.node]
            attrs["occurrences"] = [MISSING] * n + [match.occurrences]
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


_PLUS_ONE = (1).__add__  # a sentence advances the text by its separator and itself


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
            # map() rather than comprehensions: a record has tens of nodes, so call overhead is the cost
            stripped = list(map(str.strip, sentences))
            kept_index = list(range(len(stripped))) if all(stripped) else [j for j, s in enumerate(stripped) if s]
            kept = stripped if len(kept_index) == len(stripped) else [stripped[j] for j in kept_index]
            support = [False] * len(kept)
            if title in fact_titles:
                support = [(title, j) in supported for j in kept_index]
                self.matched_facts.update((title, j) for j, s in zip(kept_index, support) if s)
                self.supporting_rows += [row + 2 + k for k, s in enumerate(support) if s]
            paragraph_rows.append(row)
            self.sentence_rows += range(row + 2, row + 2 + len(kept))
            self.contains_src += [row] * (1 + len(kept))
            self.contains_dst += range(row + 1, row + 2 + len(kept))
            self.ids += [f"p{i}", f"p{i}.title", *map(f"p{i}.s{{}}".format, kept_index)]
            self.types += ["paragraph", "title", *["sentence"] * len(kept)]
            lengths = list(map(len, kept))
            own += [0, len(title), *lengths]
            advance += [0, 2 + len(title), *map(_PLUS_ONE, lengths)]
            titled += [title, *[MISSING] * (1 + len(kept))]
            indexes += [i, MISSING, *kept_index]
            supporting += [any(support)] * 2 + support
            blocks.append("\n\n" + title + ("\n" + " ".join(kept) if kept else ""))
        self.text = question + "".join(blocks)
        ends = [*accumulate(advance), 0]
        starts = [*map(operator.sub, ends, own), 0]
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


@dataclass
class _AnswerMatch:
    """Where the answer string was found: its character span, the node holding it, and how many
    whole-word occurrences the context's sentences and titles hold (with the same case rule)."""

    span: tuple[int, int]
    node: str
    occurrences: int


def _whole_word_finds(text: str, haystack: str | None, needle: str, start: int, end: int) -> Iterator[int]:
    """Offsets in `text` of `needle` inside [start, end) that are whole words: no letter or digit
    right before or after it where the answer itself begins or ends with one. `haystack` is `text`
    or its ASCII lower case (same offsets); None: lower-case this piece on its own."""
    if haystack is None:
        piece = text[start:end]
        lowered = piece.lower()
        if len(lowered) != len(piece):
            return  # lowering changed the length: its offsets would not be the text's
        haystack, shift = lowered, start
        start, end = 0, len(piece)
    else:
        shift = 0
    check_left, check_right = needle[:1].isalnum(), needle[-1:].isalnum()
    at = haystack.find(needle, start, end)
    while at >= 0:
        left, right = at + shift - 1, at + shift + len(needle)
        if not (check_left and left >= 0 and text[left].isalnum()) and not (
            check_right and right < len(text) and text[right].isalnum()
        ):
            yield at + shift
        at = haystack.find(needle, at + 1, end)


def _hotpotqa_answer(record: Record, rows: _HotpotRows, answer: str) -> tuple[str, _AnswerMatch | None] | None:
    """(answer_type, match) of the `answer` node: yes / no without a span, else the answer
    string's first whole-word occurrence inside one sentence or title (supporting sentences
    first, then every sentence, then the titles; exact case first, then ignoring case); None,
    with a LabelWarning, when it occurs nowhere or only inside longer words ("class" in
    "Subclasses": a span there would cut a word, which no token boundary follows)."""
    if answer.lower() in ("yes", "no"):
        return answer.lower(), None
    spans = rows.spans.tolist()
    order = (*rows.supporting_rows, *rows.sentence_rows, *rows.title_rows)
    every = (*rows.sentence_rows, *rows.title_rows)
    text = rows.text
    for needle, haystack in ((answer, text), (answer.lower(), text.lower() if text.isascii() else None)):
        if not needle or (haystack is not None and needle not in haystack):
            continue
        for row in order:
            found = next(_whole_word_finds(text, haystack, needle, *spans[row]), None)
            if found is not None:
                count = sum(sum(1 for _ in _whole_word_finds(text, haystack, needle, *spans[r])) for r in every)
                return "span", _AnswerMatch((found, found + len(answer)), rows.ids[row], count)
    lowered = answer.lower()
    if lowered and any(lowered in text[a:b].lower() for a, b in map(spans.__getitem__, every)):
        message = f"answer {answer!r} occurs in the context only inside longer words, never as a whole word"
    else:
        message = f"answer {answer!r} is not in any paragraph of the context"
    record.warn("answer", message, "answer")
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

    answer_index = lowered.index(wanted) if wanted in lowered else -1
    n_candidates, documents = len(candidates), [f"d{i}" for i, _ in document_spans]
    after_candidates = [MISSING] * (1 + len(documents))
    attrs = {}  # in the order `add_node` calls would make the columns
    if candidates:
        attrs["text"] = [*candidates, *after_candidates]
        attrs["index"] = [*range(n_candidates), MISSING, *[i for i, _ in document_spans]]
        attrs["is_answer"] = [*[i == answer_index for i in range(n_candidates)], *after_candidates]
    attrs["answer"] = [*[MISSING] * n_candidates, answer, *[MISSING] * len(documents)]
    if not candidates and documents:
        attrs["index"] = [MISSING, *[i for i, _ in document_spans]]
    graph = DocGraph.from_columns(
        text.text(),
        [*[f"c{i}" for i in range(n_candidates)], "q", *documents],
        ["candidate"] * n_candidates + ["query"] + ["document"] * len(documents),
        np.array([*candidate_spans, query_span, *[span for _, span in document_spans]], dtype=np.int64),
        attrs,
        doc_id=doc_id_of(record, "id"),
        source=record.file,
    )
    text_ingest.add_sentences(graph, documents, nlp=nlp)
    text_ingest.link_mentions(graph, {f"c{i}": c for i, c in enumerate(candidates)}, within=documents, nlp=nlp)
    return graph


# -- files -----------------------------------------------------------------------------------
ADAPTERS: dict[str, Callable[..., DocGraph]] = {
    "hotpotqa": hotpotqa_graph,
    "wikihop": wikihop_graph,
    "nq": nq_graph,
    "openkp": openkp_graph,
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
