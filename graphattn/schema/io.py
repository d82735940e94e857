"""Reading relation-schema files with line numbers, and validating them against the JSON Schema.

YAML nodes carry their line numbers; the loader keeps the line of every key path so that a
problem found later (by jsonschema here, or by the semantic checks in `graphattn.schema`) reads
``schemas/x.yaml:12: $.node_types.sentence.global: ...``. JSON files are composed as YAML for
their line numbers and then parsed strictly as JSON (YAML 1.1 reads some JSON differently).

A schema file comes from a user, so reading one is bounded before it costs anything: the file
size (MAX_SCHEMA_BYTES), nesting (MAX_DEPTH, checked while composing, so no RecursionError),
values with YAML aliases expanded (MAX_VALUES, counted without expanding: no alias bomb), no
recursive alias, and scalar sizes (a 5,000-digit integer is refused unread). Then `canonical`
applies one conversion to files and dicts alike (integral floats, string keys). Every failure is
a SchemaError with file and line.
"""

from __future__ import annotations

import difflib
import json
import numbers
import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from graphattn.errors import GraphattnError, SchemaError

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
JSON_SCHEMA_PATH = SCHEMA_DIR / "relation-schema.json"

Path_ = tuple  # a key path: ("node_types", "sentence", "global")


# -- bounds on the file itself (a schema file comes from a user: hostile input must not cost) ----
MAX_SCHEMA_BYTES = 256 << 10  # the shipped schemas are under 4 KB; pure-Python YAML reads ~100 KB/s
MAX_DEPTH = 32  # nesting levels; a schema needs 6 at most (node_types.x.where.attr[i])
MAX_VALUES = 10_000  # values after expanding YAML aliases; the shipped schemas hold under 120
MAX_NUMBER_CHARS = 100  # an integer or float written with more characters is refused unread
MAX_SCALAR_CHARS = 65_536  # any other scalar (a description) longer than this is refused

