"""The TensorBundle reader: TensorFlow's own bundles read back exactly, bundles written from the
format's description (several blocks and shards, unaligned offsets), and one clear
CheckpointError for each kind of damage."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from bundle_writer import write_bundle

from graphattn.nn.tensorbundle import CheckpointError, TensorBundle, crc32c, mask_crc

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "etc"


def test_crc32c_and_its_mask_match_the_published_check_values():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)
    assert crc32c(memoryview(b"123456789")[4:], crc32c(b"1234")) == 0xE3069283
    assert mask_crc(0) == 0xA282EAD8


def test_reads_every_dtype_tensorflow_wrote_as_tensorflow_reads_it():
    expected = json.loads((FIXTURES / "dtypes" / "expected.json").read_text())
    arrays = np.load(FIXTURES / "dtypes" / "expected.npz")
    bundle = TensorBundle(FIXTURES / "dtypes" / "model.ckpt")
    assert set(bundle.names()) == set(expected["dtypes"])
    for i, name in enumerate(expected["numeric"]):
        got = bundle.read(name)
        assert bundle.entry(name).dtype == expected["dtypes"][name]
        want = arrays[f"t{i}"]
        assert tuple(got.shape) == want.shape, name
        np.testing.assert_array_equal(got.float().numpy() if got.dtype == torch.bfloat16 else got.numpy(), want)
    for name, hexes in expected["strings"].items():
        assert bundle.read(name) == [bytes.fromhex(h) for h in hexes]


def test_tensorflow_saver_checkpoint_lists_names_shapes_and_a_step():
    bundle = TensorBundle(FIXTURES / "share_qkv" / "model.ckpt")
    assert int(bundle.read("global_step")) == 1000
    table = bundle.read("etc_document_bert/token_emb_lookup/embedding_table")
    assert table.shape == (64, 32) and table.dtype == torch.float32


def test_several_blocks_shards_and_an_unaligned_offset(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "a/int8": rng.integers(-5, 5, 3).astype(np.int8),  # 3 bytes: what follows it in its shard is unaligned
        "b/float": rng.standard_normal((4, 5)).astype(np.float32),
        "c/float": rng.standard_normal(7).astype(np.float32),
        "d/int64": np.arange(6, dtype=np.int64).reshape(2, 3),
        "e/half": rng.standard_normal(3).astype(np.float16),
        "f/flag": np.array([True, False]),
        "g/scalar": np.float64(2.5),
        "h/empty": np.zeros((0, 4), np.float32),
    }
    entries = write_bundle(tmp_path / "ckpt", tensors, num_shards=2)
    assert entries["c/float"]["offset"] % 4 != 0  # a/int8 then c/float share shard 0
    bundle = TensorBundle(tmp_path / "ckpt")
    assert bundle.num_shards == 2 and bundle.names() == sorted(tensors)
    for name, want in tensors.items():
        got = bundle.read(name)
        assert tuple(got.shape) == np.shape(want), name
        np.testing.assert_array_equal(got.numpy(), want)


def test_tensors_are_the_readers_own_memory(tmp_path):
    """Rewriting the shard in place or truncating it changes no tensor already read (no mapping
    of the file is handed out), and a read after the truncation is one line, not a SIGBUS."""
    write_bundle(tmp_path / "ckpt", {"w": np.ones((64, 64), np.float32)})
    shard = tmp_path / "ckpt.data-00000-of-00001"
    with TensorBundle(tmp_path / "ckpt") as bundle:
        first, second = bundle.read("w"), bundle.read("w")
        assert first.data_ptr() != second.data_ptr()  # each read its own copy
        first[0, 0] = 7.0
        assert np.fromfile(shard, np.float32)[0] == 1.0  # and writing it leaves the file alone
        with open(shard, "r+b") as fh:  # what `cp` over the file or `rsync --inplace` does
            fh.write(np.full((64, 64), 5.0, np.float32).tobytes())
        assert torch.equal(second, torch.ones(64, 64))
        with pytest.raises(CheckpointError, match="crc32c mismatch"):
            bundle.read("w")
        with open(shard, "r+b") as fh:
            fh.truncate(100)
        assert torch.equal(second, torch.ones(64, 64))
        with pytest.raises(CheckpointError) as exc:
            bundle.read("w")
        _one_line(exc, "ckpt.data-00000-of-00001", "'w'", "truncated")


def _one_line(exc: pytest.ExceptionInfo, *parts: str) -> str:
    message = str(exc.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    return message


def _good(tmp_path, **damage):
    tensors = {"enc/w": np.arange(12, dtype=np.float32).reshape(3, 4), "enc/b": np.ones(4, np.float32)}
    write_bundle(tmp_path / "ckpt", tensors, **damage)
    return tmp_path / "ckpt"


def test_bad_magic(tmp_path):
    prefix = _good(tmp_path)
    index = Path(f"{prefix}.index")
    data = bytearray(index.read_bytes())
    data[-1] ^= 0xFF
    index.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as exc:
        TensorBundle(prefix)
    _one_line(exc, "ckpt.index", "bad magic number")


def test_truncated_index(tmp_path):
    prefix = _good(tmp_path)
    index = Path(f"{prefix}.index")
    index.write_bytes(index.read_bytes()[:30])
    with pytest.raises(CheckpointError) as exc:
        TensorBundle(prefix)
    _one_line(exc, "ckpt.index", "truncated")


def test_damaged_index_block(tmp_path):
    prefix = _good(tmp_path)
    index = Path(f"{prefix}.index")
    data = bytearray(index.read_bytes())
    data[5] ^= 0x01  # inside the first data block
    index.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as exc:
        TensorBundle(prefix)
    _one_line(exc, "ckpt.index", "checksum mismatch")


def test_truncated_data_shard_names_the_tensor_past_the_end(tmp_path):
    prefix = _good(tmp_path)
    shard = Path(f"{prefix}.data-00000-of-00001")
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(CheckpointError) as exc:
        TensorBundle(prefix)
    _one_line(exc, "ckpt.data-00000-of-00001", "'enc/w'", "truncated")


def test_flipped_byte_is_a_crc_mismatch_naming_the_tensor(tmp_path):
    prefix = _good(tmp_path)
    shard = Path(f"{prefix}.data-00000-of-00001")
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x10  # inside enc/w, the second tensor in name order
    shard.write_bytes(bytes(data))
    bundle = TensorBundle(prefix)
    assert bundle.read("enc/b").sum() == 4  # the undamaged tensor still reads
    with pytest.raises(CheckpointError) as exc:
        bundle.read("enc/w")
    _one_line(exc, "ckpt.data-00000-of-00001", "'enc/w'", "crc32c mismatch")


def test_tensorflow_bundle_with_a_flipped_byte(tmp_path):
    shutil.copytree(FIXTURES / "share_qkv", tmp_path / "c")
    shard = tmp_path / "c" / "model.ckpt.data-00000-of-00001"
    bundle = TensorBundle(tmp_path / "c" / "model.ckpt")
    entry = bundle.entry("etc_document_bert/token_emb_lookup/embedding_table")
    data = bytearray(shard.read_bytes())
    data[entry.offset + 17] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as exc:
        TensorBundle(tmp_path / "c" / "model.ckpt").read(entry.name)
    _one_line(exc, "model.ckpt.data-00000-of-00001", "embedding_table", "crc32c mismatch")


@pytest.mark.parametrize(
    "damage, expected",
    [
        (dict(dtype_code={"enc/w": 21}), "unknown or unsupported dtype (TensorFlow DataType 21)"),
        (dict(dtype_code={"enc/w": 99}), "DataType 99"),
        (dict(shape={"enc/w": (3, 5)}), "needs 60 bytes, the entry says 48"),
        (dict(shape={"enc/w": (-1, 4)}), "negative dimension"),
        (dict(sliced={"enc/w"}), "partitioned (sliced) tensors"),
        (dict(shard={"enc/w": 3}), "shard 3 but the header says 1 shards"),
    ],
)
def test_entries_the_reader_cannot_hold_name_the_tensor(tmp_path, damage, expected):
    prefix = _good(tmp_path, **damage)
    with pytest.raises(CheckpointError) as exc:
        TensorBundle(prefix)
    _one_line(exc, "ckpt.index", "'enc/w'", expected)


@pytest.mark.parametrize(
    "damage, expected",
    [(dict(big_endian=True), "big-endian"), (dict(min_consumer=7), "bundle version >= 7")],
)
def test_headers_the_reader_cannot_follow(tmp_path, damage, expected):
    with pytest.raises(CheckpointError) as exc:
        TensorBundle(_good(tmp_path, **damage))
    _one_line(exc, "ckpt.index", expected)


def test_missing_index_and_missing_shard(tmp_path):
    with pytest.raises(CheckpointError) as exc:
        TensorBundle(tmp_path / "nothing")
    _one_line(exc, "nothing.index", "checkpoint index: missing")
    prefix = _good(tmp_path)
    Path(f"{prefix}.data-00000-of-00001").unlink()
    with pytest.raises(CheckpointError) as exc:
        TensorBundle(prefix)
    _one_line(exc, "ckpt.data-00000-of-00001", "data shard: missing")


def test_asking_for_a_name_it_does_not_hold(tmp_path):
    with pytest.raises(CheckpointError) as exc:
        TensorBundle(_good(tmp_path)).entry("enc/nope")
    _one_line(exc, "'enc/nope'", "not in this checkpoint")
