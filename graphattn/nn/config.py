"""EtcConfig: the encoder's hyper-parameters, with ETC-base defaults (etcmodel's EtcConfig)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from graphattn.errors import GraphattnError
from graphattn.kernels import BACKENDS
from graphattn.labels import first_schema_label_id
from graphattn.nn.config_fields import ACTIVATIONS, FORMAT_KEY, FORMAT_VERSION, check_field_types, fields_of_version


@dataclass
class EtcConfig:
    """ETC-base sizes by default. The sharing switches carry etcmodel's names and meaning:

    * `share_qkv_projections` (default): one Q, K, V for all four attention kinds;
      `share_kv_projections` (when the former is off): a query projection per side, and each
      side's queries see every token, long or global, through that side's own K/V; neither: K/V
      per kind (l2l, l2g, g2g, g2l) and a query projection per side.
    * `share_att_output_projection`, `share_feed_forward_params`: one output projection / one
      feed-forward block (with its LayerNorm) for both sides, or one per side.
    * `embedding_size` (None: hidden_size): token embeddings of that width, projected to
      hidden_size when they differ (ALBERT-style, as etcmodel).

    graphattn's own layout, which today's checkpoints use, differs from etcmodel's in a few
    switches etcmodel does not have; `etcmodel_layout()` turns them to etcmodel's:

    * `share_att_output_projection=True` (etcmodel's default is False);
    * `share_relative_tables`: one relative table pair for both query sides (etcmodel: one
      pair per side, `long_qkv_attention` and `global_qkv_attention`);
    * `share_attention_norm`: one post-attention LayerNorm for both sides (etcmodel: always two);
    * `relative_bias`: the learned bias b [V, H] per label is optional (etcmodel: always there).
      Ours is added after the 1/sqrt(d) scale, etcmodel's before it: an etcmodel bias table
      enters as table / sqrt(head_dim) (the loader's job; the scores are equal);
    * `global_token_projections`: graphattn's earlier meaning of share_qkv_projections=False
      (global tokens get their own Q/K/V, and every query sees a token through its token kind's
      K/V). Configurations saved before the etcmodel switches existed are read that way.
    * no dropout on attention probabilities (the fused/blocked kernels never materialize them);
      `hidden_dropout_prob` applies to embeddings, attention output and FFN output as in BERT.

    Every field is checked for its kind and bounds (`config_fields.py`: integers really integers,
    floats finite and in range). `to_dict` writes `format_version`; `from_dict` reads a saved dict
    by it (versions 0 and 1 predate the key and are known by their complete key set).
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
    share_kv_projections: bool = False
    share_att_output_projection: bool = True
    share_feed_forward_params: bool = True
    share_relative_tables: bool = True
    share_attention_norm: bool = True
    global_token_projections: bool = False
    embedding_size: int | None = None  # None: hidden_size
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

        check_field_types(self, fail, EtcConfig)
        if self.hidden_size % self.num_attention_heads:
            fail(
                "hidden_size", f"{self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )
        needed = first_schema_label_id(self.relative_pos_max_distance)  # distances, does_not_belong, belongs
        if self.relative_vocab_size < needed:
            fail(
                "relative_vocab_size",
                f"{self.relative_vocab_size} is too small for "
                f"relative_pos_max_distance={self.relative_pos_max_distance}: needs at least {needed}",
            )
        if self.attention_backend not in BACKENDS:
            fail("attention_backend", f"{self.attention_backend!r} is not one of {', '.join(BACKENDS)}")
        if self.hidden_act not in ACTIVATIONS:
            fail("hidden_act", f"{self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.global_token_projections and (self.share_qkv_projections or self.share_kv_projections):
            fail(
                "global_token_projections",
                "is a sharing mode of its own: it needs share_qkv_projections=False and share_kv_projections=False",
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def projection_mode(self) -> str:
        """Which Q/K/V projections exist: "shared", "per_side" (share_kv_projections),
        "per_kind" (neither) or "per_token_kind" (global_token_projections)."""
        if self.share_qkv_projections:
            return "shared"
        if self.share_kv_projections:
            return "per_side"
        return "per_token_kind" if self.global_token_projections else "per_kind"

    def etcmodel_layout(self) -> EtcConfig:
        """This configuration with etcmodel's fixed choices: a relative table pair and a
        post-attention LayerNorm per side, the bias table, GELU in its tanh form."""
        return replace(
            self, share_relative_tables=False, share_attention_norm=False, relative_bias=True, hidden_act="gelu_tanh"
        )

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
        """Every field, and `format_version` first: what `from_dict` reads back."""
        return {FORMAT_KEY: FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Any, *, file: str | None = None, path: tuple = ("EtcConfig",)) -> EtcConfig:
        """A saved configuration (run.json's encoder, ...), read by its `format_version`
        (`config_fields.fields_of_version`), never by guessing from which keys are missing: one
        saved before the etcmodel switches (version 0) meant by share_qkv_projections=False what is
        now `global_token_projections`, and its weights load under the same names.
        Errors name `file` and the key under `path`."""
        try:
            extra = frozenset(f.name for f in fields(cls)) - frozenset(f.name for f in fields(EtcConfig))
            return cls(**fields_of_version(data, extra))
        except GraphattnError as err:
            key = tuple(err.location.path)[1:] if tuple(err.location.path[:1]) == ("EtcConfig",) else ()
            raise GraphattnError(err.reason, file=file, path=(*path, *key)) from None
