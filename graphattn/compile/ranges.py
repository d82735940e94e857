"""Vectorized primitives over token ranges ``[start, end)``: the compiler's inner loops.

Nodes become half-open token ranges; everything per token (which sentence owns it, its type
id, its segment) is "the innermost range that covers the token", computed here without a
Python loop per token.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def expand_ranges(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All (position, range index) pairs covered by the ranges, ranges in the given order."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.maximum(np.asarray(ends, dtype=np.int64) - starts, 0)
    total = int(lengths.sum())
    which = np.repeat(np.arange(lengths.shape[0]), lengths)
    first_slot = np.cumsum(lengths) - lengths  # where each range's positions begin in the output
    positions = np.arange(total, dtype=np.int64) - np.repeat(first_slot - starts, lengths)
    return positions, which


def ragged_offsets(lengths) -> tuple[np.ndarray, int]:
    """Where each piece of a ragged array (pieces of these lengths laid end to end) starts, and
    the total length: ``[2, 0, 3] -> ([0, 2, 2], 5)``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    return ends - lengths, int(ends[-1]) if lengths.size else 0


def ragged_rows(lengths) -> np.ndarray:
    """The piece each position of a ragged array belongs to: ``[2, 0, 3] -> [0, 0, 2, 2, 2]``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.repeat(np.arange(lengths.shape[0]), lengths)


def coverage(n: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """bool [n]: position covered by at least one range.

    Disjoint sorted ranges (text nodes, sentences: the common case) need no counts: +1/-1 marks
    in an int8 array whose running sum is the answer, a third of the memory traffic of counting."""
    starts, ends = np.clip(starts, 0, n), np.clip(ends, 0, n)
    nonempty = ends > starts
    s, e = starts[nonempty], ends[nonempty]
    if s.size and np.all(s[1:] >= e[:-1]):
        delta = np.zeros(n + 1, dtype=np.int8)
        delta[s] = 1
        delta[e] -= 1  # an end that is the next range's start nets to 0: the run goes on
        return np.cumsum(delta[:n], dtype=np.int8).view(bool)
    delta = np.bincount(s, minlength=n + 1) - np.bincount(e, minlength=n + 1)
    return np.cumsum(delta[:n]) > 0


def _disjoint_sorted(starts: np.ndarray, ends: np.ndarray) -> bool:
    return bool(np.all(starts[1:] >= ends[:-1]) and np.all(starts[1:] >= starts[:-1]))


def innermost(n: int, starts: np.ndarray, ends: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """int64 [n]: index of the covering range with the highest rank at each position, -1 if none.

    With ranks in document (pre-)order, the highest-ranked covering range is the innermost one
    of a nested family. Disjoint sorted ranges (sentences) take an O(n) path.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    out = np.full(n, -1, dtype=np.int64)
    nonempty = np.flatnonzero(ends > starts)
    if nonempty.size == 0:
        return out
    s, e = starts[nonempty], ends[nonempty]
    if _disjoint_sorted(s, e):
        positions, which = expand_ranges(s, e)
        out[positions] = nonempty[which]
        return out
    positions, which = expand_ranges(s, e)
    rank = np.asarray(ranks, dtype=np.int64)[nonempty]
    best = np.full(n, -1, dtype=np.int64)
    np.maximum.at(best, positions, rank[which])
    covered = best >= 0
    by_rank = np.full(int(rank.max()) + 1, -1, dtype=np.int64)
    by_rank[rank] = nonempty
    out[covered] = by_rank[best[covered]]
    return out


def searchsorted_left(sorted_values: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``np.searchsorted(sorted_values, values)``; values past the last one are answered without a
    search. A page cut after its first tokens asks for every node's range in a few thousand kept
    tokens, and nearly all of them lie past the end."""
    if values.size <= 8 * sorted_values.size or sorted_values.size == 0:
        return np.searchsorted(sorted_values, values)
    out = np.full(values.shape, sorted_values.size, dtype=np.intp)
    inside = values <= sorted_values[-1]
    out[inside] = np.searchsorted(sorted_values, values[inside])
    return out


def count_in_ranges(mask: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each range, how many positions inside it hold `mask`."""
    cum = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
    return cum[np.asarray(ends, dtype=np.int64)] - cum[np.asarray(starts, dtype=np.int64)]


def take_or(values: np.ndarray, index: np.ndarray, default) -> np.ndarray:
    """``values[index]`` where index >= 0, `default` where it is -1 (safe for empty `values`).

    -1 is how every lookup here says "none" (`innermost`), so it picks a slot appended after the
    values: one take instead of a masked gather and a fix-up (this runs ~20 times per document)."""
    values = np.asarray(values)
    padded = np.empty((values.shape[0] + 1, *values.shape[1:]), dtype=_take_dtype(values.dtype, default))
    padded[:-1] = values
    padded[-1] = default
    return padded[index]


@lru_cache(maxsize=256)
def _take_dtype(dtype: np.dtype, default) -> np.dtype:
    return np.result_type(dtype, np.min_scalar_type(default))
