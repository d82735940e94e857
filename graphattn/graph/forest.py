"""Depths in a forest given as a parent array, by pointer jumping: what the HTML reader (a tree
lxml guarantees) and the compiler's containment check (any graph, cycles refused) both need."""

from __future__ import annotations

import numpy as np


def forest_depths(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depth of each node of a forest given by `parent` (-1 for a root) by pointer jumping, and
    the nodes that never reach a root (on or under a cycle), ascending.

    With a sentinel root n, after ceil(log2(n+1)) + 1 rounds every acyclic node points at it;
    a shallow forest gets there in log2(depth) rounds."""
    n = parent.size
    jump = np.append(np.where(parent >= 0, parent, n), n)
    dist = np.append((parent >= 0).astype(np.int64), 0)
    for _ in range(int(np.ceil(np.log2(n + 2))) + 1):
        dist += dist[jump]  # the sentinel's distance stays 0, so no mask is needed
        jump = jump[jump]
        if (jump == n).all():
            break
    return dist[:n], np.flatnonzero(jump[:n] != n)


__all__ = ["forest_depths"]
