"""graphattn as a transformers attention implementation: `register()` and the two compute paths.

transformers builds a model's masks through `AttentionMaskInterface[config._attn_implementation]`
(once per forward and layer type: full, sliding) and calls `AttentionInterface[...]` in every
attention module. Ours:

- the mask function receives our `Structure` (transformers treats it as a [B, N] padding mask and
  only moves it to the device) and the model's own mask function; it reads that function's rule as
  a range of allowed offsets (causal, sliding window, bidirectional window) by probing it over the
  row's real length, refuses a rule that is not a function of the offset, applies the structure's
  `causal` override (refusing what a layer cannot honour) and returns a `LayerMask` (structure +
  rule) that every layer of that type shares. Without a structure (a padding mask or none, a KV
  cache while generating) it is transformers' own `sdpa_mask`;
- the attention function runs transformers' own SDPA on such ordinary inputs; with a LayerMask it
  refuses what it cannot honour (attention dropout while training, softcap, a structure that did
  not pass the mask function, position_ids other than the structure's, compared once per forward,
  labels without a bias table) and runs one of:
  * "chunked" (the CPU default, graphattn.hf.chunked): packed documents as plain SDPA per document
    on views of the row (causal / full without a mask); prefix trees and schema graphs per block of
    512 query rows over only the key tiles (of 128) the structure allows, recomputed in the backward
    pass where keeping them would take too much memory; exact, and deterministic gradients on CPU;
  * "flex" (the CUDA default): FlexAttention with a BlockMask built from the structure's tiles
    (never a mask_mod sweep), shared by every layer; relative labels reach it through score_mod.
"""

from __future__ import annotations

import torch

from graphattn.hf.hybrid import check_boundary_kwargs, check_hybrid
from graphattn.hf.structure import NO_LIMIT, GraphattnMaskError, LayerMask, LayerRule, Structure

BACKENDS = ("auto", "chunked", "flex")
BIAS_ATTRIBUTE = "graphattn_relative_bias"


# -- the mask function ------------------------------------------------------------------------------
_RULES: dict = {}  # (mask function's key, row length) -> LayerRule, for functions made of code and plain values
_RULES_KEPT = 256


def _function_key(function, depth: int = 0):
    """A hashable key of one of transformers.masking_utils' mask functions built from plain values
    (causal, sliding-window, and_masks / or_masks of those): two with one key compute the same
    thing. None for anything else, a closure over a tensor included (never cached)."""
    if depth > 8 or getattr(function, "__module__", None) != "transformers.masking_utils":
        return None
    if not hasattr(function, "__code__"):
        return None
    cells = []
    for cell in function.__closure__ or ():
        value = cell.cell_contents
        if value is None or isinstance(value, (bool, int, float, str)):
            cells.append(value)
        elif isinstance(value, (tuple, list)):
            keys = tuple(_function_key(f, depth + 1) for f in value)
            if any(k is None for k in keys):
                return None
            cells.append(keys)
        else:
            key = _function_key(value, depth + 1)
            if key is None:
                return None
            cells.append(key)
    return (function.__code__, tuple(cells))


def _rule_of(mask_function, length: int) -> LayerRule:
    """`_probe_rule`, remembered for mask functions that are plain code and values (transformers
    builds a fresh closure every forward; the probe then runs once per kind and row length)."""
    key = _function_key(mask_function)
    if key is None:
        return _probe_rule(mask_function, length)
    if (key, length) not in _RULES:
        if len(_RULES) >= _RULES_KEPT:
            _RULES.clear()
        _RULES[key, length] = _probe_rule(mask_function, length)
    return _RULES[key, length]


