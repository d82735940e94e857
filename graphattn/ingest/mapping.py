"""Generic JSON -> DocGraph, driven by a mapping that says what each key of a record is.

The mapping is an ingest option (a dict, or a YAML/JSON file given to `load_mapping`), kept apart
from the relation schema: the schema says how a graph lowers into ETC inputs, the mapping how a
JSON record becomes that graph; one schema serves records of many shapes. A mapping is a *spec*
applied to the record; a spec applied to a JSON value says:

``type``       make a node of this type for the value; its span covers the value's text.
``fields``     the value is an object (string keys) or a tuple-like list (integer keys): apply
               each key's spec, in the order listed. Keys not listed are ignored; a listed key
               that is missing is an error unless its spec says ``optional: true``.
``each``       the value is a list: apply this spec to every item (a container of nodes).
``separator``  text put between the pieces of text inside this value (default ``"\\n"``).
``id``         key of the object whose value becomes the node id (default ``<type><n>``).
``attrs``      keys of the object copied into node attrs (a list, or {attr name: key}).
``links``      {key: relation}: the key holds a node id (or a list of them) of this record;
               adds an edge ``this -relation-> that``. Dangling ids are errors.
``relation``   relation of the edge from the enclosing node to this one (default ``contains``;
               ``null`` for none).
``optional``   a missing key (or null value) is skipped instead of being an error.

A value with neither ``fields`` nor ``each`` holds text: a string (or number), stripped; empty
text makes no node. Top level only: ``id`` names the record's doc-id key, ``root`` the type of a
node ``doc`` spanning the whole text (the parent of top-level nodes). Example, HotpotQA::

    id: _id
    separator: "\\n\\n"
    fields:
      question: {type: question}
      context:
        each:
          type: paragraph
          fields:
            0: {type: title}
            1: {each: {type: sentence}, separator: " "}
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphattn.errors import IngestError
from graphattn.graph import CONTAINS, DocGraph
from graphattn.graph.columns import MISSING
from graphattn.ingest.json import Record
from graphattn.schema.io import parse_bounded, read_bounded_text

_SPEC_KEYS = ("type", "fields", "each", "separator", "id", "attrs", "links", "relation", "optional")
_TOP_KEYS = ("root",)


@dataclass(frozen=True)
class Spec:
    """One validated spec (see the module docstring)."""

    type: str | None = None
    fields: tuple[tuple[str | int, Spec], ...] = ()
    each: Spec | None = None
    separator: str = "\n"
    id: str | None = None
    attrs: tuple[tuple[str, str], ...] = ()
    links: tuple[tuple[str, str], ...] = ()
    relation: str | None = CONTAINS
    optional: bool = False
    root: str | None = None


def load_mapping(spec: Mapping | str | os.PathLike | Spec) -> Spec:
    """Validate a mapping given as a dict or a YAML/JSON file; errors name file and key path."""
    if isinstance(spec, Spec):
        return spec
    source = None
    if not isinstance(spec, Mapping):
        source = str(spec)
        text = read_bounded_text(Path(spec), source, "mapping", IngestError)
        spec, lines = parse_bounded(text, source, IngestError)
        try:
            return _spec(spec, (), source, top=True)
        except IngestError as err:  # the key path's line, found while parsing
            where = err.location
            if where.line is not None or tuple(where.path) not in lines:
                raise
            raise IngestError(err.reason, file=source, line=lines[tuple(where.path)], path=where.path) from None
    return _spec(spec, (), source, top=True)


def _spec(raw: Any, path: tuple, source: str | None, top: bool = False) -> Spec:
    if not isinstance(raw, Mapping):
        raise IngestError(f"a mapping spec must be an object, got {type(raw).__name__}", file=source, path=path)
    allowed = _SPEC_KEYS + (_TOP_KEYS if top else ())
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (expected one of: {', '.join(allowed)})"
            raise IngestError(f"unknown mapping key {key!r}{hint}", file=source, path=(*path, key))
    if "fields" in raw and "each" in raw:
        raise IngestError("a spec has `fields` (an object) or `each` (a list), not both", file=source, path=path)

    def text_of(key: str, default: Any) -> Any:
        value = raw.get(key, default)
        if value is not None and not isinstance(value, str):
            raise IngestError(f"expected a string, got {type(value).__name__}", file=source, path=(*path, key))
        return value

    fields_raw = raw.get("fields", {})
    if not isinstance(fields_raw, Mapping):
        raise IngestError("`fields` must map keys to specs", file=source, path=(*path, "fields"))
    fields = tuple((_field_key(k), _spec(v, (*path, "fields", k), source)) for k, v in fields_raw.items())
    attrs_raw = raw.get("attrs", [])
    attrs = tuple((a, a) for a in attrs_raw) if isinstance(attrs_raw, list) else tuple(dict(attrs_raw).items())
    links = tuple(dict(raw.get("links", {})).items())
    return Spec(
        type=text_of("type", None),
        fields=fields,
        each=_spec(raw["each"], (*path, "each"), source) if "each" in raw else None,
        separator=text_of("separator", "\n"),
        id=text_of("id", None),
        attrs=attrs,
        links=links,
        relation=text_of("relation", CONTAINS),
        optional=bool(raw.get("optional", False)),
        root=text_of("root", None) if top else None,
    )


def _field_key(key: Any) -> str | int:
    """YAML gives `0:` as an int; JSON only has string keys, so "0" also means index 0."""
    if isinstance(key, str) and key.isdigit():
        return int(key)
    return key


@dataclass
class _Build:
    record: Record
    parts: list[str] = field(default_factory=list)
    length: int = 0
    pending: str | None = None
    nodes: list[tuple[str, str, tuple[int, int] | None, dict, str | None, str | None]] = field(default_factory=list)
    links: list[tuple[str, str, Any, tuple]] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)

    def emit(self, text: str) -> tuple[int, int]:
        if self.length and self.pending:
            self.parts.append(self.pending)
            self.length += len(self.pending)
        self.pending = None
        start = self.length
        self.parts.append(text)
        self.length += len(text)
        return start, self.length


def json_graph(record: Record | Any, mapping: Mapping | str | os.PathLike | Spec) -> DocGraph:
    """Build a DocGraph from one JSON record with a mapping (see the module docstring): the
    mapping's walk collects the nodes, and the graph is built from their columns in one call."""
    record = record if isinstance(record, Record) else Record(record)
    spec = load_mapping(mapping)
    build = _Build(record)
    doc_id = record.get(spec.id, expect=(str, int)) if spec.id else None
    top = Spec(fields=spec.fields, each=spec.each, separator=spec.separator, attrs=spec.attrs, links=spec.links)
    _apply(build, top, record.data, (), parent="doc" if spec.root else None)
    text = "".join(build.parts)
    nodes = build.nodes
    if spec.root:
        nodes = [("doc", spec.root, (0, len(text)), {}, None, None), *nodes]
    ids = [node[0] for node in nodes]
    row_of = {node_id: row for row, node_id in enumerate(ids)}
    parent_edges = [
        (row_of[node[4]], node[5], row) for row, node in enumerate(nodes) if node[4] is not None and node[5] is not None
    ]
    names = dict.fromkeys(name for node in nodes for name in node[3])  # columns in first-use order
    graph = DocGraph.from_columns(
        text,
        ids,
        [node[1] for node in nodes],
        np.array([node[2] for node in nodes], dtype=np.int64).reshape(-1, 2),
        {name: [node[3].get(name, MISSING) for node in nodes] for name in names},
        _edge_columns(parent_edges),
        doc_id=None if doc_id is None else str(doc_id),
        source=record.file,
    )
    links = []  # checked once the nodes are (so a node error comes first, as it would node by node)
    for src, relation, target, path in build.links:
        targets = target if isinstance(target, list) else [target]
        for i, dst in enumerate(targets):
            where = path if not isinstance(target, list) else (*path, i)
            if not isinstance(dst, (str, int)) or isinstance(dst, bool):
                raise record.error(f"a link must name a node id (string or integer), got {dst!r}", *where)
            if str(dst) not in row_of:
                raise record.error(f"link to node id {str(dst)!r}, which this record does not define", *where)
            links.append((row_of[src], relation, row_of[str(dst)]))
    graph.add_edges(*_edge_columns(links))
    return graph


