"""One command at a time per output directory: an advisory `flock` on `DIR/.graphattn.lock`.

    with DirectoryLock("runs/hotpot", "graphattn train"):
        ...   # nothing else of graphattn writes to runs/hotpot meanwhile

`graphattn compile --out DIR` and `graphattn train --out DIR` take the lock before they look at
or touch anything in DIR (the directory itself is created to hold it), and a second command on
the same directory stops at once with one line naming the directory and the holder's pid. The
kernel drops the lock when its holder exits, however it exits (kill -9 included), so a stale
lock file never blocks a later run; the file is left in place (removing it would let two runs
lock two different files of the same name). A forked child (a compile worker) closes its copy of
the descriptor at once: the lock belongs to the open file, so a worker still winding down after
its command was killed would otherwise hold it, and a rerun would be told a dead pid is busy.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import weakref
from pathlib import Path

from graphattn.errors import GraphattnError

LOCK_FILE = ".graphattn.lock"
_HELD: weakref.WeakSet[DirectoryLock] = weakref.WeakSet()


class DirectoryBusy(GraphattnError):
    """Another graphattn command holds the directory's lock."""


class DirectoryLock:
    """An exclusive, non-blocking lock on a directory, held until `release` (or the `with` ends)."""

    def __init__(self, directory: str | os.PathLike, command: str):
        self.directory = Path(directory)
        self.command = command
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.directory / LOCK_FILE

    def acquire(self) -> DirectoryLock:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read_holder(fd)
            os.close(fd)
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise DirectoryBusy(
                f"another command is using this directory ({holder or 'a process that left no pid'}); wait for it "
                "to finish or choose another --out",
                file=str(self.directory),
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {self.command}\n".encode())
        self._fd = fd
        _HELD.add(self)
        return self

    def release(self) -> None:
        _HELD.discard(self)
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = None

    def __enter__(self) -> DirectoryLock:
        return self if self._fd is not None else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _close_in_child() -> None:
    """In a forked child: close the held locks' descriptors, nothing more (unlocking or
    truncating would act on the parent's lock, which stays)."""
    for lock in list(_HELD):
        if lock._fd is not None:
            with contextlib.suppress(OSError):
                os.close(lock._fd)
            lock._fd = None
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


def _read_holder(fd: int) -> str:
    """`graphattn train, pid 1234` from the lock file's text, '' when it says nothing readable."""
    try:
        words = os.pread(fd, 200, 0).decode("utf-8", "replace").split(maxsplit=1)
    except OSError:
        return ""
    if not words or not words[0].isdigit():
        return ""
    command = words[1].strip() if len(words) > 1 else "graphattn"
    return f"{command}, pid {words[0]}"


def pid_is_alive(pid: int) -> bool:
    """Whether a process of this id runs on this machine (a temporary's writer may still be writing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
