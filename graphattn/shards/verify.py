"""Everything a reader takes from a shard file is checked before it is used.

A shard may be damaged (a disk, a copy cut short) or altered by hand or by another program, and
still be a valid Parquet file. Training on it must not run on wrong data, and reading it must
not end in a traceback. Three layers of checks, each naming the file (and the row and column):

* the footer (`check_footer`): every ``graphattn.*`` key there, UTF-8, JSON of the right shape,
  values of the right types and in bounds; the layout and the label vocabulary agree; the file's
  columns are exactly the layout's, with its types;
* every decoded row group (`check_rows`): each row's arrays have the lengths its scalars say
  (L, G, its documents, its links), every index lies in its range (positions in [0, L) or
  [0, G), owners in [-1, G), documents in [0, D), labels in the LabelVocab, token ids under the
  tokenizer's vocabulary size, target classes in the schema's classes), character spans inside
  their document's text, no nulls where the format has none. Vectorized: numpy over the Arrow
  buffers of the whole row group, one pass per column, none per row;
* the done marker (`check_digest`): a compile directory's ``shard-N.done.json`` records the
  shard's size and sha256; a shard that no longer matches it was changed after it was written,
  which catches what the other checks cannot (a flipped flag, a swapped id, both still valid).
  Hashing reads every byte (0.6-1.2 GB/s per core); it happens once per version of a file: a
  verified stamp (`graphattn.shards.stamp`) keyed by the file's device, inode, size, mtime and
  ctime stands for the hash afterwards, so a re-run or a resume does not wait on it again.
  ``verify_sha256=False`` (command lines: ``--no-verify-sha256``) skips it on storage you trust.
  The row checks always run.

Across the shards of one source, `check_same_run` compares the schema, the label vocabulary,
the layout and the settings that shape the data.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from graphattn.errors import GraphattnError
from graphattn.shards.runfile import is_compile_directory
from graphattn.shards.stamp import file_version, stamp_holds, write_stamp

FOOTER_KEYS = ("format", "settings", "schema", "label_vocab", "layout", "shard")
LAYOUT_DTYPES = {
    "token": ("uint16", "int32"),
    "type": ("int16",),
    "gpos": ("int16", "int32"),
    "label": ("int8", "int16"),
    "doc": ("int8", "int16"),
}
LAYOUT_KEYS = (*LAYOUT_DTYPES, "levels", "features", "local_radius", "max_distance", "targets")
MAX_DISTANCE_LIMIT = 1 << 14  # relative distances: far past any schema's (ETC uses 12)
RADIUS_LIMIT = 1 << 16
TARGET_SIZE_LIMIT = 1 << 20  # values in one fixed-shape target row
ROW_SETTINGS = (  # the settings that decide what a row holds; others (inputs, shard size) may differ
    "shard_format",
    "schema_name",
    "schema_sha256",
    "tokenizer_sha256",
    "tokenizer_vocab_size",
    "packing",
    "format",
    "mapping_sha256",
    "html_options",
)
DIGEST_CHUNK = 1 << 20
MAX_MARKER_BYTES = 64 << 20  # a done marker lists its shard's rejected documents and label warnings


class ShardFormatError(GraphattnError):
    """A shard that is not one graphattn wrote, or that disagrees with its own footer."""


def _fail(path: str, message: str) -> ShardFormatError:
    return ShardFormatError(f"{message}; compile it again (or read a copy that is intact)", file=path)


# -- the footer ------------------------------------------------------------------------------
def footer_text(meta: Mapping[bytes, bytes], key: str, path: str) -> str:
    raw = meta.get(f"graphattn.{key}".encode())
    if raw is None:
        raise _fail(path, f"the footer has no key graphattn.{key} (a shard's footer holds {', '.join(FOOTER_KEYS)})")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _fail(path, f"footer key graphattn.{key} is not UTF-8 text (byte {err.start})") from None


def footer_json(meta: Mapping[bytes, bytes], key: str, path: str) -> dict:
    text = footer_text(meta, key, path)
    try:
        data = json.loads(text)
    except ValueError as err:
        raise _fail(path, f"footer key graphattn.{key} is not JSON ({' '.join(str(err).split())})") from None
    if not isinstance(data, dict):
        raise _fail(path, f"footer key graphattn.{key} holds {type(data).__name__}, expected a JSON object")
    return data


def _is_int(value: Any, lo: int = 0, hi: int = 1 << 62) -> bool:
    return type(value) is int and lo <= value < hi


def check_layout(data: dict, path: str) -> dict:
    """The footer's layout, every key present and typed (what `ShardColumns.from_dict` takes)."""
    where = "footer key graphattn.layout"
    missing = [k for k in LAYOUT_KEYS if k not in data]
    extra = sorted(set(data) - set(LAYOUT_KEYS))
    if missing or extra:
        what = f"lacks {', '.join(missing)}" if missing else f"has unknown key(s) {', '.join(extra)}"
        raise _fail(path, f"{where} {what}")
    for key, allowed in LAYOUT_DTYPES.items():
        if data[key] not in allowed:
            raise _fail(path, f"{where}: {key} is {data[key]!r}, expected one of {list(allowed)}")
    levels = data["levels"]
    if not (isinstance(levels, list) and all(isinstance(v, str) and v for v in levels)) or len(set(levels)) != len(
        levels
    ):
        raise _fail(path, f"{where}: levels must be a list of distinct names, got {str(levels)[:80]}")
    features = data["features"]
    if not isinstance(features, list) or not all(
        isinstance(f, list)
        and len(f) == 2
        and isinstance(f[0], str)
        and f[0].split(":", 1)[0] in ("global", "long")
        and f[1] in ("int32", "float32")
        for f in features
    ):
        raise _fail(path, f"{where}: features must be [side:name, int32 | float32] pairs, got {str(features)[:80]}")
    if not _is_int(data["local_radius"], 0, RADIUS_LIMIT):
        raise _fail(path, f"{where}: local_radius is {data['local_radius']!r}, expected an int in [0, {RADIUS_LIMIT})")
    if not _is_int(data["max_distance"], 0, MAX_DISTANCE_LIMIT):
        raise _fail(
            path, f"{where}: max_distance is {data['max_distance']!r}, expected an int in [0, {MAX_DISTANCE_LIMIT})"
        )
    targets = data["targets"]
    good = isinstance(targets, list)
    for entry in targets if good else ():
        good = (
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], str)
            and entry[0]
            and entry[1] in ("global", "")
            and isinstance(entry[2], list)
            and all(_is_int(n, 1, TARGET_SIZE_LIMIT) for n in entry[2])
            and (entry[1] == "" or not entry[2])
            and int(np.prod(entry[2])) < TARGET_SIZE_LIMIT
        )
        if not good:
            break
    names = [entry[0] for entry in targets] if good else []
    if not good or len(set(names)) != len(names):
        raise _fail(path, f"{where}: targets must be distinct [name, axis, shape] entries, got {str(targets)[:80]}")
    return data


