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

from graphattn.hf.hybrid import recurrent_layers
from graphattn.hf.structure import GraphattnMaskError

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
        bases = [getattr(model, "model", None), getattr(model, "base_model", None)]  # model.model, .gpt_neox, ...
        base = next((b for b in bases if getattr(b, "rotary_emb", None) is not None), None)
        self.rotary = getattr(base, "rotary_emb", None)
        not_rope = {"alibi", "absolute", "relative_key", "relative_key_query"}
        if getattr(config, "alibi", False) is True or getattr(config, "position_embedding_type", None) in not_rope:
            raise GraphattnMaskError(
                f"BlockCache: the {name} model's positions are not RoPE (alibi / position_embedding_type); a "
                "passage's keys cannot be moved to another offset"
            )
        layers = getattr(base, "layers", None) or getattr(base, "h", None)
        if self.rotary is None or layers is None:
            raise GraphattnMaskError(
                f"BlockCache: the {name} model has no rotary position embedding (rotary_emb beside its layers); a "
                "passage's keys cannot be moved to another offset without RoPE"
            )
        if getattr(config, "is_causal", True) is False:
            raise GraphattnMaskError(
                f"BlockCache: the {name} model is set bidirectional (config.is_causal=False); a prompt built from a "
                "cache attends causally"
            )
        if recurrent_layers(config) is not None:
            raise GraphattnMaskError(
                f"BlockCache: the {name} model has recurrent / linear-attention layers: their state cannot be moved "
                "between passages"
            )
        names = ("self_attn", "attention", "self_attention", "attn")
        self.attention = [next((getattr(layer, n) for n in names if hasattr(layer, n)), None) for layer in layers]
        if any(a is None for a in self.attention):
            raise GraphattnMaskError(f"BlockCache: a layer of the {name} model has no self-attention module")
        if any(isinstance(getattr(a, "sinks", None), torch.Tensor) for a in self.attention):
            raise GraphattnMaskError(
                f"BlockCache: the {name} model has attention sinks (learned per-head sink logits); graphattn's "
                "block-attention reference does not cover them, so passages are not reused"
            )
        if getattr(config, "qk_rope_head_dim", None) or getattr(config, "kv_lora_rank", None):
            raise GraphattnMaskError(
                f"BlockCache: the {name} model uses multi-head latent attention (RoPE on a slice of each key, "
                "stored decompressed): its keys are not moved by graphattn"
            )
        # layers without RoPE (SmolLM3's no_rope_layers) keep their keys where they are
        self.rotated = [bool(getattr(a, "use_rope", True)) for a in self.attention]
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
        parameters = inspect.signature(self.apply).parameters  # a kernel wrapper takes (*args, **kwargs)
        wrapped = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters.values())
        if not wrapped and list(parameters)[:4] != ["q", "k", "cos", "sin"]:
            raise GraphattnMaskError(
                f"BlockCache: the {name} model's apply_rotary_pos_emb does not take (q, k, cos, sin); graphattn "
                "cannot rotate its keys with it"
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
        width = cos.shape[-1]  # partial rotary (StableLM, Phi): the first `width` dims turn, the rest pass
        turned = keys32[..., :width]
        _, rotated = self.apply(turned[:, :1], turned, cos, sin)  # one query head: only the keys matter
        if width < keys.shape[-1]:
            rotated = torch.cat([rotated, keys32[..., width:]], dim=-1)
        return rotated.to(keys.dtype)
