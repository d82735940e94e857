"""The TensorBundle reader on indexes TensorFlow would never write: duplicate and out-of-order
keys, protobuf fields of the wrong wire type, a path that is not a regular file. Each is one
CheckpointError line naming the file (and the tensor where there is one)."""

import os
import struct
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
from bundle_writer import _block, entry_proto, field, header_proto, varint, write_bundle

from graphattn.nn.tensorbundle import TABLE_MAGIC, CheckpointError, TensorBundle, mask_crc

W = np.arange(12, dtype=np.float32).reshape(3, 4)
B = np.ones(4, np.float32)


def _entry(array: np.ndarray, offset: int) -> bytes:
    raw = array.tobytes()
    return entry_proto(1, array.shape, 0, offset, len(raw), mask_crc(google_crc32c.value(raw)))


def write_raw(prefix: Path, blocks: list[list[tuple[bytes, bytes]]], separators: list[bytes] | None = None) -> None:
    """A table whose blocks hold exactly these records in this order (no sorting, no dedup), and
    the shard holding W then B."""
    data = bytearray()

    def put(block: bytes) -> tuple[int, int]:
        offset = len(data)
        data.extend(block + b"\0" + struct.pack("<I", mask_crc(google_crc32c.value(block + b"\0"))))
        return offset, len(block)

    index = []
    for i, records in enumerate(blocks):
        offset, size = put(_block(records, 16))
        index.append((separators[i] if separators else records[-1][0], varint(offset) + varint(size)))
    meta = put(_block([], 16))
    handle = put(_block(index, 1))
    footer = varint(meta[0]) + varint(meta[1]) + varint(handle[0]) + varint(handle[1])
    data += footer.ljust(40, b"\0") + struct.pack("<Q", TABLE_MAGIC)
    Path(f"{prefix}.index").write_bytes(bytes(data))
    Path(f"{prefix}.data-00000-of-00001").write_bytes(W.tobytes() + B.tobytes())


