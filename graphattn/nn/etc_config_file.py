"""etcmodel's `etc_config.json`, read strictly: bounded in size and nesting before it is parsed,
duplicate keys and oversized integers refused, every value typed and bounded, and the caller's own
`overrides` checked as the caller's.

Which version: `etc_config.json` is etcmodel's format (its `EtcConfig.to_json_string`), which
carries no version. It is read by etcmodel's own rule, stated here once: a key etcmodel knows and
the file leaves out takes etcmodel's default (`ETCMODEL_DEFAULTS`, etcmodel's `EtcConfig.__init__`),
`vocab_size` has no default, and a key etcmodel does not know is ignored, as etcmodel ignores it,
and listed in the load report. No key's absence is taken to mean another format: every value that
shapes the encoder (layers, sizes, heads, relative vocabulary, sharing switches) is then proven
against the tensors (`etc_geometry.py`) before anything is built. graphattn's own configuration
dicts (`EtcConfig.to_dict`) carry `format_version` instead (`config_fields.py`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from graphattn.errors import GraphattnError
from graphattn.nn.config import EtcConfig
from graphattn.nn.config_fields import FLOAT_BOUNDS, INT_BOUNDS
from graphattn.nn.tensorbundle import CheckpointError, read_bounded

CONFIG_FILE = "etc_config.json"
MAX_CONFIG_BYTES = 1 << 20  # etcmodel's configs are under 1 KB
MAX_JSON_DEPTH = 16  # etcmodel's config is one flat object
MAX_INT_DIGITS = 20  # any size or count fits in 64 bits

# etcmodel's EtcConfig defaults: a key missing from etc_config.json means this value.
ETCMODEL_DEFAULTS: dict[str, Any] = dict(
    segment_vocab_size=16,
    embedding_size=None,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    local_radius=84,
    att_size_per_head=None,
    relative_pos_max_distance=12,
    relative_vocab_size=32,
    max_absolute_position_embeddings=0,
    intermediate_size=3072,
    hidden_act="gelu",
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    initializer_range=0.02,
    share_feed_forward_params=True,
    share_kv_projections=False,
    share_qkv_projections=True,
    share_att_output_projection=False,
    use_pre_activation_order=False,
    use_hard_g2l_mask=False,
    use_hard_l2g_mask=False,
    grad_checkpointing_period=0,
)
REQUIRED = ("vocab_size",)  # etcmodel's EtcConfig takes it without a default
ACTIVATIONS = {"gelu": "gelu_tanh", "relu": "relu"}  # etcmodel's "gelu" is the tanh form
# etcmodel key -> graphattn EtcConfig field whose bounds it has (the one table of bounds)
_SAME_BOUNDS = {
    "vocab_size": "vocab_size",
    "segment_vocab_size": "type_vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "local_radius": "local_radius",
    "intermediate_size": "intermediate_size",
    "relative_pos_max_distance": "relative_pos_max_distance",
    "relative_vocab_size": "relative_vocab_size",
    "max_absolute_position_embeddings": "max_absolute_position_embeddings",
    "embedding_size": "embedding_size",
    "att_size_per_head": "hidden_size",
    "grad_checkpointing_period": "num_hidden_layers",
    "hidden_dropout_prob": "hidden_dropout_prob",
    "attention_probs_dropout_prob": "hidden_dropout_prob",
    "initializer_range": "initializer_range",
}
NULLABLE = frozenset({"embedding_size", "att_size_per_head"})
# EtcConfig fields that hold no weights and decide no weight's shape or meaning: what a caller may change
OVERRIDABLE = frozenset(
    {
        "attention_backend",
        "hidden_dropout_prob",
        "gradient_checkpointing",
        "local_radius",
        "layer_norm_eps",
        "initializer_range",
    }
)


class _Refused(Exception):
    """Raised inside json.loads' hooks; turned into one CheckpointError line by `load_json_object`."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"$.{key}: the key appears twice (JSON readers disagree on which one counts)")
        out[key] = value
    return out


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-')):,} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _constant(name: str) -> float:
    raise _Refused(f"{name} is not a JSON number")


def _nesting(data: bytes) -> tuple[int, int]:
    """(deepest nesting of [ and {, byte offset where it is reached), strings left out."""
    plain = re.sub(rb'"(?:[^"\\]|\\.)*"', lambda m: b"_" * len(m.group(0)), data)
    codes = np.frombuffer(plain, dtype=np.uint8)
    step = np.isin(codes, (ord("["), ord("{"))).astype(np.int64) - np.isin(codes, (ord("]"), ord("}")))
    if not len(step):
        return 0, 0
    depth = np.cumsum(step)
    at = int(depth.argmax())
    return int(depth[at]), at