_TOO_MANY = f"holds more than {MAX_VALUES} values (YAML aliases expanded); a schema or mapping needs a few hundred"
_TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep (a relation schema needs 6)"
_STR_TAG, _MERGE_TAG = "tag:yaml.org,2002:str", "tag:yaml.org,2002:merge"
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with bounded nesting and no recursive aliases, whose constructor
    errors (``!!int x``, an impossible date) become SchemaErrors at the value's line.

    Aliases stay legal (anchors share node types); what they expand to is counted by
    `_walk_lines` before anything is constructed, so an alias bomb is refused unexpanded.
    """

    def __init__(self, text: str, source: str | None, error: type[GraphattnError] = SchemaError):
        super().__init__(text)
        self.source, self.error = source, error
        self._depth = self._values = 0
        self._open_anchors: set[str] = set()

    def _fail(self, message: str, mark) -> GraphattnError:
        return self.error(message, file=self.source, line=mark.line + 1 if mark is not None else None)

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                message = f"alias *{event.anchor} refers to a value that contains it (a recursive alias)"
                raise self._fail(message, event.start_mark)
            return super().compose_node(parent, index)
        if self._depth >= MAX_DEPTH:
            raise self._fail(_TOO_DEEP, event.start_mark)
        self._values += 1
        if self._values > MAX_VALUES:  # stop composing early; `_walk_lines` counts what aliases add
            raise self._fail(_TOO_MANY, event.start_mark)
        anchor = getattr(event, "anchor", None)
        self._depth += 1
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open_anchors.discard(anchor)

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError) as exc:
            if isinstance(exc, GraphattnError):
                raise
            raise self._fail(f"cannot read this {node.tag.rsplit(':', 1)[-1]} value: {exc}", node.start_mark) from None


def _walk_lines(
    node: yaml.Node, path: Path_, lines: dict, source: str | None, sizes: dict, error: type[GraphattnError]
) -> int:
    """Record the 1-based line of every key path and check every key and scalar before anything
    is constructed. Returns how many values `node` stands for with aliases expanded.

    A node reached a second time is an alias: it is counted (with its expanded size, memoized)
    but not walked again, so the walk is linear in the file; paths inside an alias report the
    line of the key that holds it. Duplicate keys are refused (YAML would keep the last).
    """
    if id(node) in sizes:
        return sizes[id(node)]
    lines.setdefault(path, node.start_mark.line + 1)

    def fail(message: str, at: yaml.Node, where: Path_ = path) -> GraphattnError:
        return error(message, file=source, line=at.start_mark.line + 1, path=where)

    size = 1
    if isinstance(node, yaml.ScalarNode):
        limit = MAX_NUMBER_CHARS if node.tag in _NUMBER_TAGS else MAX_SCALAR_CHARS
        if len(node.value) > limit:
            raise fail(_too_long("number" if node.tag in _NUMBER_TAGS else "value", len(node.value), limit), node)
    elif isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:  # `<<: *base`: the merged keys take the line of `<<`
                size += _walk_lines(value_node, path, lines, source, sizes, error)
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR_TAG:
                raise fail(
                    key_error(
                        key_node.value if isinstance(key_node, yaml.ScalarNode) else "a collection",
                        key_node.tag.rsplit(":", 1)[-1],
                    ),
                    key_node,
                )
            key = key_node.value
            if key in seen:
                raise fail(f"duplicate key {key!r} (first on line {seen[key]})", key_node)
            seen[key] = line
            lines[(*path, key)] = line
            size += 1 + _walk_lines(value_node, (*path, key), lines, source, sizes, error)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.setdefault((*path, i), item.start_mark.line + 1)
            size += _walk_lines(item, (*path, i), lines, source, sizes, error)
    if size > MAX_VALUES:
        raise fail(_TOO_MANY, node)
    sizes[id(node)] = size
    return size


def _too_long(what: str, length: int, limit: int) -> str:
    return f"a {what} of {length} characters is too long (at most {limit})"


def key_error(key: Any, kind: str) -> str:
    """The message for a key that is not a string (YAML reads `3:`, `true:`, `~:` as int, bool, null)."""
    return f"key {key!r} is not a string (it reads as {kind}); put it in quotes if it is a name"


def parse_bounded(text: str, source: str | None, error: type[GraphattnError] = SchemaError) -> tuple[Any, dict]:
    """Parse YAML or JSON text from a user within the bounds above, keeping the line of every key
    path (YAML marks; JSON is YAML too). Failures are `error`s with file and line, so other
    user-written YAML (ingest mappings) is read with the same guards and says IngestError.
    """
    is_json = bool(source and source.endswith(".json"))
    lines: dict = {}
    try:
        loader = _BoundedLoader(text, source, error)
        try:
            node = loader.get_single_node()
            if node is not None:
                _walk_lines(node, (), lines, source, {}, error)
            parsed = loader.construct_document(node) if node is not None and not is_json else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        if is_json:  # valid JSON that YAML 1.1 rejects (tabs...): no line numbers then
            return _parse_json(text, source, error), {}
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
        raise error(f"not valid YAML/JSON: {reason}", file=source, line=line) from None
    # A JSON file is read as JSON (YAML 1.1 reads some JSON differently, e.g. 1e5 as a string);
    # the YAML pass above has already bounded its depth and numbers and found its lines.
    return (_parse_json(text, source, error) if is_json else parsed), lines


def _parse_json(text: str, source: str | None, error: type[GraphattnError]) -> Any:
    try:
        return json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise error(f"not valid JSON: {exc.msg}", file=source, line=exc.lineno) from None
    except _LongNumber as exc:
        line = text.count("\n", 0, max(text.find(exc.text), 0)) + 1
        raise error(_too_long("number", len(exc.text), MAX_NUMBER_CHARS), file=source, line=line) from None
    except RecursionError:
        raise error(_TOO_DEEP, file=source, line=_json_deep_line(text)) from None


def read_bounded_text(path: Path, source: str, what: str, error: type[GraphattnError] = SchemaError) -> str:
    """The UTF-8 text of a user's YAML/JSON file, refused unread past MAX_SCHEMA_BYTES."""
    try:
        size = path.stat().st_size
        if size > MAX_SCHEMA_BYTES:
            raise error(f"{what} has {size} bytes, over the {MAX_SCHEMA_BYTES} a {what} may have", file=source)
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} is not UTF-8 ({exc.reason} at byte {exc.start})", file=source) from None
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror}", file=source) from None


class _LongNumber(Exception):
    def __init__(self, text: str):
        self.text = text


def _json_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _LongNumber(text)
    return int(text)


def _json_deep_line(text: str) -> int:
    """The line where JSON text first nests deeper than MAX_DEPTH (strings skipped)."""
    depth = 0
    for match in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', text):
        token = match.group()
        depth += 1 if token in "[{" else -1 if token in "]}" else 0
        if depth > MAX_DEPTH:
            return text.count("\n", 0, match.start()) + 1
    return 1


def read_schema_file(spec: str | os.PathLike | Mapping) -> tuple[Any, dict, str | None]:
    """(data, line of each key path, source) of a schema file or dict, in canonical form."""
    if isinstance(spec, Mapping):
        return canonical(spec, {}, None), {}, None
    if not isinstance(spec, (str, os.PathLike)):
        raise SchemaError(f"load_schema takes a path or a dict, got {type(spec).__name__}", path=("spec",))
    if not str(spec):
        raise SchemaError("the schema path is empty (pass a file, a shipped schema name or a dict)", path=("spec",))
    path = Path(spec)
    if not path.is_file():
        shipped = SCHEMA_DIR / f"{spec}.yaml"
        if isinstance(spec, str) and "/" not in spec and shipped.is_file():
            path = shipped  # a shipped schema by name: load_schema("etc-sentences")
        else:
            raise SchemaError(_no_such_schema(str(spec)), file=str(spec))
    source = str(spec) if path == Path(spec) else str(path)
    data, lines = parse_bounded(read_bounded_text(path, source, "schema file"), source)
    return canonical(data, lines, source), lines, source