def _fails(prefix, *parts) -> str:
    with pytest.raises(CheckpointError) as exc:
        TensorBundle(prefix).read("enc/w")
    message = str(exc.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    return message


HEADER = (b"", header_proto(1))


def test_a_well_formed_raw_table_reads(tmp_path):
    write_raw(tmp_path / "ckpt", [[HEADER, (b"enc/b", _entry(B, 48)), (b"enc/w", _entry(W, 0))]])
    assert np.array_equal(TensorBundle(tmp_path / "ckpt").read("enc/w").numpy(), W)


def test_a_duplicate_key_is_refused_not_resolved(tmp_path):
    # a second enc/w of the same shape: whichever a reader keeps, it loads another tensor
    write_raw(tmp_path / "ckpt", [[HEADER, (b"enc/w", _entry(W, 0)), (b"enc/w", _entry(B.repeat(3), 0))]])
    _fails(tmp_path / "ckpt", "ckpt.index", "'enc/w' is a duplicate")


def test_a_duplicate_key_across_blocks_is_refused(tmp_path):
    write_raw(tmp_path / "ckpt", [[HEADER, (b"enc/w", _entry(W, 0))], [(b"enc/w", _entry(W, 0))]])
    _fails(tmp_path / "ckpt", "ckpt.index", "'enc/w'", "duplicate")


def test_an_out_of_order_key_is_refused(tmp_path):
    records = [[HEADER, (b"enc/w", _entry(W, 0)), (b"enc/b", _entry(B, 48))]]
    write_raw(tmp_path / "ckpt", records, separators=[b"enc/z"])
    _fails(tmp_path / "ckpt", "ckpt.index", "'enc/b' is out of order (after 'enc/w')")


def test_a_key_outside_its_index_range_is_refused(tmp_path):
    records = [[HEADER, (b"enc/b", _entry(B, 48))], [(b"enc/w", _entry(W, 0))]]
    write_raw(tmp_path / "ckpt", records, separators=[b"enc/a", b"enc/z"])  # enc/b is past its block's bound
    _fails(tmp_path / "ckpt", "ckpt.index", "'enc/b' lies outside its data block's range")


def test_two_entries_over_the_same_bytes_are_refused(tmp_path):
    # enc/b's entry points into enc/w's bytes (a valid crc of those bytes): a tensor under another's name
    stolen = W.reshape(-1)[:4]
    write_raw(tmp_path / "ckpt", [[HEADER, (b"enc/b", _entry(stolen, 0)), (b"enc/w", _entry(W, 0))]])
    _fails(tmp_path / "ckpt", "ckpt.index", "'enc/w'", "overlap those of 'enc/b'")


def test_a_key_that_is_not_utf8_is_refused(tmp_path):
    write_raw(tmp_path / "ckpt", [[HEADER, (b"enc/\xff", _entry(W, 0))]])
    _fails(tmp_path / "ckpt", "ckpt.index", "is not UTF-8")


@pytest.mark.parametrize(
    "entry, expected",
    [
        (field(1, b"\x01") + field(2, b""), "entry dtype: field 1 has wire type 2"),  # dtype as bytes
        (field(1, 1) + field(2, 5), "entry shape: field 2 has wire type 0"),  # shape as a varint
        (field(1, 1) + field(2, field(2, 7)), "dim: field 2 has wire type 0"),  # a dim as a varint
        (field(1, 1) + field(2, field(2, field(1, b"3"))), "dim size: field 1 has wire type 2"),
        (field(1, 1) + field(2, b"") + field(3, b"\x00"), "entry shard_id: field 3 has wire type 2"),
        (field(1, 1) + field(2, b"") + field(4, b"\x00"), "entry offset: field 4 has wire type 2"),
        (field(1, 1) + field(2, b"") + field(5, b"\x00"), "entry size: field 5 has wire type 2"),
        (field(1, 1) + field(2, b"") + field(6, 12345), "entry crc32c: field 6 has wire type 0"),
        (field(1, 1) + field(1, 1) + field(2, b""), "entry dtype: field 1 appears 2 times"),
        (field(1, 1) + field(2, field(3, b"\x01")), "shape unknown_rank: field 3 has wire type 2"),
    ],
)
def test_entry_fields_of_the_wrong_wire_type(tmp_path, entry, expected):
    write_raw(tmp_path / "ckpt", [[HEADER, (b"enc/w", entry)]])
    _fails(tmp_path / "ckpt", "ckpt.index", "'enc/w'", expected)


@pytest.mark.parametrize(
    "header, expected",
    [
        (field(1, b"\x01"), "header num_shards: field 1 has wire type 2"),
        (field(1, 1) + field(2, b"\x00"), "header endianness: field 2 has wire type 2"),
        (field(1, 1) + field(3, 1), "header version: field 3 has wire type 0"),
        (field(1, 1) + field(3, field(2, b"\x00")), "min_consumer: field 2 has wire type 2"),
        (field(1, 1) + field(1, 2), "field 1 appears 2 times"),
    ],
)
def test_header_fields_of_the_wrong_wire_type(tmp_path, header, expected):
    write_raw(tmp_path / "ckpt", [[(b"", header), (b"enc/w", _entry(W, 0))]])
    _fails(tmp_path / "ckpt", "ckpt.index", expected)


def _good(tmp_path) -> Path:
    write_bundle(tmp_path / "ckpt", {"enc/w": W, "enc/b": B})
    return tmp_path / "ckpt"


@pytest.mark.parametrize("which", ["index", "data-00000-of-00001"])
@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink loop", "dangling symlink"])
def test_a_path_that_is_not_a_regular_file_is_named_as_such(tmp_path, which, kind):
    prefix = _good(tmp_path)
    path = Path(f"{prefix}.{which}")
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)  # opening it for reading must not wait for a writer
        expected = "a FIFO (named pipe), not a regular file"
    elif kind == "directory":
        path.mkdir()
        expected = "a directory, not a regular file"
    elif kind == "symlink loop":
        path.symlink_to(path.name)
        expected = "a symlink loop"
    else:
        path.symlink_to("nowhere")
        expected = "missing"
    _fails(prefix, path.name, expected)


def test_an_index_larger_than_the_bound_is_refused_before_reading(tmp_path, monkeypatch):
    import graphattn.nn.tensorbundle as tb

    prefix = _good(tmp_path)
    monkeypatch.setattr(tb, "MAX_INDEX_BYTES", 64)
    _fails(prefix, "ckpt.index", "more than the 64 such a file may hold")