def _edge_columns(edges: list[tuple[int, str, int]]) -> tuple[list[int], list[str], list[int]]:
    """(source rows, relations, target rows) of (source row, relation, target row) triples."""
    return [e[0] for e in edges], [e[1] for e in edges], [e[2] for e in edges]


def _apply(build: _Build, spec: Spec, value: Any, path: tuple, parent: str | None) -> bool:
    """Apply `spec` to `value` at `path`; True if it produced any text."""
    node_index, links_before = None, len(build.links)
    if spec.type is not None:
        node_id = _node_id(build, spec, value, path)
        attrs = {name: value.get(key) for name, key in spec.attrs} if isinstance(value, dict) else {}
        node_index = len(build.nodes)
        build.nodes.append((node_id, spec.type, None, attrs, parent, spec.relation))
        for key, relation in spec.links:
            if isinstance(value, dict) and key in value and value[key] is not None:
                build.links.append((node_id, relation, value[key], (*path, key)))
        parent = node_id
    start = build.length + (len(build.pending) if build.length and build.pending else 0)
    if spec.fields:
        produced = _apply_fields(build, spec, value, path, parent)
    elif spec.each is not None:
        produced = _apply_each(build, spec, value, path, parent)
    else:
        produced = _apply_text(build, value, path)
    if node_index is not None:
        node = build.nodes[node_index]
        if not produced:  # a node without text is not made, nor its (textless) children
            for dropped in build.nodes[node_index:]:
                build.ids.discard(dropped[0])
            del build.nodes[node_index:]
            del build.links[links_before:]
            return False
        build.nodes[node_index] = (node[0], node[1], (start, build.length), *node[3:])
    return produced


