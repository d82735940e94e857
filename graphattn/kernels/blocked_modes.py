"""How the blocked backend's chunks are run: the PyTorch path's runner (`run_tasks`) and the
fused kernel's fixed deal of chunks to its workers (`deal`).

The PyTorch path runs its chunks one after another on the calling thread, each op on torch's
own intra-op threads. It once dealt them to Python threads that each set torch's thread count to
one; but that count is process-wide (the OpenMP default for new threads, the MKL and
pthreadpool sizes), so two concurrent calls could leave the whole process on one thread, and the
thread pools were never shut down. Now nothing here changes a process-wide setting or starts a
thread: the `workers` plan option sizes the fused kernel's workers only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def run_tasks(tasks: list[Callable[[Any], None]], make_state: Callable[[], Any]) -> Any:
    """Run tasks in order on the calling thread, each given the one state (scratch buffers,
    accumulators): the same order on every call, so results repeat bit for bit."""
    state = make_state()
    for task in tasks:
        task(state)
    return state


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
