"""load_etc_checkpoint on damaged and contradictory etcmodel checkpoints made here from the
fixture: each is one CheckpointError line naming the file and the key or tensor, raised before an
encoder is built where the config and the tensors disagree on a size; the caller's own overrides
are blamed as the caller's."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from bundle_writer import write_bundle

import graphattn.nn.etc_checkpoint as etc_checkpoint
from graphattn.errors import GraphattnError
from graphattn.nn.etc_checkpoint import load_etc_checkpoint
from graphattn.nn.tensorbundle import CheckpointError, TensorBundle

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "etc"
LAYERS = "etc_document_bert/global_local_transformer_layers/"


@pytest.fixture
def folder(tmp_path) -> Path:
    shutil.copytree(FIXTURES / "share_kv", tmp_path / "ckpt")
    return tmp_path / "ckpt"


@pytest.fixture
def no_build(monkeypatch):
    """Fail the test if the loader builds an encoder: the checks must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("an encoder was built before the contradiction was found")

    monkeypatch.setattr(etc_checkpoint, "EtcEncoder", refuse)


def _fails(path, *parts, kind=CheckpointError, **overrides) -> str:
    with pytest.raises(kind) as exc:
        load_etc_checkpoint(path, **overrides)
    message = str(exc.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    return message


def _config(folder: Path, **change) -> None:
    config = json.loads((folder / "etc_config.json").read_text())
    (folder / "etc_config.json").write_text(json.dumps({**config, **change}))


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    with TensorBundle(folder / "model.ckpt") as bundle:
        return {n: bundle.read(n).numpy().copy() for n in bundle.names()}


def _rewrite(folder: Path, tensors: dict[str, np.ndarray]) -> None:
    for path in folder.glob("model.ckpt.*"):
        path.unlink()
    write_bundle(folder / "model.ckpt", tensors)


# -- sizes come from the tensors, before any module exists -----------------------------------------


def test_a_layer_count_typo_is_caught_before_building(folder, no_build):
    _config(folder, num_hidden_layers=200)  # within EtcConfig's bound: only the tensors can refute it
    _fails(
        folder, "etc_config.json: $.num_hidden_layers: 200 contradicts the checkpoint", "hold 2", "fused_att_layer_0..1"
    )


def test_a_layer_count_beyond_any_model_is_refused_as_a_value(folder, no_build):
    _config(folder, num_hidden_layers=16000)
    _fails(folder, "etc_config.json: $.num_hidden_layers: must be an integer in [1, 256], got 16000")


def test_fewer_layers_in_the_config_than_in_the_checkpoint(folder, no_build):
    _config(folder, num_hidden_layers=1)  # would load layer 0 and leave layer 1 behind
    _fails(folder, "$.num_hidden_layers: 1 contradicts the checkpoint", "hold 2")


def test_a_third_layer_in_the_checkpoint_only(folder, no_build):
    tensors = _tensors(folder)
    for name in [n for n in tensors if "_layer_1/" in n]:
        tensors[name.replace("_layer_1/", "_layer_2/")] = tensors[name]
    _rewrite(folder, tensors)
    _fails(folder, "$.num_hidden_layers: 2 contradicts the checkpoint", "hold 3")


def test_a_layer_with_only_some_of_its_parts(folder, no_build):
    tensors = _tensors(folder)
    for name in [n for n in tensors if "fused_att_layer_1/" in n]:
        tensors[name.replace("_layer_1/", "_layer_2/")] = tensors[name]
    _rewrite(folder, tensors)
    _fails(folder, "model.ckpt.index", "layer 2 is missing: feed_forward_layer_2/ is absent")


def test_a_huge_layer_number_is_not_counted_up_to(folder, no_build):
    tensors = _tensors(folder)
    name = next(n for n in tensors if "fused_att_layer_1/" in n)
    tensors[name.replace("_layer_1/", "_layer_999999/")] = tensors[name]
    _rewrite(folder, tensors)
    _fails(folder, "model.ckpt.index", "layer 2 is missing: feed_forward_layer_2/ is absent while layers up to 999999")
    tensors[name.replace("_layer_1/", "_layer_" + "9" * 5000 + "/")] = tensors.pop(
        name.replace("_layer_1/", "_layer_999999/")
    )
    _rewrite(folder, tensors)
    _fails(folder, "model.ckpt.index", "is not canonical")


def test_a_pre_training_head_of_the_wrong_rank(tmp_path):
    folder = shutil.copytree(FIXTURES / "share_qkv", tmp_path / "with_heads")
    tensors = _tensors(folder)
    name = "cls/predictions/transform/dense/kernel"
    tensors[name] = tensors[name].reshape(2, -1, tensors[name].shape[-1])
    _rewrite(folder, tensors)
    _fails(folder, "model.ckpt.index", name, "has 2 dimensions")


def test_a_non_canonical_layer_number(folder, no_build):
    tensors = _tensors(folder)
    name = next(n for n in tensors if "fused_att_layer_1/" in n)
    tensors[name.replace("_layer_1/", "_layer_01/")] = tensors[name]
    _rewrite(folder, tensors)
    _fails(folder, "model.ckpt.index", "layer number '01' is not canonical")


@pytest.mark.parametrize(
    "change, key, found",
    [
        ({"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 64}, "hidden_size", "hold 32"),
        ({"num_attention_heads": 4}, "num_attention_heads", "hold 2"),
        ({"relative_vocab_size": 16}, "relative_vocab_size", "hold 12"),
        ({"vocab_size": 100}, "vocab_size", "hold 64"),
        ({"segment_vocab_size": 8}, "segment_vocab_size", "hold 4"),
        ({"max_absolute_position_embeddings": 40}, "max_absolute_position_embeddings", "hold 0"),
    ],
)
def test_every_size_is_proven_against_the_tensors(folder, no_build, change, key, found):
    _config(folder, **change)
    _fails(folder, f"etc_config.json: $.{key}:", "contradicts the checkpoint", found)


def test_an_unused_tensor_under_the_encoders_scope(folder):
    tensors = _tensors(folder)
    tensors["etc_document_bert/extra_projection/kernel"] = np.zeros((2, 2), np.float32)
    _rewrite(folder, tensors)
    _fails(folder, "model.ckpt.index", "'etc_document_bert/extra_projection/kernel'", "no parameter of the encoder")


def test_a_nan_weight_under_a_valid_checksum(folder):
    tensors = _tensors(folder)
    name = "etc_document_bert/segment_emb_lookup/embedding_table"
    tensors[name][1, 3] = np.nan
    tensors[name][2, 0] = np.inf
    _rewrite(folder, tensors)
    _fails(folder, "model.ckpt.data-00000-of-00001", name, "2 non-finite values", "[1, 3]")


# -- etc_config.json itself ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"vocab_size": 64, "hidden_size": 32, "hidden_size": 64}', "$.hidden_size: the key appears twice"),
        ('{"vocab_size": 64, "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested 100001 deep"),
        ('{"vocab_size": 6' + "4" * 5000 + "}", "an integer of 5,001 digits"),
        ('{"vocab_size": 64, "initializer_range": NaN}', "NaN is not a JSON number"),
        (
            '{"vocab_size": 64, "initializer_range": 1e400}',
            "$.initializer_range: must be a finite number in [0, 1], got inf",
        ),
        ('{"vocab_size": 64,', "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"hidden_size": 32}', "$.vocab_size: missing"),
    ],
)
def test_config_text_that_cannot_be_proven(folder, no_build, text, expected):
    (folder / "etc_config.json").write_text(text)
    _fails(folder, "etc_config.json", expected)


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"hidden_act": ["gelu"]}, "$.hidden_act: ['gelu'] is not one of gelu, relu"),
        ({"initializer_range": 10.0}, "$.initializer_range: must be a finite number in [0, 1], got 10.0"),
        ({"initializer_range": -0.02}, "$.initializer_range: must be a finite number in [0, 1]"),
        ({"attention_probs_dropout_prob": "0.1"}, "$.attention_probs_dropout_prob: must be a finite number"),
        ({"hidden_dropout_prob": 1.5}, "$.hidden_dropout_prob: must be a finite number in [0, 1)"),
        ({"grad_checkpointing_period": "2"}, "$.grad_checkpointing_period: must be an integer"),
        ({"embedding_size": 2.5}, "$.embedding_size: must be null or an integer"),
        ({"relative_vocab_size": None}, "$.relative_vocab_size: must be an integer"),
        ({"relative_pos_max_distance": 10}, "$.relative_vocab_size: 12 is too small for relative_pos_max_distance=10"),
    ],
)
def test_config_values_typed_and_bounded(folder, no_build, change, expected):
    _config(folder, **change)
    _fails(folder, "etc_config.json", expected)


