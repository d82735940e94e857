"""Lifting BERT / RoBERTa checkpoints (built by HF transformers from random configs, saved to a
temp dir: nothing is downloaded) into EtcEncoder, checked against the HF model's outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from graphattn.compile.side_inputs import side_inputs_from_example_ids  # noqa: E402
from graphattn.contract import EtcBatch  # noqa: E402
from graphattn.errors import GraphattnError  # noqa: E402
from graphattn.nn import EtcConfig  # noqa: E402
from graphattn.nn.lift import etc_config_from_hf, lift_pretrained  # noqa: E402

SIZES = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
RADIUS = 24  # >= every length used below: the local window covers the whole input


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def save_hf(kind: str, directory, head: bool = False, safe: bool = True):
    """A random-weight HF model saved with save_pretrained; returns it in eval mode."""
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(**SIZES, max_position_embeddings=40, type_vocab_size=2)
        model = transformers.BertForMaskedLM(config) if head else transformers.BertModel(config)
    else:
        config = transformers.RobertaConfig(
            **SIZES, max_position_embeddings=42, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5
        )
        model = transformers.RobertaForMaskedLM(config) if head else transformers.RobertaModel(config)
    with torch.no_grad():  # HF zero-initialises biases and unit LayerNorms: randomise them so a swapped copy shows
        for name, param in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(str(directory), safe_serialization=safe)
    return model.eval()


def long_only_batch(token_ids: torch.Tensor, type_ids: torch.Tensor, lengths: list[int]) -> EtcBatch:
    """No global tokens; padding is its own example (id 0), as collate lays it out."""
    B, L = token_ids.shape
    example_ids = (torch.arange(L)[None] < torch.tensor(lengths)[:, None]).int()
    side = side_inputs_from_example_ids(
        example_ids, torch.zeros(B, 0, dtype=torch.int32), torch.zeros(B, L, dtype=torch.int32), RADIUS, 2
    )
    empty = torch.zeros(B, 0, dtype=torch.long)
    return EtcBatch(token_ids, type_ids, empty, empty, example_ids, empty.int(), side, 7)


SHARING_MODES = {  # name -> EtcConfig switches, and how many q/k/v Linear modules a layer has
    "shared": ({}, 3),
    "global_token": ({"share_qkv_projections": False, "global_token_projections": True}, 6),
    "per_side": ({"share_qkv_projections": False, "share_kv_projections": True}, 6),
    "etcmodel_unshared": (
        {
            "share_qkv_projections": False,
            "share_att_output_projection": False,
            "share_feed_forward_params": False,
            "share_relative_tables": False,
            "share_attention_norm": False,
            "relative_bias": True,
        },
        10,
    ),
}


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("mode", list(SHARING_MODES))
def test_lifted_encoder_reproduces_the_hf_model(tmp_path, kind, mode) -> None:
    switches, qkv_modules = SHARING_MODES[mode]
    hf = save_hf(kind, tmp_path)
    encoder, report = lift_pretrained(
        tmp_path, local_radius=RADIUS, relative_pos_max_distance=2, relative_vocab_size=8, **switches
    )
    encoder.eval()
    gen = torch.Generator().manual_seed(1)
    lengths = [19, 13]
    token_ids = torch.randint(3, SIZES["vocab_size"], (2, 19), generator=gen)
    type_ids = torch.randint(0, 2, (2, 19), generator=gen) if kind == "bert" else torch.zeros(2, 19, dtype=torch.long)
    attention_mask = (torch.arange(19)[None] < torch.tensor(lengths)[:, None]).long()
    if kind == "roberta":
        token_ids = token_ids.masked_fill(attention_mask == 0, 1)  # RoBERTa pads with padding_idx (positions stay put)
    with torch.no_grad():
        expected = hf(input_ids=token_ids, token_type_ids=type_ids, attention_mask=attention_mask).last_hidden_state
        global_hidden, long_hidden = encoder(long_only_batch(token_ids, type_ids, lengths))
    assert global_hidden.shape == (2, 0, 32)
    real = attention_mask.bool()
    torch.testing.assert_close(long_hidden[real], expected[real], rtol=1e-5, atol=1e-5)
    qkv = {"query", "key", "value", "global_query"} | {
        f"{k}_{p}" for k in ("global", "l2g", "g2l") for p in ("key", "value")
    }
    copied = [etc for etc, _, _ in report.copied if etc.startswith("layer.0.")]
    assert sum(etc.startswith("layer.0.attention.") and etc.split(".")[3] in qkv for etc in copied) == 2 * qkv_modules
    # every parameter of the layer is either copied from BERT or a created relative table
    created = {etc for etc, _ in report.created}
    for name, _ in encoder.layer[0].named_parameters():
        assert f"layer.0.{name}" in set(copied) | created, name


def test_report_lists_copied_created_and_dropped_and_keeps_the_mlm_head(tmp_path) -> None:
    save_hf("bert", tmp_path, head=True, safe=False)  # BertForMaskedLM, pytorch_model.bin, "bert." prefixes
    encoder, report = lift_pretrained(
        tmp_path, local_radius=RADIUS, relative_pos_max_distance=2, relative_vocab_size=8, relative_bias=True
    )
    assert ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight", (99, 32)) in report.copied
    assert ("layer.1.output_norm.bias", "encoder.layer.1.output.LayerNorm.bias", (32,)) in report.copied
    created = dict(report.created)
    assert created["layer.0.attention.relative_key_table"].startswith("zeros")
    assert "layer.1.attention.relative_bias_table" in created
    assert created["embeddings.token_type_embeddings.weight[2:]"].startswith("14 new token type rows")
    assert torch.equal(
        encoder.embeddings.token_type_embeddings.weight[5], encoder.embeddings.token_type_embeddings.weight[0]
    )
    dropped = dict(report.dropped)
    assert (
        "cls.predictions.transform.dense.weight" in dropped
        and "cls.predictions.transform.dense.weight" in report.unused
    )
    text = str(report)
    assert (
        text.startswith("lifted bert from")
        and "layer.*.attention.query.weight <- encoder.layer.*.attention.self.query.weight [32, 32] (x2)" in text
    )


def test_positions_kept_or_dropped_by_config(tmp_path) -> None:
    save_hf("roberta", tmp_path)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    assert (
        etc_config_from_hf(hf_config).max_absolute_position_embeddings == 42 - 2
    )  # RoBERTa: rows from padding_idx + 1
    encoder, report = lift_pretrained(tmp_path, keep_absolute_positions=False, local_radius=RADIUS)
    assert encoder.embeddings.position_embeddings is None
    assert dict(report.dropped)["embeddings.position_embeddings.weight"].startswith(
        "max_absolute_position_embeddings=0"
    )
    fewer, report = lift_pretrained(tmp_path, local_radius=RADIUS, max_absolute_position_embeddings=16)
    hf_positions = report.unused.get("embeddings.position_embeddings.weight")
    assert hf_positions is None  # it was used, only its tail was dropped
    assert "embeddings.position_embeddings.weight[18:]" in dict(report.dropped)


def test_size_mismatch_names_the_tensor_and_both_shapes(tmp_path) -> None:
    save_hf("bert", tmp_path)
    wrong = EtcConfig(**{**SIZES, "intermediate_size": 64}, local_radius=RADIUS, max_absolute_position_embeddings=40)
    with pytest.raises(
        GraphattnError,
        match=(
            r"encoder\.layer\.0\.intermediate\.dense\.weight has shape \(37, 32\) "
            r"but layer\.0\.intermediate\.weight has shape \(64, 32\)"
        ),
    ):
        lift_pretrained(tmp_path, wrong)
    with pytest.raises(
        GraphattnError, match=r"wants 64 positions \(shape \(64, 32\)\).*\(shape \(40, 32\)\) serves 40"
    ):
        lift_pretrained(tmp_path, local_radius=RADIUS, max_absolute_position_embeddings=64)
    with pytest.raises(
        GraphattnError, match="has 99 vocabulary rows but embeddings.word_embeddings.weight has only 50"
    ):
        lift_pretrained(tmp_path, local_radius=RADIUS, vocab_size=50)
    bigger, report = lift_pretrained(tmp_path, local_radius=RADIUS, vocab_size=120)  # added tokens: new rows, fresh
    assert dict(report.created)["embeddings.word_embeddings.weight[99:]"].endswith("freshly initialised")


def test_unreadable_checkpoints_are_clear_errors(tmp_path) -> None:
    with pytest.raises(GraphattnError, match="no config.json"):
        lift_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", **SIZES}))
    with pytest.raises(GraphattnError, match="model_type 'gpt2' cannot be lifted"):
        lift_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", **SIZES, "max_position_embeddings": 8}))
    with pytest.raises(GraphattnError, match="no model.safetensors or pytorch_model.bin"):
        lift_pretrained(tmp_path, local_radius=RADIUS)
    (tmp_path / "config.json").write_text('{"model_type": "bert",\n  oops}')
    with pytest.raises(GraphattnError, match="not valid JSON") as err:
        lift_pretrained(tmp_path)
    assert err.value.location.line == 2 and str(err.value).startswith(f"{tmp_path / 'config.json'}:2: ")


def test_lifted_encoder_still_trains_with_global_tokens(tmp_path) -> None:
    """After lifting, a batch with globals runs and the new relative tables receive gradients."""
    save_hf("bert", tmp_path)
    encoder, _ = lift_pretrained(tmp_path, local_radius=3, relative_pos_max_distance=2, relative_vocab_size=8)
    B, L, G = 1, 10, 2
    long_ids = torch.from_numpy(np.array([[2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]))
    sentence_ids = torch.tensor([[0] * 5 + [1] * 5], dtype=torch.int32)
    side = side_inputs_from_example_ids(
        torch.ones(B, L, dtype=torch.int32), torch.ones(B, G, dtype=torch.int32), sentence_ids, 3, 2
    )
    batch = EtcBatch(
        long_ids,
        torch.zeros_like(long_ids),
        torch.ones(B, G, dtype=torch.long),
        torch.zeros(B, G, dtype=torch.long),
        torch.ones(B, L),
        torch.ones(B, G),
        side,
        8,
    )
    global_hidden, long_hidden = encoder(batch)
    (global_hidden.sum() + long_hidden.sum()).backward()
    assert encoder.layer[0].attention.relative_key_table.grad.abs().sum() > 0
