"""A corrupt or malformed checkpoint directory: a CheckpointError naming the file and what was expected."""

from __future__ import annotations

import json
import os
import pickle
import random

import pytest
import torch

pytest.importorskip("transformers")

from test_lift import save_hf  # noqa: E402

from graphattn.nn.lift import CheckpointError, etc_config_from_hf, lift_pretrained  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _edit_config(directory, change) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps(change(config)))


def _as_bin(directory) -> None:
    """The checkpoint as pytorch_model.bin instead of model.safetensors."""
    from safetensors.torch import load_file

    torch.save(load_file(str(directory / "model.safetensors")), directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()


def _cut(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


CASES = {
    "config is a list": (
        lambda d: (d / "config.json").write_text("[1, 2]"),
        "config.json",
        "must hold a JSON object, got a list",
    ),
    "config is not JSON": (
        lambda d: (d / "config.json").write_text("{oops"),
        "config.json:1",
        "config.json is not valid JSON",
    ),
    "config lacks a size": (
        lambda d: _edit_config(d, lambda c: {k: v for k, v in c.items() if k != "hidden_size"}),
        "config.json",
        "needs hidden_size as a positive integer, found missing",
    ),
    "size is a string": (
        lambda d: _edit_config(d, lambda c: {**c, "num_hidden_layers": "2"}),
        "config.json",
        "needs num_hidden_layers as a positive integer, found '2'",
    ),
    "random safetensors": (
        lambda d: (d / "model.safetensors").write_bytes(os.urandom(4096)),
        "model.safetensors",
        "not a readable safetensors file",
    ),
    "truncated safetensors": (
        lambda d: _cut(d / "model.safetensors"),
        "model.safetensors",
        "not a readable safetensors file",
    ),
    "truncated pytorch_model.bin": (
        lambda d: (_as_bin(d), _cut(d / "pytorch_model.bin")),
        "pytorch_model.bin",
        "not a readable PyTorch checkpoint",
    ),
    "pickled code, not tensors": (
        lambda d: (_as_bin(d), (d / "pytorch_model.bin").write_bytes(pickle.dumps(object()))),
        "pytorch_model.bin",
        "graphattn loads weights only, never code",
    ),
    "not a state dict": (
        lambda d: (_as_bin(d), torch.save([1, 2], d / "pytorch_model.bin")),
        "pytorch_model.bin",
        "expected a state dict of tensors, got list",
    ),
    "index without a weight map": (
        lambda d: (d / "model.safetensors.index.json").write_text('{"weight_map": 3}'),
        "model.safetensors.index.json",
        "needs a weight_map",
    ),
    "no weights at all": (
        lambda d: (d / "model.safetensors").unlink(),
        "",
        "no model.safetensors or pytorch_model.bin",
    ),
}
# Random bytes: torch's weights-only unpickler fails on them in several ways; these seeds give
# an UnpicklingError, an IndexError, a KeyError and a UnicodeDecodeError (torch 2.13).
for _seed in (0, 2, 20, 195):
    CASES[f"random pytorch_model.bin (seed {_seed})"] = (
        lambda d, seed=_seed: (_as_bin(d), (d / "pytorch_model.bin").write_bytes(random.Random(seed).randbytes(4096))),
        "pytorch_model.bin",
        "not a readable PyTorch checkpoint",
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_broken_checkpoint_is_a_checkpoint_error_naming_the_file(tmp_path, case):
    damage, file, says = CASES[case]
    save_hf("bert", tmp_path)
    damage(tmp_path)
    with pytest.raises(CheckpointError) as err:
        lift_pretrained(tmp_path)
    assert says in str(err.value)
    assert str(err.value).startswith(str(tmp_path / file) if file else str(tmp_path))


def test_a_config_dict_without_sizes_is_refused_before_anything_is_built():
    with pytest.raises(CheckpointError, match=r"\$\.vocab_size: config.json needs vocab_size"):
        etc_config_from_hf({"model_type": "bert"})
