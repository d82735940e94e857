"""Lowering the schema's task targets (`targets:`, see `graphattn.schema.targets`) into arrays.

Assembly hands over, per document of the instance, which node each global stands for and where
each node's tokens landed (`DocNodes`); the pure functions below turn those id arrays into the
target arrays of `EtcInstance.targets`. Their rules under truncation and strided windows:

* global_labels: a global keeps its node's class; globals cut away take their labels with them
  (the dropped nodes are listed in the truncation report already). A document in which no node
  of the target's types has the attr is unlabelled: IGNORE everywhere, the schema's `default`
  applies only beside nodes that do have it.
* choice: 1 at every global of a chosen node, 0 at the other candidate globals. In a window of a
  strided layout a chosen node counts only in the window that holds its first token (NQ: a long
  answer belongs to the window it starts in; a later window that still shows its tail sees 0).
  When no chosen node counts here, the `null_global` (NQ's [CLS]) is 1; without it every
  candidate is IGNORE (nothing to learn). A document in which no candidate has the attr at all
  is unlabelled: IGNORE everywhere, the null global too. A chosen node whose global truncation cut (not a window
  that does not hold it) is counted in the report's `dropped_targets`.
* span: the first answer node whose long tokens are all in the instance gives (first, last,
  type). An answer node without characters gives (IGNORE, IGNORE, type), e.g. HotpotQA's yes /
  no, or (0, 0, null) when its type is the null type. An answer only partly or not at all in
  the instance gives the null target (0, 0, types[0]), counted in `dropped_targets` when
  truncation (not a window) cut it. A graph without answer nodes gives IGNORE everywhere, and
  so does an answer whose characters hold no whole long token (a tokenizer that joins them to
  their neighbours): the message says so (`NO_TOKEN`), and `graphattn compile` makes it a
  LabelWarning. So a span target never has a type with characters but no span.
* spans: the answer nodes wholly in the instance, in document order, up to `max_spans` rows;
  rows left over are IGNORE. Nodes truncation cut are counted; nodes past `max_spans` are said.

Attr values are read per labelled node (not per token): `global_labels` classes and span types
not declared in the schema raise a CompileError naming the node, since the schema and the
ingest adapter disagree.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from graphattn.compile.ranges import take_or
from graphattn.contract import TARGET_IGNORE
from graphattn.errors import CompileError
from graphattn.graph import DocGraph
from graphattn.schema.targets import TargetSpec


@dataclass
class DocNodes:
    """One document of an instance, as target lowering needs it (node arrays indexed like node_ids)."""

    graph: DocGraph
    node_ids: list[str]
    node_is: Any  # node_is(type_names) -> bool [N]: node is of one of these types
    rank: np.ndarray  # [N] document order
    selected: np.ndarray  # [N] bool: the node has a global when nothing is cut
    global_nodes: np.ndarray  # [Gd] node index of each global of the document, -1 for the compiler's own
    prefix: Mapping[str, int]  # global_prefix token name -> its global position in the document
    first: np.ndarray  # [N] instance long position of the node's first kept token, -1 if none
    last: np.ndarray  # [N] ... of its last kept token
    complete: np.ndarray  # [N] bool: the node has long tokens and every one of them is in the instance
    has_text: np.ndarray  # [N] bool: the node covers long tokens of the whole document (kept or not)
    holds_first: np.ndarray  # [N] bool: the node's first long token is in the instance


# -- pure functions from id arrays ---------------------------------------------------------------
def global_labels(global_nodes: np.ndarray, node_class: np.ndarray) -> np.ndarray:
    """[G] class of each global's node (`node_class` [N], IGNORE for unlabelled nodes); IGNORE
    for the compiler's own globals (node -1)."""
    return take_or(np.asarray(node_class, np.int32), np.asarray(global_nodes, np.int64), TARGET_IGNORE).astype(np.int32)


