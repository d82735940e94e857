"""The `targets:` section of a relation schema: task labels and how they lower from graph nodes.

A target names a label the ingest adapters put on the graph (a node attr, or nodes of their own
whose spans are the answer) and says what array it becomes in `EtcInstance.targets`. Four kinds:

    global_labels  <name>        [G]      class id of each global of `node_types`: the index of the
                                          node's `attr` value in `classes` (HotpotQA's supporting
                                          fact flag per sentence global; a label per DOM element)
    choice         <name>        [G]      1 at the globals of the `node_types` nodes whose `attr` is
                                          true, 0 at the other candidates (WikiHop's answer among the
                                          candidate globals; NQ's long answer). With `null_global: <name>` the
                                          global_prefix token of that name is a candidate too, and is 1
                                          when no chosen node has a global in the instance
    span           <name>_start  []       first and last long position (inclusive) of the first
                   <name>_end    []       `node_types` node in document order, and the index in `types`
                   <name>_type   []       of its `type_attr` (answer span with span / yes / no / null)
    spans          <name>        [k, 2]   (first, last) long positions of up to k = `max_spans` nodes of
                                          `node_types`, in document order (OpenKP keyphrase occurrences)

Every array is int32 and holds `graphattn.contract.TARGET_IGNORE` (-100, torch's cross-entropy
ignore_index) where there is no label: globals that are not candidates, padding, and instances
whose graph carries no label.
A span target's null type is ``types[0]``, at long position 0. How each target lowers under
truncation and windows is `graphattn.compile.targets`; the module there has the rules in full.

`metric` names how `graphattn evaluate` scores the target (see `graphattn.train.metrics`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphattn.schema.node_type import NodeType

TARGET_KINDS = ("global_labels", "choice", "span", "spans")
METRICS = {
    "global_labels": ("accuracy", "set_f1"),
    "choice": ("accuracy", "nq_long"),
    "span": ("squad", "nq_short"),
    "spans": ("f1_at_k",),
}
MAX_SPANS = 4096  # bound on `max_spans` (rows allocated per instance)
_KEYS = {  # keys each kind takes, besides kind, node_types, metric and description
    "global_labels": ("attr", "classes", "default"),
    "choice": ("attr", "null_global"),
    "span": ("type_attr", "types"),
    "spans": ("max_spans",),
}


@dataclass(frozen=True)
class TargetArray:
    """One array a target lowers to: its name, the axis padded in batches, its per-row shape."""

    name: str
    axis: str  # "global": the last axis runs over the globals; "": a fixed shape
    shape: tuple[int, ...] = ()  # fixed shape (axis ""); [] for scalars


@dataclass(frozen=True)
class TargetSpec:
    """A validated `targets:` entry (see the module docstring for the kinds)."""

    name: str
    kind: str
    node_types: tuple[str, ...]
    attr: str | None = None
    classes: tuple[Any, ...] = (False, True)
    default: Any = None  # global_labels: the value of a node without `attr` in a labelled document (None: IGNORE)
    null_global: str | None = None  # choice: the global_prefix token that means "none of them"
    type_attr: str | None = None
    types: tuple[str, ...] = ()
    max_spans: int = 0
    metric: str | None = None
    description: str = ""

    @property
    def arrays(self) -> tuple[TargetArray, ...]:
        if self.kind in ("global_labels", "choice"):
            return (TargetArray(self.name, "global"),)
        if self.kind == "span":
            return tuple(TargetArray(f"{self.name}_{part}", "") for part in ("start", "end", "type"))
        return (TargetArray(self.name, "", (self.max_spans, 2)),)

    @property
    def default_metric(self) -> str:
        return self.metric or METRICS[self.kind][0]


def target_arrays(targets: Mapping[str, TargetSpec]) -> tuple[TargetArray, ...]:
    """Every array the schema's targets lower to, in declaration order."""
    return tuple(array for spec in targets.values() for array in spec.arrays)