def test_a_config_larger_than_its_bound_is_not_read(folder, no_build):
    text = (folder / "etc_config.json").read_text()
    (folder / "etc_config.json").write_text(text[:-1] + " " * (2 << 20) + "}")
    _fails(folder, "etc_config.json", "more than the 1,048,576 such a file may hold")


def test_unknown_config_keys_are_reported_not_dropped_silently(folder):
    _config(folder, pooler_size=7)
    _, report = load_etc_checkpoint(folder)
    assert ("etc_config.json: $.pooler_size", "not a key of etcmodel's EtcConfig: ignored, as etcmodel ignores it") in (
        report.dropped
    )


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink loop"])
def test_a_config_that_is_not_a_regular_file(folder, no_build, kind):
    config = folder / "etc_config.json"
    config.unlink()
    if kind == "fifo":
        os.mkfifo(config)
        expected = "a FIFO (named pipe), not a regular file"
    elif kind == "directory":
        config.mkdir()
        expected = "a directory, not a regular file"
    else:
        config.symlink_to(config.name)
        expected = "a symlink loop"
    _fails(folder, "etc_config.json", expected)


def test_a_checkpoint_path_that_loops_or_is_not_there(tmp_path):
    (tmp_path / "loop").symlink_to("loop")
    _fails(tmp_path / "loop", "loop", "a symlink loop, not a checkpoint directory")
    _fails(tmp_path / "nothing", "nothing: no such checkpoint directory or prefix")


# -- the caller's own arguments ------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"atention_backend": "dense"}, "load_etc_checkpoint(atention_backend='dense'): 'atention_backend' is not"),
        ({"hidden_size": 64}, "load_etc_checkpoint(hidden_size=64): hidden_size comes from the checkpoint"),
        ({"share_qkv_projections": False}, "share_qkv_projections comes from the checkpoint"),
        ({"hidden_dropout_prob": 2.0}, "load_etc_checkpoint(hidden_dropout_prob=2.0): must be a finite number"),
        ({"attention_backend": "cuda"}, "load_etc_checkpoint(attention_backend='cuda'): 'cuda' is not one of"),
    ],
)
def test_overrides_are_blamed_as_the_callers(folder, overrides, expected):
    message = _fails(folder, expected, kind=GraphattnError, **overrides)
    assert "etc_config.json" not in message


def test_overrides_that_hold_no_weights_apply(folder):
    encoder, _ = load_etc_checkpoint(folder, attention_backend="dense", hidden_dropout_prob=0.0, local_radius=5)
    assert (encoder.config.attention_backend, encoder.config.hidden_dropout_prob) == ("dense", 0.0)
    assert encoder.config.local_radius == 5