def choice_labels(
    global_nodes: np.ndarray, candidate: np.ndarray, chosen: np.ndarray, null_position: int | None
) -> np.ndarray:
    """[G]: 1 at globals of chosen nodes, 0 at other candidate globals, IGNORE elsewhere.

    `candidate`, `chosen`: bool [N]. `null_position`: the global that stands for "none of them",
    1 when no chosen node has a global here (else 0); None: then all candidates are IGNORE when
    no chosen node has a global here."""
    global_nodes = np.asarray(global_nodes, np.int64)
    is_candidate = take_or(np.asarray(candidate, bool), global_nodes, False)
    is_chosen = take_or(np.asarray(chosen, bool), global_nodes, False) & is_candidate
    out = np.where(is_candidate, is_chosen.astype(np.int32), TARGET_IGNORE).astype(np.int32)
    found = bool(is_chosen.any())
    if null_position is not None:
        out[null_position] = 0 if found else 1
    elif not found:
        out[:] = TARGET_IGNORE
    return out


NO_TOKEN = "characters hold no whole long token"  # in the message of a span answer with no span


def span_target(
    first: np.ndarray,
    last: np.ndarray,
    complete: np.ndarray,
    answers: np.ndarray,
    answer_types: np.ndarray,
    has_text: np.ndarray,
    has_chars: np.ndarray | None = None,
) -> tuple[int, int, int]:
    """(start, end, type) from the answer nodes `answers` (node indices in document order) and
    their type ids. The first answer wholly in the instance wins; an answer without long tokens
    gives, when it has no characters either (`has_chars` [N]; None: no node has), (IGNORE,
    IGNORE, type) or, for the null type 0, (0, 0, 0), and when it has characters all IGNORE (it
    cannot be a span, and its type says it is one); otherwise the null target (0, 0, 0). No
    answer nodes: all IGNORE."""
    answers = np.asarray(answers, np.int64)
    if answers.size == 0:
        return TARGET_IGNORE, TARGET_IGNORE, TARGET_IGNORE
    inside = np.flatnonzero(np.asarray(complete, bool)[answers])
    if inside.size:
        node = answers[inside[0]]
        return int(first[node]), int(last[node]), int(answer_types[inside[0]])
    if not np.asarray(has_text, bool)[answers[0]]:
        if has_chars is not None and np.asarray(has_chars, bool)[answers[0]]:
            return TARGET_IGNORE, TARGET_IGNORE, TARGET_IGNORE
        kind = int(answer_types[0])
        return (0, 0, 0) if kind == 0 else (TARGET_IGNORE, TARGET_IGNORE, kind)
    return 0, 0, 0


def span_rows(
    first: np.ndarray, last: np.ndarray, complete: np.ndarray, nodes: np.ndarray, rows: int
) -> tuple[np.ndarray, int]:
    """[rows, 2] (first, last) long positions of the `nodes` (document order) wholly in the
    instance, IGNORE rows after them; and how many such nodes did not fit the rows."""
    nodes = np.asarray(nodes, np.int64)
    inside = nodes[np.asarray(complete, bool)[nodes]] if nodes.size else nodes
    out = np.full((rows, 2), TARGET_IGNORE, np.int32)
    taken = inside[:rows]
    out[: taken.size, 0] = first[taken]
    out[: taken.size, 1] = last[taken]
    return out, max(0, inside.size - rows)


# -- reading the labels off the graph ------------------------------------------------------------
def _attr_values(doc: DocNodes, nodes: np.ndarray, attr: str) -> list:
    """The attr of each of `nodes` (None where absent), read from the graph's column in one call."""
    return doc.graph.attr_values(attr, nodes)


def _class_id(value: Any, classes: tuple, spec: TargetSpec, doc: DocNodes, node: int, what: str) -> int:
    for i, known in enumerate(classes):
        if value == known and isinstance(value, bool) == isinstance(known, bool):
            return i
    raise CompileError(
        f"target {spec.name!r}: {what} {value!r} is not one of {list(classes)} declared in the schema",
        file=doc.graph.source,
        node=doc.node_ids[node],
    )