def check_label_vocab(data: dict, layout: dict, path: str):
    """The footer's LabelVocab: well formed, and for the layout's max distance."""
    from graphattn.labels import LabelVocab

    where = "footer key graphattn.label_vocab"
    distance, extra = data.get("max_distance"), data.get("extra", [])
    if not _is_int(distance, 0, MAX_DISTANCE_LIMIT):
        raise _fail(path, f"{where}: max_distance is {distance!r}, expected an int in [0, {MAX_DISTANCE_LIMIT})")
    if not (isinstance(extra, list) and all(isinstance(x, str) for x in extra)) or not isinstance(
        data.get("names"), list
    ):
        raise _fail(path, f"{where}: expected names and extra as lists of label names")
    if distance != layout["max_distance"]:
        raise _fail(path, f"{where}: max_distance {distance} differs from the layout's {layout['max_distance']}")
    try:
        return LabelVocab.from_dict(data)
    except GraphattnError as err:
        raise _fail(path, f"{where}: {err.reason}") from None


def check_settings(settings: dict, shard: dict, num_rows: int, path: str) -> None:
    vocab = settings.get("tokenizer_vocab_size")
    if vocab is not None and not _is_int(vocab, 1, 1 << 31):
        raise _fail(path, f"footer key graphattn.settings: tokenizer_vocab_size is {vocab!r}, expected a positive int")
    for key in ("index", "documents", "instances", "rejected", "warnings", "first_document"):
        if key in shard and not _is_int(shard[key]):
            raise _fail(path, f"footer key graphattn.shard: {key} is {shard[key]!r}, expected an int >= 0")
    if "instances" in shard and shard["instances"] != num_rows:
        raise _fail(path, f"the footer says {shard['instances']} instances but the file holds {num_rows} rows")


