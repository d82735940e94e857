"""The compiled contract: what the compiler hands to the encoder (docs/DESIGN.md §3).

Names and shapes follow etcmodel so that users can compare tensors one to one. Per instance the
shapes below have no batch dim; `collate` adds B in front.

    l2l_att_mask, l2l_relative_att_ids   [L, 2r+1]  long query i, long key i-r..i+r (column r = i)
    g2g_att_mask, g2g_relative_att_ids   [G, G]
    l2g_att_mask, l2g_relative_att_ids   [L, G]
    g2l_att_mask, g2l_relative_att_ids   [G, L]

Masks are 1 = may attend. All eight are int32 (numpy per instance, torch once batched).

Task targets (`EtcInstance.targets`, declared in the schema's `targets:` section, see
`graphattn.schema.targets`) are int32 arrays holding TARGET_IGNORE where there is no label:

    global_labels  <name>                          [G]     class of each labelled global
    choice         <name>                          [G]     1 chosen candidate, 0 other candidate
    span           <name>_start, _end, _type       []      long positions (inclusive), answer type
    spans          <name>                          [k, 2]  (first, last) long positions per row

`target_axes[name]` is "global" where the last axis runs over the globals (padded with
TARGET_IGNORE in batches) and "" for fixed shapes (stacked).

This module sits at the bottom of the package: compile, kernels, nn, shards, viz and train all
import it, and it imports nothing above `graphattn.labels`. torch is imported only by the methods
that make tensors, so the compiler and readers never pay for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from graphattn.side import SIDE_INPUT_NAMES as SIDE_INPUT_NAMES  # re-exported: users import both from here
from graphattn.side import SideInputs

if TYPE_CHECKING:
    import torch

    from graphattn.compact import CompactBatch
    from graphattn.labels import LabelVocab

TARGET_IGNORE = -100  # "no label here" in every target array (torch cross-entropy's ignore_index)


@dataclass
class TruncationReport:
    """What did not fit: nothing is dropped silently. Empty lists mean nothing was cut."""

    long_tokens_before: int = 0  # under tail a lower bound when tokenizing stopped early (a message says so)
    long_tokens_after: int = 0
    globals_before: int = 0
    globals_after: int = 0
    dropped_nodes: list[str] = field(default_factory=list)  # node ids removed whole (e.g. sentences)
    messages: list[str] = field(default_factory=list)  # one readable line per decision
    dropped_targets: list[str] = field(default_factory=list)  # one target name per label truncation cut away

    @property
    def truncated(self) -> bool:
        cut = self.long_tokens_after < self.long_tokens_before or self.globals_after < self.globals_before
        return bool(self.dropped_nodes) or bool(self.dropped_targets) or cut


@dataclass(repr=False)
class EtcInstance:
    """One compiled input (possibly several packed documents): ids, side inputs, provenance.

    `side` holds the eight tensors as numpy int32 ([L, 2r+1], [G, G], [L, G], [G, L]); a compact
    instance holds a `CompactSideInputs` instead, whose `to_dense()` gives the same eight.
    Provenance maps every position back to the graph: `global_node_ids[g]` is the node a global
    token stands for; `long_char_spans[i]` is the [start, end) of long token i in
    `texts[long_doc_index[i]]` (-1, -1 for tokens the compiler inserted, such as [CLS]);
    `long_owners[level][i]` is the global position that owns long token i at hierarchy level
    `level` (a node type name), -1 when none. `targets` holds the schema's task labels (see the
    module docstring; `target_axes` says which axis of each is per global).
    """

    long_token_ids: np.ndarray  # [L] int32
    long_type_ids: np.ndarray  # [L] int32
    global_token_ids: np.ndarray  # [G] int32
    global_type_ids: np.ndarray  # [G] int32
    side: Any  # SideInputs (numpy, no batch dim) or CompactSideInputs
    label_vocab: LabelVocab
    global_node_ids: list[str]
    global_node_types: list[str]
    long_char_spans: np.ndarray  # [L, 2] int32
    long_doc_index: np.ndarray  # [L] int32, which packed document each long token came from
    long_owners: dict[str, np.ndarray]
    doc_ids: list[str | None]
    texts: list[str]
    truncation: TruncationReport = field(default_factory=TruncationReport)
    features: dict[str, np.ndarray] = field(default_factory=dict)
    global_doc_index: np.ndarray | None = None  # [G] int32, which packed document each global came from
    targets: dict[str, np.ndarray] = field(default_factory=dict)  # task labels, int32 (module docstring)
    target_axes: dict[str, str] = field(default_factory=dict)  # name -> "global" | "" (fixed shape)

    # -- methods (after every field) ------------------------------------------------------
    @property
    def long_length(self) -> int:
        """L, the long tokens of this instance."""
        return int(self.long_token_ids.shape[0])

    @property
    def global_length(self) -> int:
        """G, the global tokens of this instance."""
        return int(self.global_token_ids.shape[0])

    def long_token_text(self, i: int) -> str:
        """The text of long token `i` ("" for tokens the compiler inserted)."""
        start, end = (int(x) for x in self.long_char_spans[i])
        return "" if start < 0 else self.texts[int(self.long_doc_index[i])][start:end]

    def __repr__(self) -> str:
        """One line: sizes, documents, side-input form (never the arrays)."""
        form = type(self.side).__name__
        docs = ", ".join(repr(d) for d in self.doc_ids[:3]) + (", ..." if len(self.doc_ids) > 3 else "")
        cut = ", truncated" if self.truncation.truncated else ""
        return f"EtcInstance(L={self.long_length}, G={self.global_length}, docs=[{docs}], side={form}{cut})"


@dataclass(repr=False)
class EtcBatch:
    """A padded batch ready for `EtcEncoder`: token ids, type ids, padding masks, side inputs.

    `long_input_mask` / `global_input_mask` are 1 for real tokens and 0 for padding: the side
    inputs let padding attend to padding (as the reference does), and the model ignores padded
    rows. `features` carries optional per-token arrays such as OpenKP's visual features
    (name -> [B, L, ...] or [B, G, ...]). `vocab_size` is the number of relative labels used.
    `compact` is the batch's `CompactBatch` when its instances were compiled compact: the encoder
    then hands the kernels that instead of the dense tensors, and `side` may be None
    (`collate(..., dense_side=False)`) so that nothing O(L G) is ever built.
    `targets` are the instances' task labels as int64 tensors ([B, G] padded with TARGET_IGNORE,
    [B] for scalars, [B, k, 2] for span rows), what task heads train on.
    """

    long_token_ids: torch.Tensor  # [B, L]
    long_type_ids: torch.Tensor  # [B, L]
    global_token_ids: torch.Tensor  # [B, G]
    global_type_ids: torch.Tensor  # [B, G]
    long_input_mask: torch.Tensor  # [B, L]
    global_input_mask: torch.Tensor  # [B, G]
    side: SideInputs | None
    vocab_size: int
    features: dict[str, torch.Tensor] = field(default_factory=dict)
    compact: CompactBatch | None = None
    targets: dict[str, torch.Tensor] = field(default_factory=dict)

    # -- methods (after every field) ------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """B."""
        return self.long_token_ids.shape[0]

    def __repr__(self) -> str:
        batch, long = self.long_token_ids.shape
        return (
            f"EtcBatch(B={batch}, L={long}, G={self.global_token_ids.shape[1]}, labels={self.vocab_size}, "
            f"device={self.long_token_ids.device})"
        )

    def to(self, device: torch.device | str) -> EtcBatch:
        """The batch with every tensor (ids, masks, side inputs, features) on `device`."""
        move = lambda t: t.to(device)  # noqa: E731
        tensors = {f.name: move(getattr(self, f.name)) for f in fields(self) if f.name.endswith(("ids", "mask"))}
        return replace(
            self,
            **tensors,
            side=None if self.side is None else self.side.map(move),
            features={k: move(v) for k, v in self.features.items()},
            compact=None if self.compact is None else self.compact.to_torch().map(move),
            targets={k: move(v) for k, v in self.targets.items()},
        )
