"""etcmodel checkpoints in graphattn: every backend reproduces etcmodel's own outputs (fixtures made
by running etcmodel's TensorFlow EtcModel, tests/fixtures/etc/make_fixtures.py), every tensor is
accounted for, and a damaged or contradictory checkpoint is one CheckpointError, never a
half-loaded model."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from bundle_writer import write_bundle

from graphattn.contract import EtcBatch, SideInputs
from graphattn.nn.etc_checkpoint import extend_relative_vocab, load_etc_checkpoint
from graphattn.nn.tensorbundle import CheckpointError, TensorBundle

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "etc"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "io.npz").is_file())
SIDE = [f"{kind}_{what}" for what in ("att_mask", "relative_att_ids") for kind in ("l2l", "g2g", "l2g", "g2l")]
TOLERANCE = 1e-4  # fp32, the bound; reached: about 2e-6 on every case and backend


def fixture_batch(io) -> EtcBatch:
    """etcmodel's inputs as graphattn's contract: the same fields under graphattn's names."""
    tensor = lambda name: torch.from_numpy(np.asarray(io[name]))  # noqa: E731
    vocab = 1 + max(int(io[name].max()) for name in SIDE if "relative" in name)
    return EtcBatch(
        long_token_ids=tensor("token_ids"),
        long_type_ids=tensor("segment_ids"),
        global_token_ids=tensor("global_token_ids"),
        global_type_ids=tensor("global_segment_ids"),
        long_input_mask=tensor("long_valid").int(),
        global_input_mask=tensor("global_valid").int(),
        side=SideInputs(**{name: tensor(name) for name in SIDE}),
        vocab_size=vocab,
    )


def max_errors(encoder, io) -> tuple[float, float]:
    encoder.eval()
    with torch.no_grad():
        global_out, long_out = encoder(fixture_batch(io))
    long_valid, global_valid = io["long_valid"], io["global_valid"]  # padding rows: etcmodel's are uniform
    long_err = np.abs(long_out.numpy()[long_valid] - io["long_output"][long_valid]).max()
    global_err = np.abs(global_out.numpy()[global_valid] - io["global_output"][global_valid]).max()
    return float(long_err), float(global_err)


@pytest.mark.parametrize("backend", ["dense", "blocked", "flex"])
@pytest.mark.parametrize("case", CASES)
def test_every_backend_reproduces_etcmodel(case, backend):
    encoder, _ = load_etc_checkpoint(FIXTURES / case, attention_backend=backend)
    long_err, global_err = max_errors(encoder, np.load(FIXTURES / case / "io.npz"))
    assert long_err <= TOLERANCE and global_err <= TOLERANCE, (case, backend, long_err, global_err)


@pytest.mark.parametrize("case", ["share_kv", "separate"])
def test_the_triton_backend_reproduces_etcmodel(case):
    pytest.importorskip("triton")
    encoder, _ = load_etc_checkpoint(FIXTURES / case, attention_backend="triton")
    long_err, global_err = max_errors(encoder, np.load(FIXTURES / case / "io.npz"))
    assert long_err <= TOLERANCE and global_err <= TOLERANCE, (long_err, global_err)


def test_sharing_modes_are_read_from_the_tensors():
    expect = {
        "share_qkv": ("shared", False, True),
        "share_kv": ("per_side", False, True),
        "share_kv_abs_pos_shared_output": ("per_side", True, True),
        "separate": ("per_kind", False, True),
        "separate_ffn_embedding_size": ("per_kind", False, False),
    }
    for case, (mode, shared_output, shared_ffn) in expect.items():
        config = load_etc_checkpoint(FIXTURES / case)[0].config
        assert (config.projection_mode, config.share_att_output_projection, config.share_feed_forward_params) == (
            mode,
            shared_output,
            shared_ffn,
        ), case
    assert load_etc_checkpoint(FIXTURES / "separate_ffn_embedding_size")[0].config.embedding_size == 8


