"""The schema route: DocGraphs + a relation schema compiled into one flat sequence per row for a
Hugging Face encoder or decoder, with a learned relative-label bias in every attention module.

Each instance's globals become real positions (first), its long tokens follow: flat row =
[globals padded to the batch's G ; long tokens padded to the batch's L]. The structure is the
compiled `CompactBatch` (ETC hard masks, documents, owners, links; O(L + G + E)), so each pair's
mask and relative label are the schema's. The labels feed a per-layer table [heads, labels]
(`attach_relative_bias`), zero-initialised: until training moves it, the model computes exactly
what it computes with the same tokens and the same mask and no bias.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
import torch

from graphattn.compact import CompactBatch
from graphattn.contract import EtcInstance
from graphattn.hf.attention import BIAS_ATTRIBUTE
from graphattn.hf.structure import GraphattnMaskError, Structure


def structure_from_instances(
    instances: Sequence[EtcInstance], *, causal: bool | None = None, pad_token_id: int = 0
) -> dict:
    """Compact-compiled instances -> `input_ids`, `token_type_ids`, `position_ids`, `attention_mask`.
    `causal` as in `pack_documents`: None keeps each layer's own rule."""
    if not instances:
        raise ValueError("structure_from_instances: no instances")
    for i, inst in enumerate(instances):
        if not hasattr(inst.side, "long_doc"):
            raise ValueError(f"instances[{i}]: compile with compact=True (its side inputs are dense)")
    g = max(inst.global_length for inst in instances)
    length = max(inst.long_length for inst in instances)
    compact = CompactBatch.from_instances([inst.side for inst in instances], length, g).to_torch()
    ids = np.full((len(instances), g + length), pad_token_id, np.int64)
    types = np.zeros((len(instances), g + length), np.int64)
    for b, inst in enumerate(instances):
        ids[b, : inst.global_length] = inst.global_token_ids
        ids[b, g : g + inst.long_length] = inst.long_token_ids
        types[b, : inst.global_length] = inst.global_type_ids
        types[b, g : g + inst.long_length] = inst.long_type_ids
    positions = torch.arange(g + length).expand(len(instances), -1).contiguous()
    structure = Structure(
        "graph",
        positions,
        causal,
        compact=compact,
        global_length=g,
        num_labels=max(len(inst.label_vocab) for inst in instances),
    )
    return {
        "input_ids": torch.from_numpy(ids),
        "token_type_ids": torch.from_numpy(types),
        "position_ids": positions,
        "attention_mask": structure,
    }


def global_targets(instances: Sequence[EtcInstance], global_length: int) -> dict[str, torch.Tensor]:
    """The schema's per-global targets on the flat rows' global positions, [B, G] (-100: none)."""
    out = {}
    for name, axis in instances[0].target_axes.items():
        if axis == "global":
            rows = np.full((len(instances), global_length), -100, np.int64)
            for b, inst in enumerate(instances):
                rows[b, : inst.global_length] = inst.targets[name]
            out[name] = torch.from_numpy(rows)
    return out


def compile_schema(
    graphs, schema, tokenizer, *, causal: bool | None = None, pad_token_id: int = 0, return_targets: bool = False
):
    """DocGraph(s) + relation schema -> one flat row per graph (a list of graphs, a batch): the
    model inputs (`structure_from_instances`). The tokenizer must be the model's. With
    `return_targets`, also the schema's per-global targets ({name: [B, G]}, -100 = none)."""
    from graphattn.compile import compile_instance
    from graphattn.graph import DocGraph

    items = [graphs] if isinstance(graphs, DocGraph) else list(graphs)
    instances = [compile_instance(graph, schema, tokenizer, compact=True) for graph in items]
    inputs = structure_from_instances(instances, causal=causal, pad_token_id=pad_token_id)
    if return_targets:
        return inputs, global_targets(instances, inputs["attention_mask"].global_length)
    return inputs


def dense_mask(structure: Structure) -> tuple[torch.Tensor, torch.Tensor]:
    """The [B, N, N] mask and labels (for small checks and for running a model without graphattn
    on the same mask: `model(..., attention_mask=mask[:, None])` with eager or sdpa)."""
    from graphattn.hf.structure import LayerRule

    n = structure.shape[1]
    mask, labels = structure.pairs(slice(0, n), torch.arange(n, device=structure.device), LayerRule())
    return mask, labels


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that call transformers' attention interface (whose forward reads
    ALL_ATTENTION_FUNCTIONS): where a bias table goes."""
    found, seen = [], {}
    for module in model.modules():
        cls = type(module)
        if cls not in seen:
            try:
                seen[cls] = "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(cls.forward)
            except (OSError, TypeError):
                seen[cls] = False
        if seen[cls]:
            found.append(module)
    return found


def attach_relative_bias(model: torch.nn.Module, num_labels: int) -> list[torch.nn.Parameter]:
    """A zero-initialised [heads, num_labels] learned bias per attention module (per layer, per
    head), added to the score of every pair by its relative label. Returns the new parameters."""
    if not 1 <= num_labels <= 1 << 16:
        raise ValueError(f"num_labels: expected 1..65536, got {num_labels}")
    modules = attention_modules(model)
    if not modules:
        raise GraphattnMaskError(
            f"{type(model).__name__} has no module on transformers' attention interface: unsupported model"
        )
    heads = model.config.num_attention_heads
    params = []
    for module in modules:
        existing = getattr(module, BIAS_ATTRIBUTE, None)
        if existing is not None and existing.shape == (heads, num_labels):
            params.append(existing)
            continue
        weight = next(module.parameters())
        table = torch.nn.Parameter(torch.zeros(heads, num_labels, device=weight.device, dtype=weight.dtype))
        module.register_parameter(BIAS_ATTRIBUTE, table)
        params.append(table)
    return params
