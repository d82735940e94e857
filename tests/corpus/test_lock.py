"""The directory lock against forked children: a worker does not keep its command's lock."""

from __future__ import annotations

import multiprocessing

import pytest

from graphattn.corpus.lock import LOCK_FILE, DirectoryBusy, DirectoryLock


def _worker(ready, finish, path: str, report) -> None:
    try:
        DirectoryLock(path, "graphattn test").acquire()
        report.put("acquired")  # the parent still holds it: this must not happen
    except DirectoryBusy as busy:
        report.put(str(busy))
    ready.set()
    finish.wait(30)


def test_a_forked_worker_does_not_hold_its_parents_lock(tmp_path):
    """The parent holds the lock; a forked worker sees it busy (naming the parent), and once the
    parent lets go the directory is free although the worker still runs."""
    context = multiprocessing.get_context("fork")
    ready, finish, report = context.Event(), context.Event(), context.Queue()
    lock = DirectoryLock(tmp_path, "graphattn compile").acquire()
    worker = context.Process(target=_worker, args=(ready, finish, str(tmp_path), report))
    worker.start()
    try:
        assert ready.wait(30)
        seen = report.get(timeout=5)
        assert "another command is using this directory" in seen and "graphattn compile, pid" in seen
        lock.release()
        again = DirectoryLock(tmp_path, "graphattn compile").acquire()  # the worker is still alive
        assert worker.is_alive()
        assert (tmp_path / LOCK_FILE).read_text().split()[0].isdigit()
        again.release()
    finally:
        finish.set()
        worker.join(30)
    assert worker.exitcode == 0


def test_a_second_lock_in_one_process_is_refused(tmp_path):
    with DirectoryLock(tmp_path, "graphattn train"):
        with pytest.raises(DirectoryBusy, match="graphattn train, pid"):
            DirectoryLock(tmp_path, "graphattn compile").acquire()
