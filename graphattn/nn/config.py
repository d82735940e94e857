"""EtcConfig: the encoder's hyper-parameters, with ETC-base defaults (etcmodel's EtcConfig)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from graphattn.errors import GraphattnError
from graphattn.kernels import BACKENDS
from graphattn.labels import first_schema_label_id


@dataclass
class EtcConfig:
    """ETC-base by default. Differences from etcmodel, on purpose:

    * no dropout on attention probabilities (the fused/blocked kernels never materialize them);
      `hidden_dropout_prob` applies to embeddings, attention output and FFN output as in BERT;
    * one output projection shared by global and long (etcmodel's share_att_output_projection
      = False keeps two), and one feed-forward block for both (its default);
    * `relative_bias` adds an optional learned bias b [V, H] per label (off in ETC).
    """

    vocab_size: int = 30522
    type_vocab_size: int = 16  # etcmodel's segment_vocab_size
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    local_radius: int = 84
    relative_pos_max_distance: int = 12
    relative_vocab_size: int = 32
    share_qkv_projections: bool = True
    relative_bias: bool = False
    max_absolute_position_embeddings: int = 0  # 0: no absolute positions (ETC's default)
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    attention_backend: str = "auto"
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        def fail(name: str, message: str) -> None:
            raise GraphattnError(message, path=("EtcConfig", name))

        for name in (
            "vocab_size",
            "type_vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "local_radius",
        ):
            if getattr(self, name) < 1:
                fail(name, f"must be a positive integer, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            fail(
                "hidden_size", f"{self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )
        if self.relative_pos_max_distance < 1:
            fail("relative_pos_max_distance", f"must be >= 1, got {self.relative_pos_max_distance}")
        needed = first_schema_label_id(self.relative_pos_max_distance)  # distances, does_not_belong, belongs
        if self.relative_vocab_size < needed:
            fail(
                "relative_vocab_size",
                f"{self.relative_vocab_size} is too small for "
                f"relative_pos_max_distance={self.relative_pos_max_distance}: needs at least {needed}",
            )
        if self.max_absolute_position_embeddings < 0:
            fail(
                "max_absolute_position_embeddings",
                f"must be >= 0 (0 disables), got {self.max_absolute_position_embeddings}",
            )
        if not 0.0 <= self.hidden_dropout_prob < 1.0:
            fail("hidden_dropout_prob", f"must be in [0, 1), got {self.hidden_dropout_prob}")
        if self.attention_backend not in BACKENDS:
            fail("attention_backend", f"{self.attention_backend!r} is not one of {', '.join(BACKENDS)}")
        if self.hidden_act not in ("gelu", "gelu_tanh", "relu"):
            fail("hidden_act", f"{self.hidden_act!r} is not one of gelu, gelu_tanh, relu")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def etc_large(cls, **overrides: Any) -> EtcConfig:
        """ETC-large: r 169, k 24, 24 layers, hidden 1024, 16 heads, FFN 4096. k = 24 needs 51
        relative ids, so the relative vocabulary grows to 64 (room for schema labels)."""
        large = dict(
            local_radius=169,
            relative_pos_max_distance=24,
            relative_vocab_size=64,
            num_hidden_layers=24,
            hidden_size=1024,
            num_attention_heads=16,
            intermediate_size=4096,
        )
        return cls(**{**large, **overrides})

    def with_changes(self, **changes: Any) -> EtcConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EtcConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise GraphattnError(f"unknown EtcConfig fields: {', '.join(unknown)}", path=("EtcConfig",))
        return cls(**data)