def test_every_tensor_is_loaded_or_reported():
    encoder, report = load_etc_checkpoint(FIXTURES / "share_qkv" / "model.ckpt")  # the prefix works too
    bundle = TensorBundle(FIXTURES / "share_qkv" / "model.ckpt")
    loaded = {theirs for _, theirs, _ in report.copied}
    dropped = dict(report.dropped)
    assert loaded | set(dropped) == set(bundle.names()) and not loaded & set(dropped)
    assert len(report.copied) == len(encoder.state_dict())
    assert dropped["global_step"] == "training step counter"
    assert dropped["cls/predictions/output_bias"].startswith("pre-training head")
    kernel = bundle.read("cls/predictions/transform/dense/kernel")
    torch.testing.assert_close(report.unused["cls.predictions.transform.dense.weight"], kernel.t())
    table = bundle.read(
        "etc_document_bert/global_local_transformer_layers/fused_att_layer_1/fused_global_local_att/"
        "global_qkv_attention/relative_bias_table"
    )
    torch.testing.assert_close(encoder.layer[1].attention.global_relative_bias_table.detach(), table / 4.0)  # /sqrt(16)


def test_pretraining_heads_start_from_the_checkpoint():
    from graphattn.train.pretrain import PretrainingModel

    encoder, report = load_etc_checkpoint(FIXTURES / "share_qkv")
    model = PretrainingModel(encoder)
    copied = model.load_heads(report.unused)
    assert len(copied) == 7
    torch.testing.assert_close(model.mlm.bias.detach(), report.unused["cls.predictions.bias"])
    torch.testing.assert_close(model.cpc.projection.weight.detach(), report.unused["cls.cpc.projection.weight"])


def test_a_schema_with_more_relative_labels_gets_new_rows(tmp_path):
    encoder, report = load_etc_checkpoint(FIXTURES / "share_kv")
    io = np.load(FIXTURES / "share_kv" / "io.npz")
    before = max_errors(encoder, io)
    grown = extend_relative_vocab(encoder, 20, report)
    assert len(grown) == 2 * 4 and encoder.config.relative_vocab_size == 20  # 2 layers x key/bias x long/global
    assert encoder.layer[0].attention.global_relative_key_table.shape[0] == 20
    assert any("rows 12..19 new" in how for _, how in report.created)
    assert max_errors(encoder, io) == before  # the old labels score as before


# -- failures: one line each, nothing handed out ----------------------------------------------------


def _copy(tmp_path, case="share_kv") -> Path:
    shutil.copytree(FIXTURES / case, tmp_path / case)
    return tmp_path / case