def check_columns(found, expected, path: str) -> None:
    """The file's columns (an Arrow schema) are exactly the layout's, with its types."""
    have = {f.name: f.type for f in found}
    for field in expected:
        if field.name not in have:
            raise _fail(path, f"column {field.name!r} is missing (the layout in the footer declares it)")
        if have[field.name] != field.type:
            raise _fail(path, f"column {field.name!r} is {have[field.name]}, but the layout says {field.type}")
    known = {f.name for f in expected}
    extra = [name for name in have if name not in known]
    if extra:
        raise _fail(path, f"column {extra[0]!r} is not one the footer's layout declares")


# -- across the shards of one source ---------------------------------------------------------
def check_same_run(first, info) -> None:
    """Shards read together must share schema, labels, layout and the settings that shape rows."""
    differs = [
        what
        for what, same in (
            ("label vocabulary", info.label_vocab.names == first.label_vocab.names),
            ("layout", info.layout == first.layout),
            ("schema", info.schema_text == first.schema_text),
        )
        if not same
    ]
    settings = [k for k in ROW_SETTINGS if first.settings.get(k) != info.settings.get(k)]
    if settings:
        differs.append(f"settings ({', '.join(settings[:4])})")
    if differs:
        listed = ", ".join(differs[:-1]) + (" and " if len(differs) > 1 else "") + differs[-1]
        raise GraphattnError(
            f"this shard's {listed} differ from those of {first.path}: the shards come "
            "from different runs; load them separately",
            file=info.path,
        )


# -- the done marker ---------------------------------------------------------------------------
_VERIFIED: dict[tuple[str, tuple[int, ...]], str] = {}  # (path, file version) -> sha256 already checked here


def marker_of(path: str | os.PathLike) -> Path | None:
    """`shard-00000.done.json` beside `shard-00000.parquet` (None for a name without .parquet)."""
    path = Path(path)
    return path.with_name(path.name[: -len(".parquet")] + ".done.json") if path.name.endswith(".parquet") else None


def check_digest(path: str) -> None:
    """The shard matches the size and sha256 its done marker records, if it has one; in a compile
    directory (a compile's run.json beside it) it must have one. The bytes are hashed once per
    version of the file: a verified stamp (`graphattn.shards.stamp`) that matches the file's
    device, inode, size, mtime and ctime now, and the marker's sha256, stands for the hash."""
    recorded = _recorded(path)
    if recorded is None:
        return
    sha256, size = recorded
    stat = os.stat(path)
    version = file_version(stat)
    key = (os.path.abspath(path), tuple(version.values()))
    if _VERIFIED.get(key) == sha256:
        return
    if size != stat.st_size:
        raise ShardFormatError(
            f"the file has {stat.st_size:,} bytes but its done marker {marker_of(path).name} records {size}: "
            "it changed after it was written; compile it again (--no-verify-sha256 reads it unchecked)",
            file=path,
        )
    if not stamp_holds(path, sha256, version):
        digest = file_sha256(path)
        if digest != sha256:
            raise ShardFormatError(
                f"its sha256 differs from the one its done marker {marker_of(path).name} records: the file "
                "changed after it was written; compile it again (--no-verify-sha256 reads it unchecked)",
                file=path,
            )
        if file_version(os.stat(path)) != version:  # it changed while it was read: checked, but not stamped
            return
        write_stamp(path, sha256, version)
    _VERIFIED[key] = sha256


def check_digests(paths: list[str], workers: int | None = None) -> None:
    """`check_digest` of many shards, `workers` files at a time (default: up to 8, the cores
    there are): hashing releases the GIL, so a first run hashes at the storage's speed, not one
    core's. Raises the error of the first failing path, in path order."""
    workers = workers if workers is not None else min(8, os.cpu_count() or 1, len(paths))
    if workers <= 1 or len(paths) <= 1:
        for path in paths:
            check_digest(path)
        return
    from concurrent.futures import ThreadPoolExecutor

    def attempt(path: str) -> BaseException | None:
        try:
            check_digest(path)
        except Exception as err:  # raised below, in path order
            return err
        return None

    with ThreadPoolExecutor(workers) as pool:
        for err in pool.map(attempt, paths):
            if err is not None:
                raise err


