"""A decoder's RoPE seen from outside, for moving cached keys (`BlockCache`): what is refused and the
rotation by an offset.

RoPE rotations compose: a key rotated for position j, rotated again by the angle of offset o, is
the key of position o + j. The angle comes from the model's own rotary module (its inv_freq and
rope scaling; the attention scaling some rope types fold into cos / sin is divided out, read as
the value at offset 0) and is applied with the model's own `apply_rotary_pos_emb` (its layout:
halves or interleaved, partial rotary). What cannot be moved is refused in one line: no RoPE,
rope types whose frequencies depend on the sequence length (dynamic, longrope), multimodal RoPE,
attention sinks, recurrent layers and layer kinds other than full / sliding-window attention.
"""

from __future__ import annotations

import inspect
import sys

import torch

from graphattn.hf.attention import GraphattnMaskError
from graphattn.hf.hybrid import recurrent_layers

ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
UNMOVABLE_ROPE = {
    "dynamic": "recomputes its frequencies from the sequence length",
    "longrope": "switches its frequencies with the sequence length",
}


class Rope:
    """A decoder's RoPE as seen from outside: the rotary module, the apply function of its
    attention modules and each layer's type (Gemma 3 keeps one rotation per layer type)."""

    def __init__(self, model):
        config = model.config
        name = str(getattr(config, "model_type", None) or type(model).__name__)
        base = getattr(model, "model", None)
        self.rotary = getattr(base, "rotary_emb", None)
        layers = getattr(base, "layers", None)
        if self.rotary is None or layers is None:
            raise GraphattnMaskError(
                f"BlockCache: the {name} model has no rotary position embedding (model.model.rotary_emb); a passage's "
                "keys cannot be moved to another offset without RoPE"
            )
        if recurrent_layers(config) is not None:
            raise GraphattnMaskError(
                f"BlockCache: the {name} model has recurrent / linear-attention layers: their state cannot be moved "
                "between passages"
            )
        self.attention = [getattr(layer, "self_attn", None) for layer in layers]
        if any(a is None for a in self.attention):
            raise GraphattnMaskError(f"BlockCache: a layer of the {name} model has no self_attn module")
        if any(isinstance(getattr(a, "sinks", None), torch.Tensor) for a in self.attention):
            raise GraphattnMaskError(
                f"BlockCache: the {name} model has attention sinks (learned per-head sink logits); graphattn's "
                "block-attention reference does not cover them, so passages are not reused"
            )
        types = getattr(config, "layer_types", None) or ["full_attention"] * len(layers)
        odd = sorted({str(t) for t in types} - set(ATTENTION_LAYER_TYPES))
        if odd:
            raise GraphattnMaskError(f"BlockCache: the {name} model has {odd[0]} layers; only full and sliding-window "
                                     "attention layers can take moved passages")  # fmt: skip
        self.layer_types = [str(t) for t in types]
        self._check_rope_type(config, name)
        module = sys.modules.get(type(self.attention[0]).__module__)
        self.apply = getattr(module, "apply_rotary_pos_emb", None)
        if self.apply is None:
            raise GraphattnMaskError(
                f"BlockCache: the {name} model's attention module has no apply_rotary_pos_emb function to rotate with"
            )
        self.by_type = "layer_type" in inspect.signature(self.rotary.forward).parameters
        self.windows = self._windows(config)

    def _check_rope_type(self, config, name: str) -> None:
        params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        groups = [params] if not params or "rope_type" in params or "type" in params else list(params.values())
        for group in groups:
            group = group if isinstance(group, dict) else {}
            kind = str(group.get("rope_type", group.get("type", "default")))
            if kind in UNMOVABLE_ROPE:
                raise GraphattnMaskError(
                    f"BlockCache: the {name} model's rope_type {kind!r} {UNMOVABLE_ROPE[kind]}; a key rotated at one "
                    "length cannot be re-rotated exactly at another"
                )
            if "mrope_section" in group or kind in ("mrope", "3d"):
                raise GraphattnMaskError(
                    f"BlockCache: the {name} model uses multimodal RoPE (mrope): its positions are not one offset"
                )

    @staticmethod
    def _windows(config) -> dict[int, int]:
        """Layer index -> sliding window, for the layers that have one."""
        window = getattr(config, "sliding_window", None)
        if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
            return {}
        types = getattr(config, "layer_types", None)  # without them (Mistral) every layer slides
        types = types or ["sliding_attention"] * int(config.num_hidden_layers)
        return {i: window for i, t in enumerate(types) if t == "sliding_attention"}

    def rotation(self, offsets: torch.Tensor, layer: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos / sin of the rotation by `offsets` (one per token), float32, without the rope's
        attention scaling (read as the value at offset 0): [1, n, head_dim]."""
        x = torch.empty(0, dtype=torch.float32, device=device)
        extra = (self.layer_types[layer],) if self.by_type else ()
        positions = torch.cat([offsets.new_zeros(1), offsets]).to(device)[None]
        cos, sin = self.rotary(x, positions, *extra)
        scale = cos[:, :1, :1].float()
        return cos[:, 1:].float() / scale, sin[:, 1:].float() / scale

    def rotate(self, keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Keys [1, H, n, d] rotated further by cos / sin, in float32, cast back."""
        keys32 = keys.float()
        _, rotated = self.apply(keys32[:, :1, :1], keys32, cos, sin)  # a one-row query: only the keys matter
        return rotated.to(keys.dtype)
