"""`NodeType`: one declared node type of a relation schema and what it lowers to.

Its own module, below both the schema builder (`graphattn.schema.core`) and the targets section
(`graphattn.schema.targets`), which check target node types against it: so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NodeType:
    """One declared node type and what it lowers to."""

    name: str
    global_mode: str = "none"  # none | node | per_token
    long: bool = False
    type_id: int | None = None
    global_type_id: int = 0
    global_token: str | int | None = None  # None: special_tokens["global"]
    segment: bool = False
    sep_after: bool = False
    ignore_hard_g2l: bool = False
    ignore_hard_l2g: bool = False
    where: Mapping[str, tuple] = field(default_factory=dict)  # attr -> allowed values

    @property
    def is_global(self) -> bool:
        return self.global_mode != "none"

    def selects(self, attrs: Mapping[str, Any]) -> bool:
        """Whether a node with these attrs becomes a global (the `where` filter)."""
        return all(attrs.get(key) in allowed for key, allowed in self.where.items())