def class_ids(values: Sequence[Any], classes: tuple, default: Any = None) -> tuple[np.ndarray, int]:
    """int32 class index of each value (`default` stands in for None; IGNORE where still None),
    the first class the value `==`, a bool only to a bool (True is not the class 1); and the
    index of the first value no class matches, -1 when every one does. A pass per class (a
    target declares a handful), none per value in Python."""
    n = len(values)
    unmatched = np.fromiter(map(operator.is_not, values, repeat(None)), dtype=bool, count=n)  # None: no label
    if default is not None and not unmatched.all():
        filled = np.fromiter(values, dtype=object, count=n)
        filled[~unmatched] = default
        values, unmatched = filled.tolist(), np.ones(n, dtype=bool)
    is_bool = np.fromiter(map(isinstance, values, repeat(bool)), dtype=bool, count=n)
    out = np.full(n, TARGET_IGNORE, np.int32)
    for k, known in enumerate(classes):
        rows = np.flatnonzero(unmatched & (is_bool == isinstance(known, bool)))
        if rows.size:
            same = map(bool, map(operator.eq, map(values.__getitem__, rows.tolist()), repeat(known)))
            hit = rows[np.fromiter(same, dtype=bool, count=rows.size)]
            out[hit] = k
            unmatched[hit] = False
    return out, int(np.argmax(unmatched)) if unmatched.any() else -1


def node_classes(doc: DocNodes, spec: TargetSpec) -> np.ndarray:
    """[N] class id of each labelled node of a global_labels target, IGNORE elsewhere.

    The schema's `default` stands in for a node without the attr only in a document where some
    node of the target's types has it: a document where none has it was never labelled (a
    record without answers), and all its nodes are IGNORE rather than the default class."""
    typed = np.flatnonzero(doc.node_is(spec.node_types))
    out = np.full(len(doc.node_ids), TARGET_IGNORE, np.int32)
    every = _attr_values(doc, typed, spec.attr)
    said = np.fromiter(map(operator.is_not, every, repeat(None)), dtype=bool, count=len(every))
    if not said.any():
        return out
    keep = np.flatnonzero(np.asarray(doc.selected, bool)[typed])
    labelled = typed[keep]
    values = list(map(every.__getitem__, keep.tolist()))
    ids, bad = class_ids(values, spec.classes, spec.default)
    if bad >= 0:  # raises, naming the node
        value = spec.default if values[bad] is None else values[bad]
        _class_id(value, spec.classes, spec, doc, int(labelled[bad]), f"{spec.attr} =")
    out[labelled] = ids
    return out


def _answers(doc: DocNodes, spec: TargetSpec) -> np.ndarray:
    nodes = np.flatnonzero(doc.node_is(spec.node_types))
    return nodes[np.argsort(doc.rank[nodes], kind="stable")]


def _answer_types(doc: DocNodes, spec: TargetSpec, answers: np.ndarray) -> np.ndarray:
    values = _attr_values(doc, answers, spec.type_attr)
    return np.array(
        [
            _class_id(str(v).lower() if v is not None else v, spec.types, spec, doc, n, f"{spec.type_attr} =")
            for n, v in zip(answers.tolist(), values)
        ],
        np.int32,
    )


# -- one instance ------------------------------------------------------------------------------------
@dataclass
class LoweredTargets:
    arrays: dict[str, np.ndarray]
    axes: dict[str, str]
    dropped: list[str]  # one target name per label truncation cut away
    messages: list[str]