def _probe_rule(mask_function, length: int) -> LayerRule:
    """The key - query offsets a model's mask function allows in a row of `length` tokens, exact for
    every offset such a row holds (|offset| < length; an interval reaching the row's edge is no limit).
    Read with one vectorized call at the pairs that touch the row's last token, those that touch its
    first, and the neighbours (offsets -1, 0, 1) of every token; a rule that differs between them
    (a chunked mask, an overlay tied to token indices) is not a function of the offset: refused."""
    n = max(int(length), 2)  # 2: a causal rule reads as causal even on a one-token row
    offset = torch.arange(-(n - 1), n)
    q_end = torch.where(offset < 0, n - 1, n - 1 - offset)  # max(q, k) = n - 1
    q_start = torch.where(offset < 0, -offset, 0)  # min(q, k) = 0
    steps = torch.tensor([-1, 0, 1]).repeat_interleave(n)
    q_near = torch.arange(n).repeat(3)
    inside = (q_near + steps >= 0) & (q_near + steps < n)
    q_near, steps = q_near[inside], steps[inside]
    q = torch.cat([q_end, q_start, q_near])
    k = torch.cat([q_end + offset, q_start + offset, q_near + steps])
    zero = torch.zeros_like(q)
    try:
        answer = torch.as_tensor(mask_function(zero, zero, q, k), dtype=torch.bool).expand_as(q)
    except (IndexError, RuntimeError, TypeError) as error:
        raise GraphattnMaskError(
            f"the model's mask function cannot be read as a rule on offsets ({type(error).__name__}); "
            "graphattn cannot combine it"
        ) from None
    at_end, at_start, near = answer.split([offset.numel(), offset.numel(), q_near.numel()])
    if not torch.equal(at_end, at_start) or not torch.equal(near, at_end[steps + n - 1]):
        raise GraphattnMaskError(
            "the model's mask function depends on more than the key - query offset; graphattn cannot combine it"
        )
    kept = offset[at_end]
    if kept.numel() == 0 or not at_end[(offset >= kept.min()) & (offset <= kept.max())].all():
        raise GraphattnMaskError(f"the model's mask function allows the offsets {kept.tolist()}, not one interval")
    lo = -NO_LIMIT if int(kept.min()) == -(n - 1) else int(kept.min())
    hi = NO_LIMIT if int(kept.max()) == n - 1 else int(kept.max())
    return LayerRule(lo, hi)


def _combine(structure: Structure, rule: LayerRule, config) -> LayerRule:
    """The layer's own rule under the structure's `causal` override; what the two cannot both mean is
    refused. causal=None keeps the rule; True makes every layer causal (a bidirectional layer keeps
    its window's past half); False states that the layers attend both ways, so a causal layer refuses
    it (graphattn never widens a model's rule). A prefix tree needs causal layers: a shared prefix
    attending ahead would see every branch at once."""
    model = getattr(config, "model_type", None) or "this"
    structure.cached(("own rules",), set).add(rule)  # the layers' own rules in this batch, for check_parity
    if structure.causal is True:
        rule = LayerRule(rule.lo, min(rule.hi, 0))
    elif structure.causal is False and rule.causal:
        raise GraphattnMaskError(
            f"attention_mask: causal=False asks for attention both ways but the {model} model's layers are causal "
            "(graphattn never widens a model's rule); pack with causal=None to follow the model"
        )
    if not rule.causal and structure.has_branches():
        raise GraphattnMaskError(
            f"attention_mask: a prefix tree on the {model} model's bidirectional layers would let a shared prefix "
            "see every branch; pack_tree(..., causal=True) makes them causal, or pack each path as a document"
        )
    return rule


def graphattn_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask=None,
    local_size: int | None = None,
    config=None,
    **kwargs,
):
    """The AttentionMaskInterface entry: our structure plus the layer type's rule (a `LayerMask`);
    for ordinary inputs (no structure: a [B, N] padding mask or none, a KV cache while generating)
    transformers' own SDPA mask, so the same model trains packed and generates."""
    if not isinstance(attention_mask, Structure):
        from transformers.masking_utils import sdpa_mask

        if mask_function is not None:
            kwargs["mask_function"] = mask_function
        return sdpa_mask(
            batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask,
            local_size=local_size, config=config, **kwargs,
        )  # fmt: skip
    if isinstance(q_offset, torch.Tensor) or q_offset or kv_offset or kv_length != q_length:
        raise GraphattnMaskError(
            "graphattn structures cover a whole sequence: run without a KV cache (use_cache=False)"
        )
    if (batch_size, q_length) != attention_mask.shape:
        raise GraphattnMaskError(
            f"attention_mask: the structure is {tuple(attention_mask.shape)} tokens, "
            f"the input is {(batch_size, q_length)}"
        )
    check_hybrid(config, attention_mask)  # a hybrid model's recurrent layers read the row too
    rule = _combine(attention_mask, _rule_of(mask_function, q_length), config)
    return LayerMask(attention_mask, rule)


