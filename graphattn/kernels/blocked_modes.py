"""How the blocked backend's chunks are run on its PyTorch path (`run_tasks`); the fused kernel
deals its chunks to its workers itself (kernels/cpu/fused.cpp).

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
