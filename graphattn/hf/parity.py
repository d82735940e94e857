"""Checks a user runs before a long job: `check_parity(model, batch)` runs every packed document and
every root-to-leaf path of a tree alone on the same model and reports the largest difference from
the packed forward; `tree_token_ratio` says how many tokens a prefix tree saves.

The runs alone are ordinary inputs (no structure), which a model set to graphattn computes with
transformers' own SDPA: the reference is not graphattn's own code.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from graphattn.hf.attention import graphattn_mask
from graphattn.hf.structure import GraphattnMaskError, LayerRule, Structure

COMPARE = ("logits", "log_probs")
NOT_MODEL_INPUTS = {"labels", "predecessor", "completion_mask", "assistant_masks"}


@dataclass(frozen=True)
class ParityReport:
    """The largest |packed - alone| over real tokens, and where: `row` and `token` (index in the
    packed row), `path` (index of the document / root-to-leaf path, in order of rows then leaves),
    `compare`: what was compared (logits, log_probs, or last_hidden_state for a model without logits)."""

    max_diff: float
    row: int
    token: int
    path: int
    paths: int
    tokens: int
    compare: str

    def __str__(self) -> str:
        return (
            f"max |packed - alone| of {self.compare} = {self.max_diff:.3g} at row {self.row}, token {self.token} "
            f"(path {self.path}; {self.paths} paths, {self.tokens} tokens compared)"
        )


def _structure_of(batch_or_structure) -> Structure:
    structure = batch_or_structure.get("attention_mask") if isinstance(batch_or_structure, dict) else batch_or_structure
    if not isinstance(structure, Structure) or structure.kind != "tree":
        got = type(structure).__name__ if not isinstance(structure, Structure) else f"a {structure.kind} structure"
        raise GraphattnMaskError(
            f"attention_mask: expected the structure of pack_documents / pack_tree / PackingCollator, got {got}"
        )
    return structure


def leaf_paths(batch_or_structure) -> list[tuple[int, torch.Tensor]]:
    """(row, token indices) of every packed document and root-to-leaf path, in row order: a leaf
    segment's path is every token whose segment's preorder interval holds the leaf."""
    structure = _structure_of(batch_or_structure)
    enter, exit_ = structure.enter.long(), structure.exit.long()
    real = enter >= 0
    leaf = real & (exit_ - enter == 1)
    paths = []
    for row in range(structure.shape[0]):  # per row and leaf, never per token
        for e in torch.unique(enter[row][leaf[row]]).tolist():
            index = (real[row] & (enter[row] <= e) & (e < exit_[row])).nonzero()[:, 0]
            paths.append((row, index))
    return paths


def tree_token_ratio(batch_or_structure) -> float:
    """Tokens in the packed rows / tokens of all root-to-leaf paths run one by one (1.0 for packed
    documents; a prompt shared by 8 completions gives well under 1)."""
    structure = _structure_of(batch_or_structure)
    enter, exit_ = structure.enter.long(), structure.exit.long()
    real = enter >= 0
    is_leaf = (real & (exit_ - enter == 1)).long()
    width = int(exit_.max().clamp(min=0)) + 1
    leaves = torch.zeros(structure.shape[0], width + 1, dtype=torch.long, device=enter.device)
    leaves.scatter_(1, torch.where(real, enter, width), is_leaf)  # a segment's tokens write one flag; padding aside
    leaves = leaves[:, :width]
    before = torch.nn.functional.pad(leaves.cumsum(1), (1, 0))  # leaves with a preorder id below i
    paths_through = (before.gather(1, exit_.clamp(min=0)) - before.gather(1, enter.clamp(min=0))) * real
    total = int(paths_through.sum())
    if total == 0:
        raise GraphattnMaskError("attention_mask: the structure holds no real token")
    return int(real.sum()) / total


def _accepts(model) -> tuple[set[str], bool]:
    parameters = inspect.signature(model.forward).parameters
    return set(parameters), any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _output(out, compare: str) -> tuple[torch.Tensor, str]:
    values = getattr(out, "logits", None)
    if values is None:
        if compare == "log_probs":
            raise GraphattnMaskError("check_parity: compare='log_probs' needs a model with logits")
        return out.last_hidden_state.float(), "last_hidden_state"
    return (values.float().log_softmax(-1), compare) if compare == "log_probs" else (values.float(), compare)


def _alone_mask(structure: Structure, length: int, device) -> torch.Tensor | None:
    """The mask of a path's ordinary run: none (the model's own rule), or with causal=True on a
    model with bidirectional layers a causal [1, 1, n, n] mask, which every layer type then takes."""
    own = structure._plans.get(("own rules",), set())
    if structure.causal is not True or all(rule.causal for rule in own):
        return None
    if not own <= {LayerRule(), LayerRule(hi=0)}:
        raise GraphattnMaskError(
            "check_parity: causal=True on a model with windowed bidirectional layers has no ordinary run to compare "
            f"with (its layers' rules: {sorted(own, key=str)})"
        )
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


@torch.no_grad()
def check_parity(model, batch: dict, *, compare: str = "logits") -> ParityReport:
    """Run `batch` (from pack_documents / pack_tree / PackingCollator) packed, then every document
    and root-to-leaf path alone (positions 0..n-1, no structure) on the same model, in eval mode;
    return the largest difference of the logits (`compare="log_probs"`: log-softmax; hidden states
    for a model without logits) over real tokens and where it is. Expect rounding (~1e-5 in
    float32); a leak or a wrong position shows as a difference of the outputs' own size."""
    if compare not in COMPARE:
        raise ValueError(f"compare: expected one of {COMPARE}, got {compare!r}")
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    implementation = getattr(model.config, "_attn_implementation", None)
    if ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(implementation) is not graphattn_mask:
        raise GraphattnMaskError(
            f"check_parity: the model's attention is {implementation!r}, not graphattn: "
            "call model.set_attn_implementation(graphattn.hf.register()) first"
        )
    device = next(model.parameters()).device
    structure = _structure_of(batch).to(device)
    structure._plans.pop(("own rules",), None)
    names, open_kwargs = _accepts(model)
    extra = {"use_cache": False} if "use_cache" in names or open_kwargs else {}
    inputs = {
        key: value.to(device) if isinstance(value, torch.Tensor) else value
        for key, value in batch.items()
        if key not in NOT_MODEL_INPUTS and (key in names or open_kwargs)
    }
    inputs["attention_mask"] = structure
    was_training = model.training
    model.eval()
    try:
        packed, compared = _output(model(**inputs, **extra), compare)
        token_types = inputs.get("token_type_ids")
        best, where, tokens = -1.0, (0, 0, 0), 0
        paths = leaf_paths(structure)
        for number, (row, index) in enumerate(paths):
            alone_inputs = {"input_ids": inputs["input_ids"][row, index][None]}
            if token_types is not None:
                alone_inputs["token_type_ids"] = token_types[row, index][None]
            mask = _alone_mask(structure, index.numel(), device)
            if mask is not None:
                alone_inputs["attention_mask"] = mask
            alone = _output(model(**alone_inputs, **extra), compare)[0][0]
            diff = (packed[row, index] - alone).abs().flatten(1).amax(1).nan_to_num(nan=float("inf"))
            at = int(diff.argmax())
            tokens += index.numel()
            if float(diff[at]) > best:
                best, where = float(diff[at]), (row, int(index[at]), number)
    finally:
        model.train(was_training)
    return ParityReport(best, where[0], where[1], where[2], len(paths), tokens, compared)


__all__ = ["ParityReport", "check_parity", "leaf_paths", "tree_token_ratio"]
