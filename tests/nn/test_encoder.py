"""EtcEncoder over compiled batches: shapes, backends, state_dict, autocast, checkpointing, errors."""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from graphattn.errors import BatchError, GraphattnError
from graphattn.nn import EtcConfig, EtcEncoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from kernel_cases import graph_batch  # noqa: E402
from kernel_cases import graph_config as config_for_batch  # noqa: E402


@pytest.fixture(scope="module")
def batch():
    return graph_batch()


def test_config_defaults_are_etc_base_and_large_preset() -> None:
    base = EtcConfig()
    assert (base.hidden_size, base.num_hidden_layers, base.num_attention_heads, base.intermediate_size) == (
        768,
        12,
        12,
        3072,
    )
    assert (base.local_radius, base.relative_pos_max_distance, base.relative_vocab_size) == (84, 12, 32)
    assert base.share_qkv_projections and base.max_absolute_position_embeddings == 0
    large = EtcConfig.etc_large()
    assert (large.local_radius, large.relative_pos_max_distance, large.num_hidden_layers) == (169, 24, 24)
    assert (large.hidden_size, large.num_attention_heads, large.intermediate_size) == (1024, 16, 4096)
    assert EtcConfig.from_dict(large.to_dict()) == large


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hidden_size=100), "hidden_size"),
        (dict(relative_vocab_size=20), "relative_vocab_size"),
        (dict(attention_backend="cuda"), "attention_backend"),
    ],
)
def test_config_rejects_inconsistent_values(changes, field) -> None:
    with pytest.raises(GraphattnError, match=rf"EtcConfig\.{field}"):
        EtcConfig(**changes)


def test_forward_shapes_and_backends_agree(batch) -> None:
    torch.manual_seed(0)
    encoder = EtcEncoder(config_for_batch(attention_backend="blocked")).double().eval()
    global_hidden, long_hidden = encoder(batch)
    assert global_hidden.shape == (2, batch.global_token_ids.shape[1], 32)
    assert long_hidden.shape == (2, batch.long_token_ids.shape[1], 32)
    dense = copy.deepcopy(encoder)
    for module in dense.modules():
        if hasattr(module, "config"):
            module.config = dataclasses.replace(module.config, attention_backend="dense")
    for a, b in zip(encoder(batch), dense(batch)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_state_dict_round_trip(batch) -> None:
    config = config_for_batch(max_absolute_position_embeddings=64, share_qkv_projections=False, relative_bias=True)
    encoder = EtcEncoder(config).eval()
    restored = EtcEncoder(config).eval()
    restored.load_state_dict(encoder.state_dict())
    for a, b in zip(encoder(batch), restored(batch)):
        assert torch.equal(a, b)
    names = set(encoder.state_dict())
    assert {
        "embeddings.word_embeddings.weight",
        "layer.0.attention.query.weight",
        "layer.1.output_norm.bias",
        "layer.0.attention.relative_key_table",
    } <= names


def test_autocast_bf16_forward_on_cpu(batch) -> None:
    encoder = EtcEncoder(config_for_batch()).eval()
    with torch.no_grad():
        full = encoder(batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = encoder(batch)
    for a, b in zip(mixed, full):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.float(), b, rtol=0.1, atol=0.1)


def test_gradient_checkpointing_gives_the_same_gradients(batch) -> None:
    torch.manual_seed(0)
    plain = EtcEncoder(config_for_batch()).train()
    checkpointed = EtcEncoder(config_for_batch(gradient_checkpointing=True)).train()
    checkpointed.load_state_dict(plain.state_dict())
    grads = []
    for model in (plain, checkpointed):
        global_hidden, long_hidden = model(batch)
        (global_hidden.sum() + long_hidden.square().sum()).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


def test_batch_errors_name_the_problem(batch) -> None:
    with pytest.raises(BatchError, match="relative_vocab_size is 15"):
        EtcEncoder(config_for_batch(relative_vocab_size=15, relative_pos_max_distance=2))(
            dataclasses.replace(batch, vocab_size=16)
        )
    with pytest.raises(BatchError, match="local radius 3 but the model's local_radius is 4"):
        EtcEncoder(config_for_batch(local_radius=4))(batch)
    with pytest.raises(BatchError, match=r"long_token_ids.*\[0, 5\)"):
        EtcEncoder(config_for_batch(vocab_size=5))(batch)


@pytest.mark.slow
def test_torch_compile_matches_eager_forward_and_trains(batch) -> None:
    encoder = EtcEncoder(config_for_batch()).eval()
    compiled = torch.compile(encoder)
    with torch.no_grad():
        for a, b in zip(compiled(batch), encoder(batch)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    encoder.train()
    global_hidden, long_hidden = compiled(batch)
    (global_hidden.sum() + long_hidden.square().sum()).backward()
    assert encoder.layer[0].attention.relative_key_table.grad is not None
