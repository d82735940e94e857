"""Verified stamps: a shard's sha256 is checked once per version of the file, not once per run.

Hashing every shard before the first step of every run and every resume costs minutes per
hundred gigabytes while the accelerators wait, and tells nothing new when the files have not
changed since they were last hashed. After a shard's bytes match the sha256 its done marker
records, a small stamp is written that says "this version of this file had that sha256". A
version is what the file system says about the file, all of which any write changes:

    device, inode   which file (a copy or a replacement is another file: another inode)
    bytes           its size
    mtime_ns        when its bytes last changed
    ctime_ns        when its bytes or its metadata last changed; no user can set it, so a
                    rewrite whose mtime is put back (``touch -d``) still differs

A later check trusts the stamp only when every one of these equals the file's ``stat`` now, the
stamp names this file (its resolved path) and records the sha256 the done marker records now.
Anything else (another file's stamp, a changed shard, a changed marker, a damaged or foreign
stamp) is ignored and the file is hashed again; a stamp never makes a check fail, and a stamp
that cannot be written (a read-only directory) only means hashing next time too.

A stamp is written only when the file's stat was the same before and after hashing, and its
mtime is at least `SETTLE_NS` old, so that a write landing in the same tick of the file
system's clock as the last one (same size, same timestamps) cannot hide behind a stamp.

Where: ``.shard-00000.parquet.verified.json`` beside the shard (a hidden name: listings of
``*.parquet`` and ``*.done.json`` never see it); where that directory cannot be written, under
``$GRAPHATTN_CACHE_DIR`` (default ``$XDG_CACHE_HOME/graphattn`` or ``~/.cache/graphattn``),
``verified/<sha256 of the resolved path>.json``. Both are read; the first that can be written is.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

STAMP_FORMAT = "graphattn-verified/1"
SETTLE_NS = 2_000_000_000  # a file written less than this long ago is hashed but not stamped
MAX_STAMP_BYTES = 4096  # a stamp is ~400 bytes; anything larger is not one of ours
VERSION_KEYS = ("device", "inode", "bytes", "mtime_ns", "ctime_ns")


def file_version(stat: os.stat_result) -> dict[str, int]:
    """What identifies one version of a file: which file it is, its size, and its two change times."""
    return {
        "device": stat.st_dev,
        "inode": stat.st_ino,
        "bytes": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
    }


def cache_dir() -> Path:
    """The per-user directory for stamps that cannot lie beside their shard."""
    root = os.environ.get("GRAPHATTN_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "graphattn"


def stamp_paths(path: str | os.PathLike) -> list[Path]:
    """Where the stamp of `path` may lie: beside it, then in the cache directory."""
    resolved = Path(os.path.realpath(path))
    beside = resolved.with_name(f".{resolved.name}.verified.json")
    try:
        cached = cache_dir() / "verified" / f"{hashlib.sha256(str(resolved).encode()).hexdigest()}.json"
    except RuntimeError:  # no home directory to find a cache in
        return [beside]
    return [beside, cached]


def _read(stamp: Path) -> Any:
    try:
        with open(stamp, "rb") as handle:
            data = handle.read(MAX_STAMP_BYTES + 1)
        return None if len(data) > MAX_STAMP_BYTES else json.loads(data)
    except (OSError, ValueError):  # missing, unreadable, not JSON, not UTF-8: not a stamp
        return None


def stamp_holds(path: str | os.PathLike, sha256: str, version: dict[str, int]) -> bool:
    """Whether a stamp says that this very version of `path` was hashed to `sha256`."""
    resolved = os.path.realpath(path)
    for stamp in stamp_paths(path):
        data = _read(stamp)
        if (
            isinstance(data, dict)
            and data.get("format") == STAMP_FORMAT
            and data.get("path") == resolved
            and data.get("sha256") == sha256
            and all(type(data.get(key)) is int and data[key] == version[key] for key in VERSION_KEYS)
        ):
            return True
    return False


def write_stamp(path: str | os.PathLike, sha256: str, version: dict[str, int]) -> Path | None:
    """Record that this version of `path` hashed to `sha256` (best effort: the first place that can
    be written; None when none can, or when the file is too fresh to stamp safely)."""
    if time.time_ns() - version["mtime_ns"] < SETTLE_NS:
        return None
    text = json.dumps(
        {"format": STAMP_FORMAT, "path": os.path.realpath(path), "sha256": sha256, **version}, sort_keys=True
    )
    for stamp in stamp_paths(path):
        tmp = stamp.with_name(f"{stamp.name}.tmp-{os.getpid()}")
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, stamp)  # atomic: a reader sees the old stamp or the new one, never half
            return stamp
        except OSError:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
    return None
