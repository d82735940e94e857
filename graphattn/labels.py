"""The relative-label vocabulary: the one place that says which id means what.

Layout, fixed by ETC's reference (etcmodel) so that ids compare one to one:

    0            dist:0            query and key are the same position
    1..k         dist:+1..dist:+k  key 1..k positions to the right (farther clipped to k)
    k+1..2k      dist:-1..dist:-k  key 1..k positions to the left (farther clipped to 2k)
    2k+1         does_not_belong   l2g / g2l: the long token is not owned by the global token
    2k+2         belongs           l2g / g2l: the long token is owned by the global token
    2k+3...      structural labels a schema declares (mention_of, cross_segment, ...)

l2l/l2g and g2g/g2l share this one vocabulary because each pair lives inside one softmax. Every
other module asks this one for ids (`does_not_belong_id(k)`, ...) rather than re-deriving them.
This module imports nothing above `graphattn.errors`, so kernels and readers can use it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from graphattn.errors import CompileError


class SideInputError(CompileError):
    """Arguments to the label and side-input builders that disagree or are out of range."""


BELONGS = "belongs"
DOES_NOT_BELONG = "does_not_belong"


# -- the id layout ------------------------------------------------------------------------------
def distance_id_count(max_distance: int) -> int:
    """Number of distance ids, 2k+1 (0, 1..k right, k+1..2k left)."""
    return 2 * max_distance + 1


def does_not_belong_id(max_distance: int) -> int:
    return distance_id_count(max_distance)


def belongs_id(max_distance: int) -> int:
    return distance_id_count(max_distance) + 1


def first_schema_label_id(max_distance: int) -> int:
    """The id of the first label a schema declares; also the size of the built-in vocabulary."""
    return distance_id_count(max_distance) + 2


def relative_position_ids(delta: Any, max_distance: int) -> np.ndarray:
    """Relative id for ``delta = key - query`` (any shape): 0 same, 1..k right, k+1..2k left.

    Distances beyond k are clipped to k (right) or 2k (left), the reference's convention.
    """
    if max_distance < 0:
        raise SideInputError(f"relative_pos_max_distance must be non-negative, got {max_distance}")
    k = np.int32(max_distance)
    clipped = np.clip(np.asarray(delta, dtype=np.int32), -k, k)
    return np.where(clipped >= 0, clipped, k - clipped).astype(np.int32, copy=False)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@lru_cache(maxsize=64)
def local_relative_ids(local_radius: int, max_distance: int) -> np.ndarray:
    """The [2r+1] row every long query gets: ids of key offsets -r..r (read-only, cached)."""
    return _frozen(relative_position_ids(np.arange(-local_radius, local_radius + 1, dtype=np.int32), max_distance))


@lru_cache(maxsize=64)
def full_relative_ids(length: int, max_distance: int) -> np.ndarray:
    """[n, n] ids of ``key - query`` for all pairs (g2g), read-only and cached per (n, k)."""
    positions = np.arange(length, dtype=np.int32)
    return _frozen(relative_position_ids(positions[None, :] - positions[:, None], max_distance))


def distance_label_names(max_distance: int) -> list[str]:
    """Names of ids 0..2k in the reference's order (right distances first, then left)."""
    if max_distance < 1:
        raise CompileError(f"relative_pos_max_distance must be >= 1, got {max_distance}")
    right = [f"dist:+{d}" for d in range(1, max_distance + 1)]
    left = [f"dist:-{d}" for d in range(1, max_distance + 1)]
    return ["dist:0", *right, *left]


# -- the vocabulary -----------------------------------------------------------------------------
@dataclass
class LabelVocab:
    """Ordered label names; `id(name)` and `name(id)` both ways; serializes to a dict."""

    max_distance: int
    extra: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.names: list[str] = [*distance_label_names(self.max_distance), DOES_NOT_BELONG, BELONGS]
        for name in self.extra:
            if name in self.names:
                raise CompileError(f"label {name!r} is declared twice or clashes with a built-in label")
            self.names.append(name)
        self._ids = {name: i for i, name in enumerate(self.names)}

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self._ids

    def __repr__(self) -> str:
        return f"LabelVocab(max_distance={self.max_distance}, {len(self)} labels, extra={self.extra})"

    @property
    def does_not_belong(self) -> int:
        return does_not_belong_id(self.max_distance)

    @property
    def belongs(self) -> int:
        return belongs_id(self.max_distance)

    def id(self, name: str) -> int:
        try:
            return self._ids[name]
        except KeyError:
            raise CompileError(f"unknown relative label {name!r}; known: {', '.join(self.names)}") from None

    def name(self, label_id: int) -> str:
        if not 0 <= label_id < len(self.names):
            raise CompileError(f"relative label id {label_id} is outside the vocabulary of {len(self)}")
        return self.names[label_id]

    def to_dict(self) -> dict:
        return {"max_distance": self.max_distance, "extra": list(self.extra), "names": list(self.names)}

    @classmethod
    def from_dict(cls, data: dict) -> LabelVocab:
        vocab = cls(int(data["max_distance"]), list(data.get("extra", [])))
        if "names" in data and list(data["names"]) != vocab.names:
            raise CompileError("serialized label names disagree with max_distance/extra")
        return vocab
