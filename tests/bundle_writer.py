"""Write TensorFlow TensorBundle checkpoints from the format's description, for tests.

The reader (graphattn.nn.tensorbundle) is checked on bundles TensorFlow wrote
(tests/fixtures/etc); this writer makes the bundles TensorFlow would not: several data blocks
and shards, unaligned offsets, and every kind of damage the reader must refuse.
"""

from __future__ import annotations

import struct
from pathlib import Path

import google_crc32c
import numpy as np

from graphattn.nn.tensorbundle import TABLE_MAGIC, mask_crc

DTYPE_CODES = {"float32": 1, "float64": 2, "int32": 3, "uint8": 4, "int8": 6, "int64": 9, "bool": 10, "float16": 19}


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 fields: negatives as ten-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, value) -> bytes:
    if isinstance(value, bytes):
        return varint(number << 3 | 2) + varint(len(value)) + value
    return varint(number << 3) + varint(value)


def entry_proto(dtype: int, shape, shard: int, offset: int, size: int, crc: int, sliced: bool = False) -> bytes:
    dims = b"".join(field(2, field(1, d)) for d in shape)
    out = field(1, dtype) + field(2, dims) + field(3, shard) + field(4, offset) + field(5, size)
    out += varint(6 << 3 | 5) + struct.pack("<I", crc)
    if sliced:
        out += field(7, field(1, b""))
    return out


def header_proto(num_shards: int, big_endian: bool = False, min_consumer: int = 0) -> bytes:
    version = field(1, 1) + (field(2, min_consumer) if min_consumer else b"")
    return field(1, num_shards) + (field(2, 1) if big_endian else b"") + field(3, version)


def _block(records: list[tuple[bytes, bytes]], restart_interval: int) -> bytes:
    out, restarts, last = bytearray(), [], b""
    for i, (key, value) in enumerate(records):
        shared = 0
        if i % restart_interval == 0:
            restarts.append(len(out))
        else:
            while shared < min(len(key), len(last)) and key[shared] == last[shared]:
                shared += 1
        out += varint(shared) + varint(len(key) - shared) + varint(len(value)) + key[shared:] + value
        last = key
    out += b"".join(struct.pack("<I", r) for r in restarts or [0]) + struct.pack("<I", len(restarts or [0]))
    return bytes(out)


def write_table(path: Path, records: dict[bytes, bytes], block_records: int = 3, restart_interval: int = 2) -> None:
    """A sorted table: data blocks of `block_records` records, an index block, an empty
    metaindex block and the footer, every block with its masked crc32c trailer."""
    items = sorted(records.items())
    data = bytearray()

    def put(block: bytes) -> tuple[int, int]:
        offset = len(data)
        data.extend(block + b"\0" + struct.pack("<I", mask_crc(google_crc32c.value(block + b"\0"))))
        return offset, len(block)

    index = []
    for start in range(0, len(items), block_records):
        chunk = items[start : start + block_records]
        offset, size = put(_block(chunk, restart_interval))
        index.append((chunk[-1][0], varint(offset) + varint(size)))
    meta = put(_block([], restart_interval))
    index_handle = put(_block(index, 1))
    handles = varint(meta[0]) + varint(meta[1]) + varint(index_handle[0]) + varint(index_handle[1])
    data += handles.ljust(40, b"\0") + struct.pack("<Q", TABLE_MAGIC)
    path.write_bytes(bytes(data))


def write_bundle(prefix: Path, tensors: dict[str, np.ndarray], num_shards: int = 1, **damage) -> dict:
    """Write `tensors` (round-robin over shards, in name order) and return the entries as dicts.
    `damage` bends one thing: dtype_code={name: code}, shape={name: shape}, sliced={name},
    crc={name: value}, shard={name: n}, big_endian=True, min_consumer=N."""
    shards = [bytearray() for _ in range(num_shards)]
    records, entries = {}, {}
    for i, name in enumerate(sorted(tensors)):
        array = np.asarray(tensors[name])  # tobytes() is C order; ascontiguousarray would lift scalars to 1-d
        raw = array.tobytes()
        shard = i % num_shards
        offset = len(shards[shard])
        shards[shard] += raw
        entry = dict(
            dtype=damage.get("dtype_code", {}).get(name, DTYPE_CODES[array.dtype.name]),
            shape=damage.get("shape", {}).get(name, array.shape),
            shard=damage.get("shard", {}).get(name, shard),
            offset=offset,
            size=len(raw),
            crc=damage.get("crc", {}).get(name, mask_crc(google_crc32c.value(raw))),
            sliced=name in damage.get("sliced", ()),
        )
        records[name.encode()] = entry_proto(**entry)
        entries[name] = entry
    records[b""] = header_proto(num_shards, damage.get("big_endian", False), damage.get("min_consumer", 0))
    prefix.parent.mkdir(parents=True, exist_ok=True)
    write_table(Path(f"{prefix}.index"), records)
    for i, data in enumerate(shards):
        Path(f"{prefix}.data-{i:05d}-of-{num_shards:05d}").write_bytes(bytes(data))
    return entries