def _apply_fields(build: _Build, spec: Spec, value: Any, path: tuple, parent: str | None) -> bool:
    produced = False
    for key, child in spec.fields:
        if isinstance(key, int):
            if not isinstance(value, list):
                raise build.record.error(f"expected a list (fields are indices), got {type(value).__name__}", *path)
            present = key < len(value) and value[key] is not None
        else:
            if not isinstance(value, dict):
                raise build.record.error(f"expected an object, got {type(value).__name__}", *path)
            present = value.get(key) is not None
        if not present:
            if child.optional:
                continue
            raise build.record.error(f"missing key {key!r}" if isinstance(key, str) else f"missing item {key}", *path)
        if _apply(build, child, value[key], (*path, key), parent):
            produced = True
            build.pending = spec.separator
    return produced


def _apply_each(build: _Build, spec: Spec, value: Any, path: tuple, parent: str | None) -> bool:
    if not isinstance(value, list):
        raise build.record.error(f"expected a list, got {type(value).__name__}", *path)
    produced = False
    for i, item in enumerate(value):
        if _apply(build, spec.each, item, (*path, i), parent):
            produced = True
            build.pending = spec.separator
    return produced


def _apply_text(build: _Build, value: Any, path: tuple) -> bool:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        kind = "an object" if isinstance(value, dict) else "a list" if isinstance(value, list) else type(value).__name__
        raise build.record.error(
            f"expected text (a string), got {kind}; give this key `fields:` or `each:` in the mapping", *path
        )
    text = str(value).strip()
    if not text:
        return False
    build.emit(text)
    return True


def _node_id(build: _Build, spec: Spec, value: Any, path: tuple) -> str:
    if spec.id is not None:
        if (
            not isinstance(value, dict)
            or not isinstance(value.get(spec.id), (str, int))
            or isinstance(value.get(spec.id), bool)
        ):
            raise build.record.error(f"expected key {spec.id!r} holding the node id (a string or integer)", *path)
        node_id = str(value[spec.id])
    else:
        count = build.counters.get(spec.type, 0)
        build.counters[spec.type] = count + 1
        node_id = f"{spec.type}{count}"
    if node_id in build.ids:
        raise build.record.error(f"node id {node_id!r} is used twice in this record", *path)
    build.ids.add(node_id)
    return node_id