# -- the attention function -------------------------------------------------------------------------
def _check_positions(structure: Structure, positions) -> None:
    """Refuse `position_ids` other than the structure's. Checked once per forward, not per layer:
    the verdict is kept with the tensor it was given for (a host read on CUDA happens once, and
    never inside torch.compile, where the check is skipped)."""
    if not isinstance(positions, torch.Tensor) or torch.compiler.is_compiling():
        return
    seen = structure._plans.get("checked_positions")
    if seen is not None and seen[0] is positions and seen[1] == positions._version:
        return
    batch, length = structure.shape
    same = positions.shape[-1] == length and positions.dim() <= 2 and positions.shape[0] in (1, batch)
    if not (same and torch.equal(positions.expand(batch, -1).to(structure.positions), structure.positions)):
        raise GraphattnMaskError(
            "position_ids differ from the structure's positions: pass the position_ids the structure was built with"
        )
    structure._plans["checked_positions"] = (positions, positions._version)


def _check(module, attention_mask, dropout: float, kwargs: dict) -> LayerMask:
    if not isinstance(attention_mask, LayerMask):
        raise GraphattnMaskError(
            f"{type(module).__name__} got a {type(attention_mask).__name__} mask: this model does not build its "
            "masks through transformers.masking_utils, so graphattn cannot honour the structure (unsupported model)"
        )
    if dropout and dropout > 0:
        raise GraphattnMaskError(
            f"{type(module).__name__}: attention dropout {dropout} in training is not supported; set "
            "config.attention_dropout = 0.0 (graphattn never drops it silently)"
        )
    if kwargs.get("softcap"):
        raise GraphattnMaskError(f"{type(module).__name__}: attention logit softcapping is not supported")
    if kwargs.get("output_attentions"):
        raise GraphattnMaskError("output_attentions=True is not supported: graphattn never builds the N x N weights")
    structure = attention_mask.structure
    _check_positions(structure, kwargs.get("position_ids"))
    check_boundary_kwargs(structure, kwargs)
    if structure.has_labels and not hasattr(module, BIAS_ATTRIBUTE):
        raise GraphattnMaskError(
            f"{type(module).__name__}: the structure carries relative labels but the module has no bias table; "
            "call graphattn.hf.attach_relative_bias(model, structure.num_labels) first"
        )
    return attention_mask


def _bias_table(module, structure: Structure) -> torch.Tensor | None:
    table = getattr(module, BIAS_ATTRIBUTE, None) if structure.has_labels else None
    if table is not None and table.shape[1] < structure.num_labels:
        raise GraphattnMaskError(
            f"{type(module).__name__}: its bias table has {table.shape[1]} labels, "
            f"the structure uses {structure.num_labels}"
        )
    return table


def make_attention(backend: str):
    """The AttentionInterface entry for one backend ('auto': flex on CUDA, chunked elsewhere)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")

    def graphattn_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if attention_mask is None or isinstance(attention_mask, torch.Tensor):  # ordinary inputs: SDPA's own
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        layer = _check(module, attention_mask, dropout, kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        table = _bias_table(module, layer.structure)
        use_flex = backend == "flex" or (backend == "auto" and query.is_cuda)
        if use_flex:
            from graphattn.hf.flex import flex_forward

            out = flex_forward(query, key, value, layer, table, scale)
        else:
            from graphattn.hf.chunked import chunked_attention

            out = chunked_attention(query, key, value, layer, table, scale)
        return out.transpose(1, 2).contiguous(), None

    return graphattn_attention


# -- registration -------------------------------------------------------------------------------------
def register(name: str = "graphattn", backend: str = "auto") -> str:
    """Register graphattn with transformers under `name` and return it: load a model with
    `attn_implementation=name` (or `model.set_attn_implementation(name)`) and pass a structure
    from pack_documents / pack_tree / compile_schema as `attention_mask`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, make_attention(backend))
    AttentionMaskInterface.register(name, graphattn_mask)
    return name
