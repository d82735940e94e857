"""JSON record files: a JSON array, one JSON object, or JSON lines (``.gz`` read transparently).

A file is JSON lines when its suffix (before ``.gz``) is ``.jsonl``/``.ndjson``, or when its first
non-blank line is a whole JSON value that does not open an array (`is_json_lines`). JSON lines
stream: a multi-GB NQ file is never held whole, and a line is only parsed when asked for.

    iter_records(path)                       RecordRef per record; the first bad line raises
    iter_records(path, errors="yield")       ... a bad line comes as a RecordRef with `.error`
    scan_json_lines(path, start=, stop=)     non-blank lines (bytes, line number, byte offset), unparsed
    JsonLine.parse(file, index, errors=)     one line -> RecordRef

Corpus runs use the last two: they count and locate records once (offsets and line numbers),
then read byte ranges in workers, where every line, good or bad, is one document.
Errors are `IngestError`s naming the file and the line (JSON lines) or the JSON line/column of
an array file; `Record` adds the key path inside a record.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from graphattn.errors import IngestError, warn_label

JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")


@dataclass(frozen=True)
class RecordRef:
    """One record and where it came from.

    `line` and `offset` (the line's first byte, in the decompressed stream for ``.gz``) are set
    for JSON lines; `index` always (-1 for the one object of a single-object file). With
    ``errors="yield"`` a line that is no JSON comes with `error` set and `data` None.
    """

    data: Any
    file: str | None
    line: int | None
    index: int
    offset: int | None = None
    error: IngestError | None = None

    @property
    def base_path(self) -> tuple:
        """Key path prefix of the record: ``$[index]`` inside a JSON array, empty otherwise."""
        return () if self.line is not None or self.index < 0 else (self.index,)


@dataclass(frozen=True)
class JsonLine:
    """One non-blank line of a JSON-lines file, not yet parsed."""

    raw: bytes
    line: int  # 1-based line number
    offset: int  # byte offset of the line's start

    def parse(self, file: str | None, index: int, *, errors: str = "raise") -> RecordRef:
        """The line's record; not UTF-8 or not JSON raises IngestError (file, line), or with
        ``errors="yield"`` returns a RecordRef carrying that error."""
        try:
            data = json.loads(self.raw.rstrip(b"\r\n").decode("utf-8"))  # columns count within the line
        except UnicodeDecodeError as err:
            problem = IngestError(
                f"line is not UTF-8 ({err.reason} at byte {self.offset + err.start})", file=file, line=self.line
            )
        except json.JSONDecodeError as err:
            problem = IngestError(f"not valid JSON: {err.msg} (column {err.colno})", file=file, line=self.line)
        else:
            return RecordRef(data, file, self.line, index, self.offset)
        if errors != "yield":
            raise problem
        return RecordRef(None, file, self.line, index, self.offset, problem)


def _check_errors(errors: str) -> None:
    if errors not in ("raise", "yield"):
        raise ValueError(f"errors must be 'raise' or 'yield', got {errors!r}")


def _open(path: Path) -> BinaryIO:
    try:
        return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")
    except OSError as err:
        raise IngestError(f"cannot open: {err.strerror}", file=str(path)) from None


def _suffix(path: Path) -> str:
    """The suffix that says what a file holds: ``a.jsonl.gz`` -> ``.jsonl``."""
    name = path.name[:-3] if path.name.lower().endswith(".gz") else path.name
    return os.path.splitext(name)[1].lower()


def scan_json_lines(
    path: str | os.PathLike, *, start: int = 0, stop: int | None = None, first_line: int = 1
) -> Iterator[JsonLine]:
    """The non-blank lines of a JSON-lines file, unparsed, with line numbers and byte offsets.

    `start` must be the byte offset of a line's start, `first_line` that line's number (as an
    earlier scan gave them); lines starting at or after byte `stop` are left out. ``.gz`` files
    are decompressed from their beginning to reach `start` (scan them once, whole, instead).
    """
    path = Path(path)
    with _open(path) as handle:
        try:
            if start:
                handle.seek(start)
            position, number = start, first_line
            for raw in handle:
                if stop is not None and position >= stop:
                    return
                if raw.strip():
                    yield JsonLine(raw, number, position)
                position += len(raw)
                number += 1
        except (OSError, EOFError) as err:  # e.g. a truncated .gz
            raise IngestError(f"cannot read: {err}", file=str(path)) from None


def _first_line(path: Path) -> JsonLine:
    for line in scan_json_lines(path):
        return line
    raise IngestError("empty file: no JSON records", file=str(path))


def is_json_lines(path: str | os.PathLike) -> bool:
    """JSON lines: a .jsonl/.ndjson suffix, or a first line that is a whole JSON value (not ``[``).

    Raises IngestError for a file without any non-blank line.
    """
    path = Path(path)
    first = _first_line(path)
    if _suffix(path) in JSON_LINES_SUFFIXES:
        return True
    return not first.raw.lstrip().startswith(b"[") and first.parse(str(path), 0, errors="yield").error is None


def iter_records(path: str | os.PathLike, *, errors: str = "raise") -> Iterator[RecordRef]:
    """Yield the records of a JSON array, a single JSON object or a JSON-lines file (``.gz`` ok).

    With ``errors="yield"``, a JSON line that does not parse comes as a RecordRef with `error`
    set, and reading goes on; problems with the whole file (cannot open, not JSON at all, an
    array that does not parse) always raise IngestError.
    """
    _check_errors(errors)
    path = Path(path)
    if is_json_lines(path):
        source = str(path)
        for index, line in enumerate(scan_json_lines(path)):
            yield line.parse(source, index, errors=errors)
        return
    yield from _whole_document(path)


def _whole_document(path: Path) -> Iterator[RecordRef]:
    source = str(path)
    with _open(path) as handle:
        try:
            raw = handle.read()
        except (OSError, EOFError) as err:
            raise IngestError(f"cannot read: {err}", file=source) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise IngestError(f"file is not UTF-8 ({err.reason} at byte {err.start})", file=source) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise IngestError(f"not valid JSON: {err.msg} (column {err.colno})", file=source, line=err.lineno) from None
    if isinstance(data, list):
        for index, record in enumerate(data):
            yield RecordRef(record, source, None, index)
    else:
        yield RecordRef(data, source, None, -1)


# -- typed access into one record ------------------------------------------------------------
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


def doc_id_of(record: Record, key: str) -> str | None:
    """The record's id (a string or integer at `key`) as a string; None if it has none."""
    value = record.get(key, expect=(str, int), default=None)
    return None if value is None else str(value)