def _fails(path, *parts) -> str:
    with pytest.raises(CheckpointError) as exc:
        load_etc_checkpoint(path)
    message = str(exc.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    return message


def test_truncated_data_shard(tmp_path):
    folder = _copy(tmp_path)
    shard = folder / "model.ckpt.data-00000-of-00001"
    shard.write_bytes(shard.read_bytes()[:-100])
    _fails(folder, "model.ckpt.data-00000-of-00001", "truncated", "tensor '")


def test_flipped_byte_is_a_crc_error_naming_the_tensor(tmp_path):
    folder = _copy(tmp_path)
    entry = TensorBundle(folder / "model.ckpt").entry("etc_document_bert/segment_emb_lookup/embedding_table")
    shard = folder / "model.ckpt.data-00000-of-00001"
    data = bytearray(shard.read_bytes())
    data[entry.offset + 5] ^= 0x40
    shard.write_bytes(bytes(data))
    _fails(folder, "crc32c mismatch", "segment_emb_lookup/embedding_table")


def _rewrite(folder: Path, drop=(), **damage) -> None:
    """The fixture's tensors written again (tests/bundle_writer.py), less `drop`, with `damage`."""
    bundle = TensorBundle(folder / "model.ckpt")
    tensors = {n: bundle.read(n).numpy().copy() for n in bundle.names() if n not in drop}
    for path in folder.glob("model.ckpt.*"):
        path.unlink()
    write_bundle(folder / "model.ckpt", tensors, **damage)


def test_missing_tensor_is_named(tmp_path):
    folder = _copy(tmp_path)
    name = (
        "etc_document_bert/global_local_transformer_layers/fused_att_layer_1/fused_global_local_att/"
        "g2g_key_projection/linear/bias"
    )
    _rewrite(folder, drop={name})
    _fails(folder, "model.ckpt.index", name, "missing from the checkpoint", "layer.1.attention.global_key.bias")


def test_unknown_dtype(tmp_path):
    folder = _copy(tmp_path)
    _rewrite(folder, dtype_code={"etc_document_bert/long_emb_layer_norm/gamma": 21})
    _fails(folder, "model.ckpt.index", "long_emb_layer_norm/gamma", "unknown or unsupported dtype")


def test_config_contradicting_the_tensors(tmp_path):
    folder = _copy(tmp_path)
    config = json.loads((folder / "etc_config.json").read_text())
    config["share_qkv_projections"] = True  # the tensors have a global query projection
    (folder / "etc_config.json").write_text(json.dumps(config))
    _fails(folder, "etc_config.json", "$.share_qkv_projections contradicts the checkpoint", "global_query_projection")


def test_config_size_contradicting_a_shape(tmp_path):
    folder = _copy(tmp_path)
    config = json.loads((folder / "etc_config.json").read_text())
    config["intermediate_size"] = 48
    (folder / "etc_config.json").write_text(json.dumps(config))
    _fails(folder, "etc_config.json: $.intermediate_size: 48 contradicts the checkpoint", "dense_layers/layer_0/kernel")


def test_unknown_tensors_are_reported_not_loaded(tmp_path):
    folder = _copy(tmp_path)
    bundle = TensorBundle(folder / "model.ckpt")
    tensors = {n: bundle.read(n).numpy().copy() for n in bundle.names()}
    tensors["somebody/else/kernel"] = np.zeros((2, 2), np.float32)
    tensors["etc_document_bert/token_emb_lookup/embedding_table/adam_m"] = np.zeros((64, 32), np.float32)
    for path in folder.glob("model.ckpt.*"):
        path.unlink()
    write_bundle(folder / "model.ckpt", tensors)
    _, report = load_etc_checkpoint(folder)
    dropped = dict(report.dropped)
    assert dropped["somebody/else/kernel"].startswith("unknown")
    assert dropped["etc_document_bert/token_emb_lookup/embedding_table/adam_m"] == "optimizer state"


def test_not_a_checkpoint_directory(tmp_path):
    _fails(tmp_path, "expected model.ckpt.index")
    (tmp_path / "model.ckpt.index").write_bytes(b"")
    _fails(tmp_path, "etc_config.json")


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"share_kv_projections": "yes"}, "$.share_kv_projections: must be true or false"),
        ({"hidden_size": 0}, "$.hidden_size: must be an integer"),
        ({"use_pre_activation_order": True}, "pre-LN layers are not supported"),
        ({"hidden_act": "swish"}, "$.hidden_act: 'swish'"),
    ],
)
def test_config_values_the_encoder_cannot_take(tmp_path, change, expected):
    folder = _copy(tmp_path)
    config = json.loads((folder / "etc_config.json").read_text())
    (folder / "etc_config.json").write_text(json.dumps({**config, **change}))
    _fails(folder, "etc_config.json", expected)


def test_loaded_weights_do_not_depend_on_the_files_staying_unchanged(tmp_path):
    """The encoder's weights are its own memory: overwriting the shard in place (cp over it,
    rsync --inplace) or truncating it changes no output of a loaded model and cannot SIGBUS it."""
    from graphattn.nn.etc_checkpoint import contiguous_parameters

    folder = _copy(tmp_path)
    encoder, _ = load_etc_checkpoint(folder)
    io = np.load(FIXTURES / "share_kv" / "io.npz")
    before = max_errors(encoder, io)
    shard = folder / "model.ckpt.data-00000-of-00001"
    size = shard.stat().st_size
    with open(shard, "r+b") as fh:
        fh.write(np.random.default_rng(0).standard_normal(size // 4).astype(np.float32).tobytes())
    assert max_errors(encoder, io) == before
    with open(shard, "r+b") as fh:
        fh.truncate(16)
    assert max_errors(encoder, io) == before
    query = encoder.layer[0].attention.query.weight
    assert not query.is_contiguous() and query.stride() == (1, 32)  # the TF kernel [in, out], transposed
    assert contiguous_parameters(encoder) > 0 and all(p.is_contiguous() for p in encoder.parameters())
    assert max(max_errors(encoder, io)) <= TOLERANCE  # the same weights laid out afresh (rounding may differ)