def canonical(data: Any, lines: Mapping, source: str | None) -> Any:
    """The one conversion every schema goes through (file or dict), before JSON Schema sees it.

    Numbers: JSON Schema counts 3.0 as an integer, so an integral float becomes the int it
    equals (``local_radius: 3.0`` is 3, never a float reaching ``range()``); integers past 64
    bits are refused. Keys must be strings (YAML reads ``3:``, ``true:``, ``~:`` as others).
    Nesting is bounded by MAX_DEPTH and size by MAX_VALUES, which also stops a dict that
    contains itself. Tuples read as lists.
    """
    count = 0

    def fail(message: str, path: Path_) -> SchemaError:
        return SchemaError(message, file=source, line=line_of(lines, path), path=path)

    def convert(value: Any, path: Path_) -> Any:
        nonlocal count
        count += 1
        if count > MAX_VALUES:
            raise fail(_TOO_MANY, path)
        if len(path) > MAX_DEPTH:
            raise fail(_TOO_DEEP, path)
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return value
        if isinstance(value, numbers.Integral):
            if int(value).bit_length() > 63:
                raise fail("integer out of range (schema integers fit in 64 bits)", path)
            return int(value)
        if isinstance(value, numbers.Real):
            value = float(value)
            return int(value) if value.is_integer() and abs(value) < 2**63 else value
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise fail(key_error(key, _json_type(key)), (*path, str(key)))
                out[key] = convert(item, (*path, key))
            return out
        if isinstance(value, (list, tuple)):
            return [convert(item, (*path, i)) for i, item in enumerate(value)]
        return value  # JSON Schema names its type in the error (a date, a set...)

    return convert(data, ())


def _no_such_schema(spec: str) -> str:
    """What to say for a schema that is neither a file nor a shipped name: the shipped names, and
    the closest of them when the spec looks like a mistyped one."""
    import difflib

    names = sorted(p.stem for p in SCHEMA_DIR.glob("*.yaml"))
    close = difflib.get_close_matches(Path(spec).stem, names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"schema file does not exist, and it is not a shipped schema name{hint} (shipped: {', '.join(names)})"


@lru_cache(maxsize=1)
def _validator():
    import jsonschema

    schema = json.loads(JSON_SCHEMA_PATH.read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


_JSON_TYPE = {
    dict: "object",
    list: "array",
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
}


def _json_type(value: Any) -> str:
    return _JSON_TYPE.get(type(value), type(value).__name__)


def _describe(error) -> tuple[str, Path_]:
    """A message and key path for one jsonschema error, in the words a user expects."""
    path = tuple(error.absolute_path)
    value, kind, expected = error.instance, error.validator, error.validator_value
    if kind == "additionalProperties" and isinstance(value, dict):
        known = sorted(error.schema.get("properties", {}))
        unknown = [k for k in value if k not in known]
        key = unknown[0] if unknown else "?"
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (expected one of: {', '.join(known)})"
        return f"unknown key {key!r}{hint}", (*path, key)
    if kind == "required":  # located at the key that is missing (a dict schema has no line to name)
        missing = next((k for k in expected if isinstance(value, dict) and k not in value), None)
        if missing is None:
            return f"missing required key: {error.message.split(' ')[0]}", path
        return f"missing required key: {missing!r}", (*path, missing)
    if kind == "type":
        names = expected if isinstance(expected, list) else [expected]
        return f"expected {' or '.join(names)}, got {_json_type(value)} {value!r}", path
    if kind == "enum":
        return f"expected one of {', '.join(map(repr, expected))}, got {value!r}", path
    if kind in ("minimum", "exclusiveMinimum"):
        return f"must be >= {expected}, got {value!r}", path
    if kind in ("maximum", "exclusiveMaximum"):
        return f"must be <= {expected} (the documented bound), got {value!r}", path
    if kind == "minLength":
        return "must not be empty", path
    if kind == "minItems":
        return f"must have at least {expected} item(s)", path
    if kind in ("oneOf", "anyOf"):
        # An error inside the branch whose type did match says more than "matched no branch".
        inside = [e for e in error.context if e.validator != "type" or len(e.absolute_path) > len(path)]
        if inside:
            return _describe(max(inside, key=lambda e: len(e.absolute_path)))
        options = [s.get("type", "value") if isinstance(s, dict) else "value" for s in expected]
        flat = [o if isinstance(o, str) else " or ".join(o) for o in options]
        return f"expected {' or '.join(dict.fromkeys(flat))}, got {_json_type(value)} {value!r}", path
    return error.message, path


def validate(data: Any, lines: Mapping, source: str | None) -> None:
    if not isinstance(data, dict):
        raise SchemaError(
            f"a relation schema must be a mapping at the top level, got {_json_type(data)}", file=source, line=1
        )
    problems = []
    for error in _validator().iter_errors(data):
        message, path = _describe(error)
        line = line_of(lines, path)
        problems.append((line if line is not None else 1 << 30, len(path), message, path))
    if problems:
        problems.sort(key=lambda p: (p[0], -p[1]))
        line, _, message, path = problems[0]
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise SchemaError(message + more, file=source, line=line_of(lines, path), path=path)


def line_of(lines: Mapping, path: Path_) -> int | None:
    path = tuple(path)
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return lines.get(())
