"""The output directory of a corpus compile, and how a killed run picks up where it stopped.

    DIR/run.json                 settings, input fingerprints, document and shard counts
    DIR/shard-00000.parquet      compiled instances of documents [0, shard_size)
    DIR/shard-00000.done.json    written after the shard's atomic rename: its size, sha256,
                                 counts and rejected documents
    DIR/rejected.jsonl           every rejected document in input order (rebuilt at the end)
    DIR/warnings.jsonl           every label that matched nothing (`LabelWarning`), in input order,
                                 one line per label, in the shape of rejected.jsonl (rebuilt at the end)

A shard counts as done only when its marker exists and the file matches the marker's size and
sha256, so a run killed at any point (mid-write, between file and marker) leaves nothing that
resume would trust wrongly. Resume recomputes exactly the shards that are not done; because a
shard's documents are fixed by its number, nothing is compiled twice or skipped.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphattn.corpus.lock import DirectoryLock, pid_is_alive
from graphattn.errors import GraphattnError
from graphattn.shards.format import write_atomic
from graphattn.shards.runfile import RunFileError, read_run
from graphattn.shards.verify import ShardFormatError, check_digest


class OutputError(GraphattnError):
    """The output directory cannot be written: permissions, a read-only or full file system."""


def plural(count: int, word: str) -> str:
    """`1 document`, `2 documents`, `1,000 shards`."""
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def documents_line(documents: int, rejected: int) -> str:
    """The count both `graphattn compile` and `graphattn inspect` print: "compiled 18 of 20 documents; rejected 2"."""
    return f"compiled {documents - rejected:,} of {plural(documents, 'document')}; rejected {rejected:,}"


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB" if size >= 100_000 else f"{size:,} bytes"


@contextmanager
def writing(path: Path, size: int = 0, expected: str = "--out must name a directory you may write to"):
    """Turn the file system's refusal to write `path` (`size` bytes) into one OutputError line
    saying why and what was `expected`."""
    try:
        yield
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            try:
                free = shutil.disk_usage(path.parent if path.parent.exists() else ".").free
            except OSError:
                free = 0
            needs = f"writing it needs {_megabytes(size)}, " if size else ""
            raise OutputError(
                f"disk full: {needs}{_megabytes(free)} free there; free some space or choose another "
                "--out, then run again (compile: --resume keeps the shards already done)",
                file=str(path),
            ) from None
        why = {
            errno.EROFS: "the file system is read-only",
            errno.EACCES: "permission denied",
            errno.EPERM: "permission denied",
            errno.ENOTDIR: "a part of the path is a file, not a directory",
            errno.EEXIST: "a part of the path is a file, not a directory",
            errno.ENOENT: "a directory on the way, or the file being written, was removed meanwhile",
        }.get(err.errno, err.strerror or str(err))
        raise OutputError(f"cannot write the output here: {why} ({expected})", file=str(path)) from None


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.parquet"


def _dump(data: Any) -> bytes:
    return (json.dumps(data, sort_keys=True, ensure_ascii=False, indent=1) + "\n").encode()


@dataclass
class OutputDir:
    path: Path
    warned: int = 0  # label warnings written by `finish`

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    @property
    def run_file(self) -> Path:
        return self.path / "run.json"

    @property
    def rejected_file(self) -> Path:
        return self.path / "rejected.jsonl"

    @property
    def warnings_file(self) -> Path:
        return self.path / "warnings.jsonl"

    def shard_path(self, index: int) -> Path:
        return self.path / shard_name(index)

    def marker_path(self, index: int) -> Path:
        return self.path / shard_name(index).replace(".parquet", ".done.json")

    # -- starting or resuming ----------------------------------------------------------------
    def start(self, run: dict[str, Any], resume: bool) -> set[int]:
        """Claim the directory for `run`; the shard numbers already done (resume only)."""
        if self.path.exists() and not self.path.is_dir():
            raise OutputError("--out must be a directory, but a file of that name exists", file=str(self.path))
        with writing(self.path):
            self.path.mkdir(parents=True, exist_ok=True)
            self.remove_stale_temporaries()
        if resume:
            previous = self._read_run()
            _check_same_run(previous, run, str(self.run_file))
            return {i for i in range(run["shards"]) if self.is_done(i)}
        if self.run_file.exists() or any(self.path.glob("shard-*.parquet")):
            raise GraphattnError(
                "this directory already holds compiled shards; pass --resume to finish that run, "
                "or choose an empty directory",
                file=str(self.path),
            )
        self._write(self.run_file, _dump(run))
        return set()

    def _write(self, path: Path, data: bytes) -> None:
        with writing(path, len(data)):
            write_atomic(str(path), data)

    def lock(self) -> DirectoryLock:
        """The directory's lock (taken before `start`): a second compile on it stops before
        it reads or removes anything."""
        if self.path.exists() and not self.path.is_dir():
            raise OutputError("--out must be a directory, but a file of that name exists", file=str(self.path))
        with writing(self.path):
            return DirectoryLock(self.path, "graphattn compile").acquire()

    def remove_stale_temporaries(self) -> None:
        """Half-written files (`*.tmp-<pid>`) of a run that was killed: never trusted, always
        rewritten. Called with the lock held; a file whose writer still runs is left alone."""
        for tmp in self.path.glob("*.tmp-*"):
            pid = tmp.name.rsplit(".tmp-", 1)[1]
            if pid.isdigit() and pid_is_alive(int(pid)):
                continue
            tmp.unlink(missing_ok=True)

    def _read_run(self) -> dict[str, Any]:
        """The run being resumed, read by the version its run.json names (`graphattn.shards.runfile`)."""
        if not os.path.lexists(self.run_file):
            raise GraphattnError("nothing to resume here (no run.json); run without --resume", file=str(self.path))
        try:
            return read_run(self.run_file)
        except RunFileError as err:
            raise RunFileError(f"{err.reason}; start a new run in an empty directory", err.location) from None

    # -- shards ------------------------------------------------------------------------------
    def is_done(self, index: int) -> bool:
        """A marker and a shard that matches it; the bytes are hashed once per file version (a
        verified stamp stands for the hash on later resumes, as for train's reads)."""
        marker = self.read_marker(index)
        shard = self.shard_path(index)
        if marker is None or not shard.exists() or shard.stat().st_size != marker.get("bytes"):
            return False
        try:
            check_digest(str(shard))
        except ShardFormatError:
            return False
        return True

    def read_marker(self, index: int) -> dict | None:
        path = self.marker_path(index)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return None

    def write_shard(
        self, index: int, data: bytes, digest: str, rejected: list[dict], stats: dict, warnings: list[dict] = ()
    ) -> None:
        """Shard file first (atomic), marker second: a marker always describes a complete file."""
        self._write(self.shard_path(index), data)
        marker = {
            "shard": index,
            "file": shard_name(index),
            "bytes": len(data),
            "sha256": digest,
            "stats": stats,
            "rejected": rejected,
            "warnings": list(warnings),
        }
        try:
            self._write(self.marker_path(index), _dump(marker))
        except BaseException:  # a shard without its marker would look complete to a reader of DIR
            self.shard_path(index).unlink(missing_ok=True)
            raise

    def markers(self, shards: int) -> Iterator[dict]:
        for index in range(shards):
            marker = self.read_marker(index)
            if marker is not None:
                yield marker

    def finish(self, shards: int) -> int:
        """Write rejected.jsonl and warnings.jsonl from the markers, in input order; returns how many
        were rejected (and sets `warned`)."""
        self.warned = self._write_entries(shards, "warnings", self.warnings_file)
        return self._write_entries(shards, "rejected", self.rejected_file)

    def _write_entries(self, shards: int, key: str, path: Path) -> int:
        lines = [
            json.dumps(entry, sort_keys=True, ensure_ascii=False) + "\n"
            for marker in self.markers(shards)
            for entry in marker.get(key, [])
        ]
        self._write(path, "".join(lines).encode())
        return len(lines)


def _short(value: Any, width: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _check_same_run(previous: dict, run: dict, where: str) -> None:
    """Resume only the run that was started: same settings, same (unchanged) input files."""
    old, new = previous["settings"], run["settings"]  # every key is there: `read_run` checked its version's keys
    differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if differ:
        detail = "; ".join(f"{k}: was {_short(old.get(k))}, now {_short(new.get(k))}" for k in differ[:5])
        raise GraphattnError(
            f"--resume refused: the settings differ from the run being resumed ({detail}); "
            "use the same command, or start a new run in an empty directory",
            file=where,
        )
    old_inputs = {f["path"]: f for f in previous["inputs"]}
    for now in run["inputs"]:
        before = old_inputs.get(now["path"])
        if before != now:
            raise GraphattnError(
                f"--resume refused: input {now['path']} changed since the run started "
                f"(was {before}, now {now}); start a new run",
                file=where,
            )
    if previous["documents"] != run["documents"] or previous["shards"] != run["shards"]:
        raise GraphattnError("--resume refused: the inputs now hold a different number of documents", file=where)
