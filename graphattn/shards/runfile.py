"""run.json of a compile directory: what `graphattn compile` records, read by its format version.

``graphattn compile --out DIR`` writes ``DIR/run.json`` (`graphattn.corpus.output`): the settings,
the input fingerprints, the document and shard counts, and ``"format": "graphattn-run/<version>"``.
Every reader takes the version from that key and reads the file by the rules of that version:
one reader per version in `READERS`, each checking that every key the version has is present
and of its type. Nothing is inferred from keys that are missing: a file without a format, of
another program (a `graphattn train` run.json), or of a version this graphattn does not know
(written by a newer one) is refused in one line that says which. A later version adds its
reader here and converts older files to the current shape in the readers of older versions.

It lives with the shard format (not with the compiler) because shard readers ask it too: a
directory whose run.json is a compile's must hold a done marker for each shard.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphattn.errors import GraphattnError

RUN_FILE = "run.json"
RUN_FORMAT_NAME = "graphattn-run"
RUN_FORMAT_VERSION = 1  # what `graphattn compile` writes now
RUN_FORMAT = f"{RUN_FORMAT_NAME}/{RUN_FORMAT_VERSION}"
MAX_RUN_BYTES = 256 << 20  # run.json lists every input file with its fingerprint: ~200 bytes each


class RunFileError(GraphattnError):
    """A compile directory's run.json that cannot be read as the version it says it is."""


def format_version(value: Any) -> int | None:
    """The version in a compile run.json's ``format`` (``"graphattn-run/1"`` -> 1); None when the
    value names no compile run.json format."""
    if not isinstance(value, str) or not value.startswith(RUN_FORMAT_NAME + "/"):
        return None
    digits = value[len(RUN_FORMAT_NAME) + 1 :]
    return int(digits) if digits.isdigit() and len(digits) <= 6 and not digits.startswith("0") else None


def _load(path: Path) -> Any:
    """run.json's JSON, its size bounded before it is read."""
    where = str(path)
    try:
        if not path.is_file():  # a FIFO would block the open, a directory fail it
            if path.exists():
                raise RunFileError(f"{RUN_FILE} is not a regular file", file=where)
            raise FileNotFoundError(where)
        with open(path, "rb") as handle:
            raw = handle.read(MAX_RUN_BYTES + 1)
    except FileNotFoundError:
        raise RunFileError(f"no {RUN_FILE} here", file=where) from None
    except OSError as err:
        raise RunFileError(f"cannot read {RUN_FILE}: {err.strerror or err}", file=where) from None
    if len(raw) > MAX_RUN_BYTES:
        raise RunFileError(f"{RUN_FILE} is larger than {MAX_RUN_BYTES:,} bytes, more than compile writes", file=where)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as err:  # not JSON, not UTF-8, nested past Python's stack
        raise RunFileError(f"{RUN_FILE} is damaged ({' '.join(str(err).split())[:120]})", file=where) from None


def read_run(path: str | os.PathLike) -> dict[str, Any]:
    """A compile run.json, read by the version its ``format`` names and checked by that
    version's reader; in the shape of the current version."""
    path = Path(path)
    where = str(path)
    data = _load(path)
    if not isinstance(data, dict):
        raise RunFileError(f"{RUN_FILE} must hold a JSON object, found {type(data).__name__}", file=where)
    if "format" not in data:
        raise RunFileError(
            f"{RUN_FILE} has no format key, so it says no version to read it by; graphattn compile has always "
            f"written one ({RUN_FORMAT!r}), so this file is not a compile's",
            file=where,
        )
    found = data["format"]
    version = format_version(found)
    if version is None:
        other = "a graphattn train run's" if isinstance(found, str) and found.startswith("graphattn-train/") else "not"
        raise RunFileError(
            f"{RUN_FILE} has format {str(found)[:60]!r}: {other} a compile run.json ({RUN_FORMAT_NAME}/<version>)",
            file=where,
        )
    reader = READERS.get(version)
    if reader is None:
        raise RunFileError(
            f"{RUN_FILE} has format {found!r}, written by a newer graphattn; this one reads versions "
            f"{', '.join(map(str, sorted(READERS)))} ({RUN_FORMAT!r}): use the graphattn that wrote it",
            file=where,
        )
    return reader(data, where)


def _read_v1(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Version 1: format, settings (an object), inputs (fingerprints: objects with a path), documents
    and shards (counts). Every key is required: version 1 has always written all of them."""

    def fail(key: str, expected: str) -> RunFileError:
        value = data.get(key)
        got = "missing" if key not in data else f"{type(value).__name__} {str(value)[:40]}"
        return RunFileError(f"{RUN_FILE} ({RUN_FORMAT_NAME}/1): {key} must be {expected}, got {got}", file=where)

    if not isinstance(data.get("settings"), dict):
        raise fail("settings", "an object")
    inputs = data.get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(f, dict) and isinstance(f.get("path"), str) for f in inputs):
        raise fail("inputs", "a list of input fingerprints (objects with a path)")
    for key in ("documents", "shards"):
        if type(data.get(key)) is not int or data[key] < 0:
            raise fail(key, "a count (an integer >= 0)")
    return data


READERS: dict[int, Callable[[dict[str, Any], str], dict[str, Any]]] = {1: _read_v1}


def is_compile_directory(directory: str | os.PathLike) -> bool:
    """Whether shards in `directory` must have done markers: it holds a run.json that is not a
    `graphattn train` run's (a compile's of any version, or one that cannot be read: the safe side)."""
    path = Path(directory) / RUN_FILE
    if not os.path.lexists(path):
        return False
    try:
        data = _load(path)
    except RunFileError:
        return True
    found = data.get("format") if isinstance(data, dict) else None
    return not (isinstance(found, str) and found.startswith("graphattn-train/"))
