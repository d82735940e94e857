"""How the blocked backend spreads its chunks over the cores: the runner (`run_tasks`), and for
`workers="auto"` the mode chosen by measuring real calls.

Two modes compute the same thing:

    workers   torch.get_num_threads() Python threads, one intra-op thread each, that take chunks
              from a shared list: no barriers, so another busy process on the machine delays one
              thread, not every op (measured 3-10x faster than `omp` on a loaded 2-core machine)
    omp       one Python thread, torch's OpenMP intra-op threads inside every op: ~10-15% faster on
              an idle machine (fewer, larger ops and no private accumulators to sum)

Which one wins depends on the load, which a process cannot know in advance, so the first calls
of each kind (forward or backward, and a shape class: device, dtype, B*H, L and G rounded to
powers of two) alternate the modes and keep their wall times; after that the faster one (the
median of its recent calls) runs, and now and then a call tries the other, so a change of load
is noticed. The risks are not alike (omp on a busy machine: several times slower; workers on an
idle one: ~15% slower), so omp must win by OMP_MARGIN, and while omp runs, workers is retried
every RECHECK_OMP-th call, omp only every RECHECK-th call while workers runs. And a machine
whose load average exceeds the CPUs this process may use is busy: there no timing is trusted
(a few lucky omp calls are easily measured), workers run.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, TypeVar

import torch

T = TypeVar("T")

OMP = 1  # workers=1: torch's intra-op threads
EXPLORE = 4  # first calls of a kind alternate the modes (workers, omp, workers, omp)
RECHECK = 32  # then, while workers run, every RECHECK-th call tries omp once
RECHECK_OMP = 8  # while omp runs, every RECHECK_OMP-th call tries workers once
OMP_MARGIN = 0.9  # omp is kept only when its median time is below this share of the workers'
KEEP = 3  # recent wall times kept per mode


def shape_class(direction: str, device: torch.device, dtype: torch.dtype, bh: int, length: int, num_global: int):
    """Calls whose best mode is likely the same: lengths rounded to powers of two."""
    bucket = lambda n: 1 << max(n, 1).bit_length()  # noqa: E731
    return direction, device.type, dtype, bh, bucket(length), bucket(num_global)


class ModeChooser:
    """Per-process record of both modes' recent wall times, per shape class (thread-safe)."""

    def __init__(self, threads: Callable[[], int] = torch.get_num_threads, busy: Callable[[], bool] | None = None):
        self._threads = threads
        self._busy = busy or machine_busy
        self._lock = threading.Lock()
        self._calls: dict[Any, int] = {}
        self._times: dict[Any, dict[int, deque]] = {}

    def pick(self, key) -> int:
        """The worker count for the next call of this kind (OMP or the thread count)."""
        threads = self._threads()
        if threads <= 1:
            return OMP
        busy = self._busy()
        with self._lock:
            calls = self._calls.get(key, 0)
            self._calls[key] = calls + 1
            if calls < EXPLORE:
                return OMP if calls % 2 and not busy else threads
            if not busy and self._prefers_omp(self._times.get(key, {}), threads):
                return threads if calls % RECHECK_OMP == 0 else OMP
            return OMP if calls % RECHECK == 0 and not busy else threads

    def record(self, key, workers: int, seconds: float) -> None:
        with self._lock:
            mode = OMP if workers <= 1 else self._threads()
            self._times.setdefault(key, {}).setdefault(mode, deque(maxlen=KEEP)).append(seconds)

    def run(self, key, body: Callable[[int], T]) -> T:
        """body(workers), timed and recorded under `key`."""
        workers = self.pick(key)
        start = time.perf_counter()
        result = body(workers)
        self.record(key, workers, time.perf_counter() - start)
        return result

    def best(self, key) -> int | None:
        """The mode now preferred for `key` (None before both were measured): for tests and notes."""
        with self._lock:
            times, threads = self._times.get(key, {}), self._threads()
            if len(times) < 2:
                return None
            return OMP if self._prefers_omp(times, threads) and not self._busy() else threads

    @staticmethod
    def _prefers_omp(times: dict, threads: int) -> bool:
        return _median(times.get(OMP)) < OMP_MARGIN * _median(times.get(threads))


def machine_busy() -> bool:
    """The 1-minute load average is above the CPUs this process may run on."""
    try:
        cpus = len(os.sched_getaffinity(0))
        return os.getloadavg()[0] > cpus
    except (AttributeError, OSError):  # no load average on this platform
        return False


def _median(times: deque | None) -> float:
    return statistics.median(times) if times else math.inf


CHOOSER = ModeChooser()


def run_tasks(
    tasks: list[Callable[[Any], None]], costs: list[int], make_state: Callable[[], Any], workers: int
) -> list[Any]:
    """Run tasks, each given its worker's state (scratch buffers, private accumulators).

    With several workers the tasks are dealt to Python threads that each run torch with ONE
    intra-op thread: a chunk is a dozen mid-sized ops, and on a busy machine every multi-threaded
    op waits for a descheduled OpenMP thread at its barrier; independent threads have no
    barriers. The deal (`deal`) is fixed by the tasks' costs, not first come, first served, so
    each worker's private accumulators sum the same chunks in the same order on every run:
    gradients are reproducible bit for bit, which a resumed training run relies on. The caller's
    thread count is restored once the last worker is done.
    """
    workers = min(workers, len(tasks))
    if workers <= 1:
        state = make_state()
        for task in tasks:
            task(state)
        return [state]
    threads, grad_enabled = torch.get_num_threads(), torch.is_grad_enabled()

    def work(part: list) -> Any:
        torch.set_num_threads(1)
        with torch.set_grad_enabled(grad_enabled):  # grad mode is per thread
            state = make_state()
            for task in part:
                task(state)
        return state

    parts = [[tasks[i] for i in part] for part in deal(costs, workers)]
    others = [_pool(workers - 1).submit(work, part) for part in parts[1:]]
    try:
        first = work(parts[0])  # the calling thread is the first worker
        return [first, *(future.result() for future in others)]
    finally:
        # Restored once every worker is done: MKL's thread count is process-wide, and a worker
        # that restored it while another still ran let that one's matmuls go multi-threaded,
        # which changed their summation order and the last bits of the gradients.
        wait(others)
        torch.set_num_threads(threads)


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(size: int) -> ThreadPoolExecutor:
    """A pool of `size` threads kept for the process: starting threads on every call cost up to
    3 ms at L = 2048 (a new thread waits for the GIL to start while the first worker holds it).
    A forked child makes its own (its parent's threads do not exist in it)."""
    key = (os.getpid(), size)
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = ThreadPoolExecutor(size, thread_name_prefix="graphattn-blocked")
        return _POOLS[key]


def deal(costs: list[float], workers: int) -> list[list[int]]:
    """Task numbers per worker: the costliest first, each to the worker with the least so far
    (ties to the lowest worker), each worker's in the order dealt. Deterministic."""
    parts: list[list[int]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for task in sorted(range(len(costs)), key=lambda i: -costs[i]):
        worker = loads.index(min(loads))
        parts[worker].append(task)
        loads[worker] += costs[task]
    return parts