def load_json_object(path: Path, limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A JSON object from a regular file of at most `limit` bytes, nested at most MAX_JSON_DEPTH
    deep, without duplicate keys, NaN/Infinity or integers longer than MAX_INT_DIGITS."""
    data = read_bounded(path, "config", limit)
    depth, at = _nesting(data)
    if depth > MAX_JSON_DEPTH:
        line = data.count(b"\n", 0, at) + 1
        raise CheckpointError(
            f"nested {depth} deep (at most {MAX_JSON_DEPTH}; a config is one flat object)", file=path, line=line
        )
    try:
        text = data.decode("utf-8")
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_bounded_int, parse_constant=_constant)
    except UnicodeDecodeError as err:
        raise CheckpointError(f"not UTF-8 (byte {err.start})", file=path) from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"not valid JSON: {err.msg} (column {err.colno})", file=path, line=err.lineno) from None
    except (_Refused, RecursionError, ValueError) as err:
        raise CheckpointError(str(err) or "nested too deeply", file=path) from None
    if not isinstance(value, dict):
        raise CheckpointError(f"expected a JSON object, got {type(value).__name__}", file=path)
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_etc_config(path: Path) -> tuple[dict[str, Any], list[str]]:
    """(etc_config.json over etcmodel's defaults, every value typed and bounded; the keys etcmodel
    does not know, which it ignores and the load report lists)."""
    data = load_json_object(path)

    def fail(key: str, message: str) -> CheckpointError:
        return CheckpointError(message, file=path, path=(key,))

    for key in REQUIRED:
        if key not in data:
            raise fail(key, "missing (etcmodel's EtcConfig has no default for it)")
    unknown = sorted(k for k in data if k not in ETCMODEL_DEFAULTS and k not in REQUIRED)
    merged = {**ETCMODEL_DEFAULTS, **{k: v for k, v in data.items() if k not in unknown}}
    for key, value in merged.items():
        default = ETCMODEL_DEFAULTS.get(key)
        if value is None and key in NULLABLE:
            continue
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise fail(key, f"must be true or false, got {_shown(value)}")
        elif key == "hidden_act":
            if not isinstance(value, str) or value not in ACTIVATIONS:
                raise fail(key, f"{_shown(value)} is not one of {', '.join(ACTIVATIONS)}")
        elif _SAME_BOUNDS[key] in FLOAT_BOUNDS:
            low, high, closed = FLOAT_BOUNDS[_SAME_BOUNDS[key]]
            number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
            if not (math.isfinite(number) and low <= number and (number <= high if closed else number < high)):
                raise fail(
                    key, f"must be a finite number in [{low:g}, {high:g}{']' if closed else ')'}, got {_shown(value)}"
                )
        else:
            low, high = INT_BOUNDS[_SAME_BOUNDS[key]]
            low = 0 if key == "grad_checkpointing_period" else low
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise fail(
                    key,
                    f"must be {'null or ' if key in NULLABLE else ''}an integer in [{low:,}, {high:,}], "
                    f"got {_shown(value)}",
                )
    if merged["att_size_per_head"] not in (None, merged["hidden_size"] // merged["num_attention_heads"]):
        raise fail(
            "att_size_per_head",
            f"{merged['att_size_per_head']} differs from hidden_size / num_attention_heads; graphattn's attention "
            "keeps head size * heads = hidden size",
        )
    if merged["use_pre_activation_order"]:
        raise fail("use_pre_activation_order", "pre-LN layers are not supported (post-LN only)")
    return merged, unknown


# graphattn field -> the etcmodel key a problem with it is reported under
_ETC_KEY = {"type_vocab_size": "segment_vocab_size", "gradient_checkpointing": "grad_checkpointing_period"}


def etc_config_from_etcmodel(etc: dict[str, Any], path: Path) -> EtcConfig:
    """graphattn's EtcConfig for etcmodel's: same switches, etcmodel's fixed choices; a value
    EtcConfig refuses is reported as the etc_config.json key it came from."""
    try:
        config = EtcConfig(
            vocab_size=etc["vocab_size"],
            type_vocab_size=etc["segment_vocab_size"],
            embedding_size=etc["embedding_size"] if etc["embedding_size"] != etc["hidden_size"] else None,
            hidden_size=etc["hidden_size"],
            num_hidden_layers=etc["num_hidden_layers"],
            num_attention_heads=etc["num_attention_heads"],
            intermediate_size=etc["intermediate_size"],
            local_radius=etc["local_radius"],
            relative_pos_max_distance=etc["relative_pos_max_distance"],
            relative_vocab_size=etc["relative_vocab_size"],
            share_qkv_projections=etc["share_qkv_projections"],
            share_kv_projections=etc["share_kv_projections"] and not etc["share_qkv_projections"],
            share_att_output_projection=etc["share_att_output_projection"],
            share_feed_forward_params=etc["share_feed_forward_params"],
            max_absolute_position_embeddings=etc["max_absolute_position_embeddings"],
            hidden_dropout_prob=etc["hidden_dropout_prob"],
            initializer_range=etc["initializer_range"],
            gradient_checkpointing=bool(etc["grad_checkpointing_period"]),
        ).etcmodel_layout()
        return config.with_changes(hidden_act=ACTIVATIONS[etc["hidden_act"]])
    except GraphattnError as err:
        field = str(err.location.path[-1]) if err.location.path else ""
        key = _ETC_KEY.get(field, field)
        raise CheckpointError(err.reason, file=path, path=(key,) if key else ()) from None


def apply_overrides(config: EtcConfig, overrides: dict[str, Any], caller: str = "load_etc_checkpoint") -> EtcConfig:
    """`config` with the caller's `overrides`, each checked as the caller's argument: only fields
    that hold no weights (OVERRIDABLE), each a value EtcConfig takes."""
    known = set(EtcConfig.__dataclass_fields__)
    for key, value in overrides.items():
        shown = f"{caller}({key}={_shown(value)})"
        if key not in known:
            raise GraphattnError(f"{shown}: {key!r} is not an EtcConfig field")
        if key not in OVERRIDABLE:
            raise GraphattnError(
                f"{shown}: {key} comes from the checkpoint (it shapes or gives meaning to the weights); "
                f"a caller may change only {', '.join(sorted(OVERRIDABLE))}"
            )
    try:
        return config.with_changes(**overrides)
    except GraphattnError as err:
        key = str(err.location.path[-1]) if err.location.path else next(iter(overrides))
        raise GraphattnError(f"{caller}({key}={_shown(overrides.get(key))}): {err.reason}") from None


__all__ = [
    "CONFIG_FILE",
    "ETCMODEL_DEFAULTS",
    "apply_overrides",
    "etc_config_from_etcmodel",
    "load_json_object",
    "read_etc_config",
]