def file_sha256(path: str) -> str:
    """The sha256 of a file's bytes, read in large chunks (the GIL released while hashing)."""
    with open(path, "rb") as handle:
        if hasattr(hashlib, "file_digest"):  # Python 3.11+
            return hashlib.file_digest(handle, "sha256").hexdigest()
        digest, buffer = hashlib.sha256(), bytearray(DIGEST_CHUNK)
        view = memoryview(buffer)
        while size := handle.readinto(buffer):
            digest.update(view[:size])
        return digest.hexdigest()


def _recorded(path: str) -> tuple[str, int] | None:
    """(sha256, bytes) that the shard's done marker records; None for a shard that needs none."""
    marker = marker_of(path)
    if marker is None:
        return None
    if not marker.is_file():
        if is_compile_directory(marker.parent):
            raise ShardFormatError(
                f"its done marker {marker.name} is missing: the compile did not finish this shard (finish it with "
                "graphattn compile --resume) or the marker was removed; --no-verify-sha256 reads it unchecked",
                file=path,
            )
        return None
    try:
        with open(marker, "rb") as handle:
            text = handle.read(MAX_MARKER_BYTES + 1)
        if len(text) > MAX_MARKER_BYTES:
            raise ValueError(f"over {MAX_MARKER_BYTES:,} bytes")
        recorded = json.loads(text)
    except (OSError, ValueError) as err:
        why = " ".join(str(err).split())
        raise ShardFormatError(f"its done marker {marker.name} cannot be read ({why})", file=path) from None
    sha256 = recorded.get("sha256") if isinstance(recorded, dict) else None
    if not isinstance(sha256, str) or len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ShardFormatError(f"its done marker {marker.name} records no sha256 (64 hex digits)", file=path)
    return sha256, recorded.get("bytes")


# -- target classes from a schema ------------------------------------------------------------
TYPE_IDS = "type ids"  # the entry of `target_classes` that bounds long and global type ids


def target_classes(schema: Any) -> dict[str, int]:
    """Per class-valued target array, how many classes the schema declares (labels lie in
    [0, n) or are -100): global_labels its classes, choice 2, a span's `_type` its types; and
    under `TYPE_IDS` one past the largest token type id the schema gives (node types, blocks)."""
    ids = [0, *(t.global_type_id for t in schema.node_types.values())]
    ids += [t.type_id for t in schema.node_types.values() if t.type_id is not None]
    ids += [schema.fixed_blocks.type_id] if schema.fixed_blocks is not None else []
    out = {TYPE_IDS: max(ids) + 1}
    for spec in schema.targets.values():
        if spec.kind == "global_labels":
            out[spec.name] = len(spec.classes)
        elif spec.kind == "choice":
            out[spec.name] = 2
        elif spec.kind == "span":
            out[f"{spec.name}_type"] = len(spec.types)
    return out


@functools.lru_cache(maxsize=8)
def _schema_of(text: str) -> Any:
    from graphattn.schema import load_schema
    from graphattn.schema.io import parse_bounded

    try:
        data, _ = parse_bounded(text, None)  # the schema loader's own bounds on size, depth and aliases
        return load_schema(data) if isinstance(data, dict) else None
    except (GraphattnError, RecursionError):
        return None


def footer_schema(info: Any) -> Any:
    """The Schema the footer carries, checked against the footer's layout and label vocabulary
    (both are made from it); None when the text is no schema (shards from `write_shards` with
    any text: training then needs --schema)."""
    schema = _schema_of(info.schema_text)
    if schema is None:
        return None
    vocab = info.settings.get("tokenizer_vocab_size")
    expected = type(info.layout).for_run(schema, vocab if isinstance(vocab, int) else 1 << 16)  # a ShardColumns
    expected = dataclasses.replace(expected, token=info.layout.token) if not isinstance(vocab, int) else expected
    differ = [f.name for f in dataclasses.fields(expected) if getattr(expected, f.name) != getattr(info.layout, f.name)]
    if differ:
        key = differ[0]
        raise _fail(
            info.path,
            f"the footer's layout says {key} {getattr(info.layout, key)!r}, but its schema gives "
            f"{getattr(expected, key)!r}",
        )
    if schema.label_vocab().names != info.label_vocab.names:
        raise _fail(info.path, "the footer's label vocabulary differs from the one its schema gives")
    return schema


def classes_from_footer(info: Any) -> dict[str, int] | None:
    """`target_classes` of the footer's schema (checked by `footer_schema`); None without one."""
    schema = footer_schema(info)
    return target_classes(schema) if schema is not None else None
