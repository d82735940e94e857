"""What each EtcConfig field may hold, and how a saved configuration is read by its format version.

Kept apart from `config.py` so that the bounds and the versions are one table each: `EtcConfig`
checks every field against them when it is made, and `EtcConfig.from_dict` reads a saved
dict by the version it carries (`format_version`), never by guessing from the keys it lacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral, Real
from typing import Any

from graphattn.errors import GraphattnError

FORMAT_KEY = "format_version"
FORMAT_VERSION = 2  # 2: every field below, written with this key; 0 and 1: see LAYOUTS
ACTIVATIONS = ("gelu", "gelu_tanh", "relu")

# Integers: inclusive bounds (a size beyond them is no model this library can allocate).
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 4_000_000),
    "type_vocab_size": (1, 65_536),
    "hidden_size": (1, 16_384),
    "num_hidden_layers": (1, 256),
    "num_attention_heads": (1, 1_024),
    "intermediate_size": (1, 65_536),
    "local_radius": (1, 65_536),
    "relative_pos_max_distance": (1, 65_536),
    "relative_vocab_size": (1, 65_536),
    "max_absolute_position_embeddings": (0, 1_048_576),
    "embedding_size": (1, 65_536),  # or None: hidden_size
}
# Floats: finite, low <= value, value < high (open) or <= high (closed).
FLOAT_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "hidden_dropout_prob": (0.0, 1.0, False),
    "layer_norm_eps": (0.0, 1.0, True),
    "initializer_range": (0.0, 1.0, True),
}
NULLABLE = frozenset({"embedding_size"})

_V0 = (  # graphattn before etcmodel's sharing switches: share_qkv_projections=False meant global token projections
    "vocab_size",
    "type_vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "local_radius",
    "relative_pos_max_distance",
    "relative_vocab_size",
    "share_qkv_projections",
    "relative_bias",
    "max_absolute_position_embeddings",
    "hidden_act",
    "hidden_dropout_prob",
    "layer_norm_eps",
    "initializer_range",
    "attention_backend",
    "gradient_checkpointing",
)
_V1 = _V0 + (  # etcmodel's switches, written without a version key
    "share_kv_projections",
    "share_att_output_projection",
    "share_feed_forward_params",
    "share_relative_tables",
    "share_attention_norm",
    "global_token_projections",
    "embedding_size",
)
# The exact field set of each version. Versions 0 and 1 were written without `format_version`
# and are recognised by their complete key set; from version 2 on the key says it.
LAYOUTS: dict[int, frozenset[str]] = {0: frozenset(_V0), 1: frozenset(_V1), 2: frozenset(_V1)}


def _is_int(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_field_types(config: Any, fail: Callable[[str, str], None], owner: type) -> None:
    """Every field `owner` declares (a subclass's own fields, e.g. LongformerConfig's windows, are
    its own to check) of its declared kind and within its bounds; integers and floats are
    normalised to Python int / float in place (a numpy integer, a JSON 0 for a float)."""
    from dataclasses import fields

    for spec in fields(owner):
        name, kind, value = spec.name, str(spec.type), getattr(config, spec.name)
        if value is None and name in NULLABLE:
            continue
        if kind == "bool":
            if not isinstance(value, bool):
                fail(name, f"must be true or false, got {_shown(value)}")
        elif kind == "str":
            if not isinstance(value, str):
                fail(name, f"must be a string, got {_shown(value)}")
        elif name in INT_BOUNDS:
            low, high = INT_BOUNDS[name]
            if not _is_int(value) or not low <= value <= high:
                fail(
                    name,
                    f"must be an integer in [{low:,}, {high:,}]"
                    + (" or None" if name in NULLABLE else "")
                    + f", got {_shown(value)}",
                )
            setattr(config, name, int(value))
        elif name in FLOAT_BOUNDS:
            low, high, closed = FLOAT_BOUNDS[name]
            number = float(value) if isinstance(value, Real) and not isinstance(value, bool) else None
            inside = (
                number is not None
                and math.isfinite(number)
                and low <= number
                and (number <= high if closed else number < high)
            )
            if not inside:
                fail(
                    name, f"must be a finite number in [{low:g}, {high:g}{']' if closed else ')'}, got {_shown(value)}"
                )
            setattr(config, name, number)
        else:  # a field added without a kind here: a bug in this table, not in the caller's input
            raise TypeError(f"EtcConfig.{name}: no bound declared in graphattn.nn.config_fields")


def fields_of_version(data: Any, extra: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The EtcConfig keyword arguments a saved dict means, read by its `format_version`.

    Version 2 (and later, once there is one) carries the key; versions 0 and 1 were written without
    it, every field present, and are known by their exact key set. A dict that is neither (some
    keys left out and no version) is refused: which architecture it means cannot be proven.
    `extra`: the fields a subclass adds (LongformerConfig's windows), part of every version's layout."""

    def fail(key: str, message: str) -> None:
        raise GraphattnError(message, path=("EtcConfig", key))

    if not isinstance(data, dict):
        raise GraphattnError(f"expected an object of EtcConfig fields, got {type(data).__name__}", path=("EtcConfig",))
    body = {k: v for k, v in data.items() if k != FORMAT_KEY}
    keys = set(body)
    if FORMAT_KEY in data:
        version = data[FORMAT_KEY]
        if not _is_int(version) or version < 0:
            fail(FORMAT_KEY, f"must be an integer in [0, {FORMAT_VERSION}], got {_shown(version)}")
        if version > FORMAT_VERSION:
            fail(
                FORMAT_KEY, f"{version} is newer than this graphattn reads (up to {FORMAT_VERSION}): upgrade graphattn"
            )
        expected = LAYOUTS[int(version)] | extra
        unknown, missing = sorted(keys - expected), sorted(expected - keys)
        if unknown:
            fail(unknown[0], f"is not a field of format_version {version}")
        if missing:
            fail(missing[0], f"missing: format_version {version} has every field ({len(missing)} missing)")
    else:
        found = [v for v in (0, 1) if LAYOUTS[v] | extra == keys]
        if not found:
            nearest = min((0, 1), key=lambda v: len((LAYOUTS[v] | extra) ^ keys))
            layout = LAYOUTS[nearest] | extra
            missing, unknown = sorted(layout - keys), sorted(keys - layout)
            diff = "; ".join(
                part
                for part in (
                    f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}" if missing else "",
                    f"unknown {', '.join(unknown[:4])}{' ...' if len(unknown) > 4 else ''}" if unknown else "",
                )
                if part
            )
            fail(
                FORMAT_KEY,
                f"absent, and the keys are not a complete configuration of an earlier graphattn (nearest, version "
                f'{nearest}: {diff}); write every field with "{FORMAT_KEY}": {FORMAT_VERSION}, as EtcConfig.to_dict '
                "does",
            )
        version = found[0]
    if version == 0 and body["share_qkv_projections"] is False:
        body["global_token_projections"] = True  # version 0's meaning of share_qkv_projections=False
    return body


__all__ = ["ACTIVATIONS", "FORMAT_KEY", "FORMAT_VERSION", "LAYOUTS", "check_field_types", "fields_of_version"]