def build_targets(
    raw: Mapping[str, Mapping],
    node_types: Mapping[str, NodeType],
    global_prefix: tuple[str, ...],
    max_documents: int,
    check,
) -> dict[str, TargetSpec]:
    """Typed targets from the (JSON-Schema-valid) `targets:` mapping; `check.fail` reports at file:line."""
    out: dict[str, TargetSpec] = {}
    arrays: dict[str, str] = {}
    for name, entry in raw.items():
        spec = _target(name, entry, node_types, global_prefix, max_documents, check)
        for array in spec.arrays:
            if array.name in arrays:
                check.fail(
                    f"target {name!r} makes an array {array.name!r}, which target {arrays[array.name]!r} makes too",
                    "targets",
                    name,
                )
            arrays[array.name] = name
        out[name] = spec
    return out


def _target(
    name: str,
    entry: Mapping,
    node_types: Mapping[str, NodeType],
    global_prefix: tuple[str, ...],
    max_documents: int,
    check,
) -> TargetSpec:
    kind = entry["kind"]
    where = ("targets", name)
    for key in entry:
        if key not in ("kind", "node_types", "metric", "description", *_KEYS[kind]):
            owners = [k for k, keys in _KEYS.items() if key in keys]
            check.fail(f"`{key}` applies to kind {' / '.join(owners)} only (this target is {kind})", *where, key)
    types = (entry["node_types"],) if isinstance(entry["node_types"], str) else tuple(entry["node_types"])
    for i, type_name in enumerate(types):
        path = (*where, "node_types") + (() if isinstance(entry["node_types"], str) else (i,))
        check.known(type_name, node_types, "node type", *path)
        if kind in ("global_labels", "choice") and not node_types[type_name].is_global:
            check.fail(f"{kind} labels globals, but node type {type_name!r} has global: none", *path)
    metric = entry.get("metric")
    if metric is not None and metric not in METRICS[kind]:
        check.fail(
            f"metric {metric!r} does not score a {kind} target (choose {', '.join(METRICS[kind])})", *where, "metric"
        )
    if kind in ("span", "spans") and max_documents > 1:
        check.fail(
            f"a {kind} target holds one answer per instance; it cannot pack documents (packing.max_documents "
            f"is {max_documents})",
            *where,
            "kind",
        )
    common = dict(name=name, kind=kind, node_types=types, metric=metric, description=entry.get("description", ""))
    if kind == "global_labels":
        return _global_labels(entry, common, check, where)
    if kind == "choice":
        _need(entry, "attr", kind, check, where)
        null = entry.get("null_global")
        if null is not None and null not in global_prefix:
            check.fail(
                f"null_global names the global_prefix token that means 'none of them'; {null!r} is not in "
                f"global_prefix "
                f"({', '.join(global_prefix) or 'empty'})",
                *where,
                "null_global",
            )
        return TargetSpec(**common, attr=entry["attr"], null_global=null)
    if kind == "span":
        _need(entry, "type_attr", kind, check, where)
        _need(entry, "types", kind, check, where)
        answer_types = tuple(entry["types"])
        _unique(answer_types, check, (*where, "types"))
        return TargetSpec(**common, type_attr=entry["type_attr"], types=answer_types)
    _need(entry, "max_spans", kind, check, where)
    return TargetSpec(**common, max_spans=int(entry["max_spans"]))


def _global_labels(entry: Mapping, common: dict, check, where: tuple) -> TargetSpec:
    _need(entry, "attr", "global_labels", check, where)
    classes = tuple(entry.get("classes", (False, True)))
    _unique(classes, check, (*where, "classes"))
    default = entry.get("default")
    if default is not None and default not in classes:
        check.fail(f"default {default!r} is not one of the classes {list(classes)}", *where, "default")
    return TargetSpec(**common, attr=entry["attr"], classes=classes, default=default)


def _need(entry: Mapping, key: str, kind: str, check, where: tuple) -> None:
    if key not in entry:
        check.fail(f"a {kind} target needs `{key}`", *where)


def _unique(values: tuple, check, path: tuple) -> None:
    seen: list = []
    for i, value in enumerate(values):
        if any(value == s and type(value) is type(s) for s in seen):
            check.fail(f"{value!r} is listed twice", *path, i)
        seen.append(value)
