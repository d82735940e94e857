"""The relative-label vocabulary: every id the compiler emits has a readable name.

Layout, fixed by ETC's reference (etcmodel) so that ids compare one to one:

    0            dist:0            query and key are the same position
    1..k         dist:+1..dist:+k  key 1..k positions to the right (farther clipped to k)
    k+1..2k      dist:-1..dist:-k  key 1..k positions to the left (farther clipped to 2k)
    2k+1         does_not_belong   l2g / g2l: the long token is not owned by the global token
    2k+2         belongs           l2g / g2l: the long token is owned by the global token
    2k+3...      structural labels a schema declares (mention_of, cross_segment, ...)

l2l/l2g and g2g/g2l share this one vocabulary because each pair lives inside one softmax.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphattn.errors import CompileError

BELONGS = "belongs"
DOES_NOT_BELONG = "does_not_belong"


def distance_label_names(max_distance: int) -> list[str]:
    """Names of ids 0..2k in the reference's order (right distances first, then left)."""
    if max_distance < 1:
        raise CompileError(f"relative_pos_max_distance must be >= 1, got {max_distance}")
    right = [f"dist:+{d}" for d in range(1, max_distance + 1)]
    left = [f"dist:-{d}" for d in range(1, max_distance + 1)]
    return ["dist:0", *right, *left]


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

    @property
    def does_not_belong(self) -> int:
        return 2 * self.max_distance + 1

    @property
    def belongs(self) -> int:
        return 2 * self.max_distance + 2

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
    def from_dict(cls, data: dict) -> "LabelVocab":
        vocab = cls(int(data["max_distance"]), list(data.get("extra", [])))
        if "names" in data and list(data["names"]) != vocab.names:
            raise CompileError("serialized label names disagree with max_distance/extra")
        return vocab
