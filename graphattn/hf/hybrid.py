"""Hybrid models: structures through layers that are not attention (gated delta nets, Mamba, short
convolutions).

transformers hands such a layer the model's 2-D `attention_mask` as a padding mask
(`masking_utils.create_recurrent_attention_mask`) and nothing else of the structure: the layer reads
the row left to right, carrying a recurrent or convolution state. So

- a row that is one sequence (one document, or one root-to-leaf chain, then padding) passes every
  hybrid model exactly: the layer needs only the padding mask, which the structure answers with its
  real tokens (`Structure.real_tokens`, asked as `mask == 1` and `mask[:, -n:]`);
- packed documents need their boundaries to reach the layer the way transformers passes them: the
  `seq_idx` / `cu_seq_lens_q` keyword arguments of the forward, which only the CUDA kernels
  (causal-conv1d, mamba-ssm, flash-linear-attention) honour; transformers' PyTorch paths (every
  CPU run) ignore them. Where the family's kernels run on the structure's device, the forward must
  carry those arguments equal to the structure's boundaries (checked once per batch); elsewhere it
  is refused;
- a prefix tree (a branch whose state would flow into its sibling), a schema graph, or padding
  inside a row never passes a recurrent layer: refused.

Refusals are one `GraphattnMaskError` line naming the layer (`check_hybrid`, called by graphattn's
mask function, which nearly every hybrid model calls before it builds the recurrent layers' mask).
Where nothing of graphattn ran first (a model without attention layers such as Mamba2, or LFM3 /
LaraMini, which build their masks in `set` order), the structure itself refuses to pass as the
padding mask of rows holding several documents or a tree (`Structure.padding_view`), in one line that cannot
name the layer. Nothing of transformers is patched.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass

import torch

from graphattn.hf.structure import RECURRENT_CHECKED as CHECKED
from graphattn.hf.structure import GraphattnMaskError, Structure

# layer types transformers builds a recurrent (padding) mask for; "hybrid" layers (FalconH1, Zamba) hold one too
RECURRENT_LAYER_TYPES = frozenset({"linear_attention", "conv", "hybrid", "mamba"})
# where transformers' kernel packages run (transformers.integrations.hub_kernels uses them on these devices only)
KERNEL_DEVICES = {"causal_conv1d": ("cuda",), "mamba_ssm": ("cuda",), "fla": ("cuda", "xpu", "mlu", "npu")}
PACKAGE_NAMES = {"causal_conv1d": "causal-conv1d", "mamba_ssm": "mamba-ssm", "fla": "flash-linear-attention"}
ONE_ROW_KWARGS = ("cu_seq_lens_q",)  # varlen kernels take the documents of one flattened row
NEEDS = ("hybrid", "reads")  # the structure's per-batch record of what the forward must carry


@dataclass(frozen=True)
class Mixer:
    """What a family's non-attention layer can take: the forward's keyword arguments its kernels read
    the document boundaries from, the packages whose kernels honour them, or why it never can."""

    name: str
    reads: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()
    never: str = ""


def _gated_delta(name: str) -> Mixer:  # conv (causal_conv1d_fn, seq_idx) then the delta rule (fla, cu_seqlens)
    return Mixer(name, ("seq_idx", "cu_seq_lens_q"), ("causal_conv1d", "fla"))


def _mamba2(name: str) -> Mixer:  # conv and SSD scan both take seq_idx
    return Mixer(name, ("seq_idx",), ("causal_conv1d", "mamba_ssm"))


def _mamba1(name: str) -> Mixer:
    return Mixer(name, never="Mamba1's selective scan has no document-boundary input (no seq_idx)")


def _kda(name: str) -> Mixer:
    return Mixer(name, never="transformers does not pass document boundaries (cu_seqlens) to its KDA kernel")


def _short_conv(name: str) -> Mixer:
    return Mixer(name, ("seq_idx",), ("causal_conv1d",))


# model_type -> its non-attention layer (read from each modeling file of transformers 5.x)
FAMILIES = {
    "qwen3_next": _gated_delta("Qwen3NextGatedDeltaNet"),
    "qwen3_5_text": _gated_delta("Qwen3_5GatedDeltaNet"),
    "qwen3_5_moe_text": _gated_delta("Qwen3_5MoeGatedDeltaNet"),
    "olmo_hybrid": _gated_delta("OlmoHybridGatedDeltaNet"),
    "lara_mini": _gated_delta("LaraMiniGatedDeltaNet"),
    "qwen4_exp_text": _gated_delta("Qwen4ExpTextGatedDeltaNet"),
    "bamba": _mamba2("BambaMixer"),
    "falcon_h1": _mamba2("FalconH1Mixer"),
    "granitemoehybrid": _mamba2("GraniteMoeHybridMambaLayer"),
    "nemotron_h": _mamba2("NemotronHMamba2Mixer"),
    "zamba2": _mamba2("Zamba2MambaMixer"),
    "jamba": _mamba1("JambaMambaMixer"),
    "zamba": _mamba1("ZambaMambaMixer"),
    "kimi_linear": _kda("KimiLinearDeltaAttention"),
    "bailing_hybrid": _kda("BailingHybridDeltaAttention"),
    "lfm2": _short_conv("Lfm2ShortConv"),
    "lfm2_moe": _short_conv("Lfm2MoeShortConv"),
    "lfm3": _short_conv("Lfm3ShortConv"),
    "minimax": Mixer("MiniMaxLightningAttention", never="its lightning attention has no document-boundary input"),
    "recurrent_gemma": Mixer(
        "RecurrentGemmaRecurrentBlock", never="its RG-LRU recurrence and convolution have no document-boundary input"
    ),
    "zaya": Mixer("ZayaCCAProjection", never="its convolution of the queries and keys has no document-boundary input"),
}


def _layer_types(config) -> list[str]:
    for name in ("layer_types", "layers_block_type"):
        types = getattr(config, name, None)
        if isinstance(types, (list, tuple)) and types:
            return [str(t) for t in types]
    return []


def _uses_recurrent_mask(config) -> bool:
    """Whether the config's modeling module hands the attention_mask to recurrent layers (a family
    graphattn has no entry for, without `layer_types`)."""
    module = sys.modules.get(type(config).__module__.replace(".configuration_", ".modeling_"))
    return module is not None and hasattr(module, "create_recurrent_attention_mask")


def recurrent_layers(config) -> tuple[str, Mixer] | None:
    """The first non-attention layer type of a model and what it can take; None for a model with none."""
    types = [t for t in _layer_types(config) if t in RECURRENT_LAYER_TYPES]
    model_type = str(getattr(config, "model_type", type(config).__name__))
    if not types and not (model_type in FAMILIES or _uses_recurrent_mask(config)):
        return None
    layer_type = types[0] if types else "linear_attention"
    mixer = FAMILIES.get(model_type) or Mixer(
        f"{model_type}'s non-attention layer", never="graphattn does not know how it takes document boundaries"
    )
    return layer_type, mixer


# -- the checks -----------------------------------------------------------------------------------------
def _kernels_missing(mixer: Mixer, device: torch.device) -> list[str]:
    return [
        PACKAGE_NAMES[p]
        for p in mixer.packages
        if device.type not in KERNEL_DEVICES[p] or importlib.util.find_spec(p) is None
    ]


def check_hybrid(config, structure: Structure) -> None:
    """Refuse, in one line naming the layer, a structure a model's non-attention layers cannot take;
    for packed documents they can take, record which keyword arguments the forward must carry."""
    if not isinstance(structure, Structure):
        return
    structure._plans.pop(NEEDS, None)  # decided afresh for each model the structure is given to
    structure._plans.pop(CHECKED, None)
    found = recurrent_layers(config)
    if found is None:
        return
    kind = structure.row_kind()
    if kind == "sequences":
        return
    layer_type, mixer = found
    where = f"{mixer.name} (layer type {layer_type!r})"
    if kind == "graph":
        raise GraphattnMaskError(f"{where} reads the row in order: a schema graph cannot pass it")
    if kind == "gaps":
        raise GraphattnMaskError(f"{where} reads the row in order: padding inside a row would reach the next tokens")
    if kind == "tree":
        raise GraphattnMaskError(
            f"{where} reads the row in order, so a prefix tree's branch would carry its state into its sibling: "
            "pack one root-to-leaf path per row on this model"
        )
    if mixer.never:
        raise GraphattnMaskError(
            f"{where} cannot keep packed documents apart: {mixer.never}; pack one document per row"
        )
    missing = _kernels_missing(mixer, structure.device)
    if missing:
        raise GraphattnMaskError(
            f"{where} cannot keep packed documents apart on {structure.device.type}: its PyTorch path ignores "
            f"document boundaries, and the kernels that honour them ({', '.join(missing)}) are not installed or do "
            "not run on this device; pack one document per row"
        )
    if any(k in ONE_ROW_KWARGS for k in mixer.reads) and structure.shape[0] != 1:
        raise GraphattnMaskError(
            f"{where} takes packed documents as one flattened row (cu_seq_lens_q), got {structure.shape[0]} rows; "
            "pack with max_length=None (one row)"
        )
    structure._plans[NEEDS] = (where, mixer.reads)  # set per model: one structure may visit several
    structure._plans[CHECKED] = True


def check_boundary_kwargs(structure: Structure, kwargs: dict) -> None:
    """In an attention layer: the forward carries the boundaries `check_hybrid` asked for, equal to
    the structure's (compared once per batch and tensor, not per layer)."""
    need = structure._plans.get(NEEDS)
    if need is None:
        return
    where, reads = need
    for key in reads:
        given = kwargs.get(key)
        if not isinstance(given, torch.Tensor):
            raise GraphattnMaskError(
                f"{where} needs the documents' boundaries as the forward's `{key}` argument: pass the batch of "
                "pack_documents(..., return_seq_idx=True, return_flash_kwargs=True)"
            )
        if not structure.cached(("hybrid", "same", key, id(given)), lambda: _same(structure, key, given)):
            raise GraphattnMaskError(f"{where}: `{key}` does not match the structure's documents")


def _same(structure: Structure, key: str, given: torch.Tensor) -> bool:
    """`given` equals what pack_documents(..., return_seq_idx=True, return_flash_kwargs=True) returns."""
    from graphattn.hf.export import flash_kwargs, seq_idx

    expected = seq_idx(structure) if key == "seq_idx" else flash_kwargs(structure)[key]
    return given.shape == expected.shape and torch.equal(given.to(expected.device).long(), expected.long())
