"""EtcConfig: every field typed and bounded, and saved configurations read by their format version,
never by guessing from the keys they lack."""

import dataclasses
import math

import pytest

from graphattn.errors import GraphattnError
from graphattn.nn import EtcConfig
from graphattn.nn.config_fields import FORMAT_VERSION, LAYOUTS


def test_the_current_version_lists_every_field():
    # a field added without a new format version would make old files mean something else
    assert LAYOUTS[FORMAT_VERSION] == {f.name for f in dataclasses.fields(EtcConfig)}


def test_to_dict_carries_the_version_and_reads_back():
    config = EtcConfig.etc_large(share_qkv_projections=False, share_kv_projections=True)
    saved = config.to_dict()
    assert saved["format_version"] == FORMAT_VERSION
    assert EtcConfig.from_dict(saved) == config


def _fails(data, *parts, **where) -> str:
    with pytest.raises(GraphattnError) as exc:
        EtcConfig.from_dict(data, **where)
    message = str(exc.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    return message


def test_a_partial_dict_without_version_is_refused_not_guessed():
    # etcmodel's meaning or graphattn's old one: no way to tell, so no architecture is built
    _fails(
        {"share_qkv_projections": False},
        "run.json",
        "$.encoder.format_version",
        "absent",
        file="run.json",
        path=("encoder",),
    )
    current = {k: v for k, v in EtcConfig().to_dict().items() if k != "format_version"}
    del current["share_kv_projections"]  # neither version 0's keys nor version 1's
    _fails(current, "format_version", "missing share_kv_projections")


def test_versions_zero_and_one_are_known_by_their_complete_key_sets():
    v1 = {k: v for k, v in EtcConfig(share_qkv_projections=False).to_dict().items() if k != "format_version"}
    assert EtcConfig.from_dict(v1).projection_mode == "per_kind"
    v0 = {k: v for k, v in v1.items() if k in LAYOUTS[0]}
    assert EtcConfig.from_dict(v0).projection_mode == "per_token_kind"
    assert EtcConfig.from_dict({**v0, "format_version": 0}).projection_mode == "per_token_kind"


@pytest.mark.parametrize(
    "change, key, expected",
    [
        ({"format_version": 3}, "format_version", "newer than this graphattn reads"),
        ({"format_version": "2"}, "format_version", "must be an integer"),
        ({"format_version": True}, "format_version", "must be an integer"),
        ({"colour": "red"}, "colour", "is not a field of format_version 2"),
        ({"hidden_act": ["gelu"]}, "hidden_act", "must be a string"),
        ({"hidden_act": "swish"}, "hidden_act", "'swish' is not one of"),
        ({"initializer_range": 1e400}, "initializer_range", "finite number"),
        ({"initializer_range": -0.5}, "initializer_range", "in [0, 1]"),
        ({"hidden_dropout_prob": "0.1"}, "hidden_dropout_prob", "got '0.1'"),
        ({"hidden_dropout_prob": 1.0}, "hidden_dropout_prob", "[0, 1)"),
        ({"layer_norm_eps": math.nan}, "layer_norm_eps", "finite"),
        ({"num_hidden_layers": 16000}, "num_hidden_layers", "[1, 256]"),
        ({"num_hidden_layers": 2.0}, "num_hidden_layers", "must be an integer"),
        ({"hidden_size": True}, "hidden_size", "must be an integer"),
        ({"vocab_size": 1 << 80}, "vocab_size", "must be an integer"),
        ({"share_kv_projections": "false"}, "share_kv_projections", "true or false"),
        ({"embedding_size": 0}, "embedding_size", "or None"),
        ({"attention_backend": ["auto"]}, "attention_backend", "must be a string"),
    ],
)
def test_every_value_is_typed_and_bounded(change, key, expected):
    data = {**EtcConfig().to_dict(), **change}
    _fails(data, "cfg.json", f"$.encoder.{key}", expected, file="cfg.json", path=("encoder",))


def test_the_constructor_checks_as_from_dict_does():
    with pytest.raises(GraphattnError, match=r"EtcConfig\.initializer_range: must be a finite number"):
        EtcConfig(initializer_range=float("inf"))
    with pytest.raises(GraphattnError, match=r"EtcConfig\.num_hidden_layers"):
        EtcConfig(num_hidden_layers=-1)
    assert EtcConfig(hidden_dropout_prob=0).hidden_dropout_prob == 0.0  # a JSON 0 is a float here
    assert isinstance(EtcConfig(hidden_dropout_prob=0).hidden_dropout_prob, float)


def test_a_missing_field_of_a_versioned_dict_is_named():
    data = EtcConfig().to_dict()
    del data["local_radius"]
    _fails(data, "$.EtcConfig.local_radius", "missing")
