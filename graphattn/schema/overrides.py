"""Schema values from the command line: ``--set KEY=VALUE`` of `graphattn compile` and `graphattn train`.

    graphattn compile data/ --schema etc-sentences --set relative_pos_max_distance=42 \\
        --set relative_vocab_size=88 --out shards/

KEY is a top-level key or a dotted path into sections (``masks.hard_g2l``,
``special_tokens.global``, ``node_types.paragraph.global_token``); a missing section is made.
VALUE is read as one YAML scalar (``3`` an int, ``true`` a bool, ``null``, ``'x'`` a string);
text that YAML would read as a list or mapping (``[unused0]``) stays the string it spells, since
a value set here is one scalar. The schema with every override is validated as a whole (the
relation schema's JSON Schema, then `load_schema`'s own checks), and a problem is one line that
names the ``--set`` at fault. What the overrides make is the effective schema: its text
(`effective_text`; `graphattn.schema.load_effective_schema` loads both) is what shard footers and
run.json record, so a run says what it compiled with.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from graphattn.errors import SchemaError, format_path
from graphattn.schema.io import Path_, canonical, parse_bounded

MAX_SETS = 64  # --set flags per command; a schema has a few dozen settable values
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$")


def parse_set(text: str) -> tuple[tuple[str, ...], Any]:
    """``"KEY=VALUE"`` -> (key path, value); a malformed one is a one-line `SchemaError` naming it."""
    if not isinstance(text, str) or "=" not in text:
        raise SchemaError(f"--set {text}: expected KEY=VALUE, e.g. --set relative_pos_max_distance=3")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not _KEY.match(key):
        raise SchemaError(
            f"--set {text}: {key!r} is not a schema key (a top-level key or a dotted path such as masks.hard_g2l)"
        )
    try:
        value, _ = parse_bounded(raw, None) if raw.strip() else (None, {})
    except SchemaError as err:
        raise SchemaError(f"--set {key}: the value {raw!r} does not read as YAML ({err.reason})") from None
    if isinstance(value, (dict, list)):
        value = raw.strip()  # [unused0], {x}: one scalar, the text as written
    return tuple(key.split(".")), value


def apply_sets(data: Mapping, sets: Sequence[str]) -> tuple[dict, list[tuple[tuple[str, ...], str]]]:
    """A copy of a schema's data with each ``KEY=VALUE`` of `sets` applied, and (key path, flag) of each."""
    if len(sets) > MAX_SETS:
        raise SchemaError(f"--set is given {len(sets)} times; at most {MAX_SETS}")
    out = _copy(data)
    applied: list[tuple[tuple[str, ...], str]] = []
    for text in sets:
        path, value = parse_set(text)
        node = out
        for depth, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                raise SchemaError(
                    f"--set {'.'.join(path)}: {where} holds a {type(child).__name__}, not a section with keys"
                )
            node = child
        node[path[-1]] = value
        applied.append((path, text))
    return out, applied


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(v) for v in value]
    return value


def _blame(path: Path_, applied: list[tuple[tuple[str, ...], str]]) -> str:
    """The --set flags an error at `path` comes from: the one whose key it is (or holds), else all."""
    named = [text for key, text in applied if tuple(path[: len(key)]) == key or tuple(key[: len(path)]) == path]
    return " ".join(f"--set {text}" for text in (named or [text for _, text in applied]))


def with_sets(data: Mapping, lines: Mapping, source: str | None, sets: Sequence[str]):
    """(data, lines, applied) of a schema read from `source` with `sets` applied, in canonical form;
    the file's lines no longer say where an overridden value came from, so they are left out."""
    data, applied = apply_sets(data, sets)
    lines = {p: line for p, line in lines.items() if not any(tuple(p[: len(k)]) == k for k, _ in applied)}
    try:
        return canonical(data, lines, source), lines, applied
    except SchemaError as err:
        raise blamed(err, applied, source) from None


def blamed(err: SchemaError, applied: list[tuple[tuple[str, ...], str]], source: str | None) -> SchemaError:
    """A problem of the schema the overrides made, as one line that names the ``--set`` at fault."""
    path = tuple(err.location.path)
    exact = any(path == key for key, _ in applied)
    at = f" (at {format_path(path)} of {source or 'the schema'})" if path and not exact else ""
    return SchemaError(f"{_blame(path, applied)}: {err.reason}{at}")


def effective_text(data: Mapping, source: str | None, sets: Sequence[str]) -> str:
    """The text a run records for a schema with `sets` applied: YAML (comments are not kept),
    headed by the file and the flags."""
    flags = " ".join(f"--set {text}" for text in sets)
    return f"# {source or 'schema'} with {flags}\n" + yaml.safe_dump(dict(data), sort_keys=False, allow_unicode=True)
