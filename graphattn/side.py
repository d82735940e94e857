"""The eight ETC side inputs (`SideInputs`) and their names, below the rest of the contract.

`graphattn.contract` (instances and batches) and `graphattn.compact` (the O(L + G + E) form, whose
`to_dense()` gives these) both build on them, so they live apart from both; `graphattn.contract`
re-exports them, where users import them from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

SIDE_INPUT_NAMES = (
    "l2l_att_mask",
    "g2g_att_mask",
    "l2g_att_mask",
    "g2l_att_mask",
    "l2l_relative_att_ids",
    "g2g_relative_att_ids",
    "l2g_relative_att_ids",
    "g2l_relative_att_ids",
)


def _as_torch(x: Any) -> torch.Tensor:
    import torch

    return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))


@dataclass
class SideInputs:
    """The eight ETC side inputs, numpy or torch, with or without a batch dim."""

    l2l_att_mask: Any
    g2g_att_mask: Any
    l2g_att_mask: Any
    g2l_att_mask: Any
    l2l_relative_att_ids: Any
    g2g_relative_att_ids: Any
    l2g_relative_att_ids: Any
    g2l_relative_att_ids: Any

    # -- derived from the arrays' shapes --------------------------------------------------
    @property
    def local_radius(self) -> int:
        """r, from the l2l window width 2r+1."""
        return (self.l2l_att_mask.shape[-1] - 1) // 2

    @property
    def long_length(self) -> int:
        """L (padded, in a batch)."""
        return self.l2l_att_mask.shape[-2]

    @property
    def global_length(self) -> int:
        """G (padded, in a batch)."""
        return self.g2g_att_mask.shape[-1]

    # -- conversions ------------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        """The eight arrays by their etcmodel names, in SIDE_INPUT_NAMES order."""
        return {name: getattr(self, name) for name in SIDE_INPUT_NAMES}

    def map(self, fn) -> SideInputs:
        """Apply `fn` to each of the eight arrays (e.g. `lambda t: t.to(device)`)."""
        return SideInputs(**{name: fn(value) for name, value in self.as_dict().items()})

    def to_torch(self) -> SideInputs:
        """The same arrays as torch tensors (numpy ones shared, not copied, where contiguous)."""
        return self.map(_as_torch)

    def to_numpy(self) -> SideInputs:
        """The same arrays as numpy (torch tensors moved to the CPU first)."""
        return self.map(
            lambda x: x if isinstance(x, np.ndarray) else x.cpu().numpy() if hasattr(x, "cpu") else np.asarray(x)
        )
