"""Reading relation-schema files with line numbers, and validating them against the JSON Schema.

YAML nodes carry their line numbers; the loader keeps the line of every key path so that a
problem found later (by jsonschema here, or by the semantic checks in `graphattn.schema`) reads
``schemas/x.yaml:12: $.node_types.sentence.global: ...``. JSON files are parsed strictly as JSON
first (YAML accepts more) and then composed as YAML for their line numbers.
"""

from __future__ import annotations

import difflib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import yaml

from graphattn.errors import SchemaError

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
JSON_SCHEMA_PATH = SCHEMA_DIR / "relation-schema.json"

Path_ = tuple  # a key path: ("node_types", "sentence", "global")


def _walk_lines(node: yaml.Node, path: Path_, lines: dict, source: str | None) -> None:
    """Record the 1-based line of every key path; reject duplicate keys (YAML keeps the last)."""
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                raise SchemaError(f"duplicate key {key!r} (first on line {seen[key]})", file=source, line=line, path=path)
            seen[key] = line
            lines[(*path, key)] = line
            _walk_lines(value_node, (*path, key), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _walk_lines(item, (*path, i), lines, source)


def _parse_text(text: str, source: str | None) -> tuple[Any, dict]:
    """Parse YAML or JSON, keeping the line of every key path (YAML marks; JSON is YAML too)."""
    is_json = bool(source and source.endswith(".json"))
    data = _parse_json(text, source) if is_json else None  # strict JSON first: YAML accepts more
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            parsed = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        if is_json:  # valid JSON that YAML 1.1 rejects (tabs...): no line numbers then
            return data, {}
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
        raise SchemaError(f"not valid YAML/JSON: {reason}", file=source, line=line) from None
    lines: dict = {}
    if node is not None:
        _walk_lines(node, (), lines, source)
    return (data if is_json else parsed), lines


def _parse_json(text: str, source: str | None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"not valid JSON: {exc.msg}", file=source, line=exc.lineno) from None


def read_schema_file(spec: str | os.PathLike | Mapping) -> tuple[Any, dict, str | None]:
    if isinstance(spec, Mapping):
        return dict(spec), {}, None
    if not isinstance(spec, (str, os.PathLike)):
        raise SchemaError(f"load_schema takes a path or a dict, got {type(spec).__name__}")
    path = Path(spec)
    if not path.is_file():
        shipped = SCHEMA_DIR / f"{spec}.yaml"
        if isinstance(spec, str) and "/" not in spec and shipped.is_file():
            path = shipped  # a shipped schema by name: load_schema("etc-sentences")
        else:
            raise SchemaError(_no_such_schema(str(spec)), file=str(spec))
    source = str(spec) if path == Path(spec) else str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SchemaError(f"schema file is not UTF-8 ({exc.reason} at byte {exc.start})", file=source) from None
    data, lines = _parse_text(text, source)
    return data, lines, source


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


_JSON_TYPE = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null"}


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
    if kind == "required":
        return f"missing required key: {error.message.split(' ')[0]}", path
    if kind == "type":
        names = expected if isinstance(expected, list) else [expected]
        return f"expected {' or '.join(names)}, got {_json_type(value)} {value!r}", path
    if kind == "enum":
        return f"expected one of {', '.join(map(repr, expected))}, got {value!r}", path
    if kind in ("minimum", "exclusiveMinimum"):
        return f"must be >= {expected}, got {value!r}", path
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
        raise SchemaError(f"a relation schema must be a mapping at the top level, got {_json_type(data)}", file=source, line=1)
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