def lower_targets(targets: Mapping[str, TargetSpec], docs: list[DocNodes], *, windowed: bool) -> LoweredTargets:
    """Every target of the schema for one instance (documents in instance order).

    `windowed`: the instance is one window of a strided layout, so a label outside it belongs to
    another window and is not a truncation loss."""
    out = LoweredTargets({}, {}, [], [])
    for spec in targets.values():
        if spec.kind == "global_labels":
            out.arrays[spec.name] = np.concatenate([global_labels(d.global_nodes, node_classes(d, spec)) for d in docs])
        elif spec.kind == "choice":
            out.arrays[spec.name] = np.concatenate([_choice(d, spec, windowed, out) for d in docs])
        elif spec.kind == "span":
            _span(docs[0], spec, windowed, out)
        else:
            _spans(docs[0], spec, windowed, out)
        for array in spec.arrays:
            out.axes[array.name] = array.axis
    return out


def _choice(doc: DocNodes, spec: TargetSpec, windowed: bool, out: LoweredTargets) -> np.ndarray:
    candidate = doc.node_is(spec.node_types)
    nodes = np.flatnonzero(candidate)
    values = _attr_values(doc, nodes, spec.attr)
    if nodes.size and all(v is None for v in values):  # no candidate says: unlabelled, not "none of them"
        return np.full(len(doc.global_nodes), TARGET_IGNORE, np.int32)
    chosen = np.zeros(len(doc.node_ids), bool)
    chosen[nodes] = [bool(v) for v in values]
    null = doc.prefix.get(spec.null_global) if spec.null_global is not None else None
    labels = choice_labels(
        doc.global_nodes, candidate, chosen & (doc.holds_first | ~doc.has_text) if windowed else chosen, null
    )
    present = np.isin(np.flatnonzero(chosen), doc.global_nodes)
    if not windowed and present.size and not present.any() and (chosen & doc.selected).any():
        out.dropped.append(spec.name)
        then = "the null candidate" if null is not None else "no label"
        out.messages.append(
            f"target {spec.name}: truncation cut the global(s) of the chosen node(s); the target is {then}"
        )
    return labels


def _span(doc: DocNodes, spec: TargetSpec, windowed: bool, out: LoweredTargets) -> None:
    answers = _answers(doc, spec)
    types = _answer_types(doc, spec, answers)
    spans = doc.graph.span_array()
    has_chars = spans[:, 1] > spans[:, 0]
    start, end, kind = span_target(doc.first, doc.last, doc.complete, answers, types, doc.has_text, has_chars)
    if answers.size and has_chars[answers[0]] and not doc.has_text[answers[0]]:
        a, b = spans[answers[0]].tolist()
        out.messages.append(
            f"target {spec.name}: the answer {doc.node_ids[answers[0]]!r} at characters [{a}, {b}): its {NO_TOKEN}; "
            "no label"
        )
    cut = answers.size > 0 and not doc.complete[answers].any() and doc.has_text[answers].any()
    if cut and not windowed:
        out.dropped.append(spec.name)
        out.messages.append(
            f"target {spec.name}: truncation cut the answer span; the target is the null answer {spec.types[0]!r}"
        )
    for part, value in (("start", start), ("end", end), ("type", kind)):
        out.arrays[f"{spec.name}_{part}"] = np.asarray(value, np.int32)


def _spans(doc: DocNodes, spec: TargetSpec, windowed: bool, out: LoweredTargets) -> None:
    nodes = _answers(doc, spec)
    rows, extra = span_rows(doc.first, doc.last, doc.complete, nodes, spec.max_spans)
    out.arrays[spec.name] = rows
    cut = int(np.count_nonzero(~doc.complete[nodes] & doc.has_text[nodes]))
    if cut and not windowed:
        out.dropped.extend([spec.name] * cut)
        out.messages.append(f"target {spec.name}: truncation cut {cut} of its {nodes.size} span(s)")
    if extra:
        out.messages.append(f"target {spec.name}: {extra} span(s) past max_spans {spec.max_spans} left out")


__all__ = [
    "NO_TOKEN",
    "DocNodes",
    "LoweredTargets",
    "choice_labels",
    "global_labels",
    "lower_targets",
    "node_classes",
    "span_rows",
    "span_target",
]
