"""The byte formats inside a TensorFlow checkpoint's `.index`: masked crc32c, the few protobuf
wire types a bundle's messages use, and LevelDB's sorted table (prefix-compressed records in
checksummed blocks, an index block, a 48-byte footer).

Split from `tensorbundle.py`, which turns these records into checked tensors. Every function here
raises ValueError with what and where; the bundle reader turns it into a `CheckpointError` line
naming the file (and the tensor).
"""

from __future__ import annotations

import struct

import google_crc32c
import numpy as np

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_BYTES = 48  # two block handles padded to 40 bytes, then the 8-byte magic
BLOCK_TRAILER_BYTES = 5  # compression type (0 = none) + masked crc32c
_MASK_DELTA = 0xA282EAD8


def mask_crc(crc: int) -> int:
    """LevelDB/TensorFlow's masked crc32c (rotate right 15, add a constant), stored so that a
    crc of data that itself holds crcs does not look like one."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def crc32c(data, start: int = 0) -> int:
    """crc32c of any bytes-like object, continuing from `start`; google_crc32c takes bytes or a
    numpy array, so any buffer goes in as a zero-copy uint8 array."""
    if not isinstance(data, bytes):
        data = np.frombuffer(data, dtype=np.uint8)
    return google_crc32c.extend(start, data)


# --- protobuf wire format: just enough for the three messages of a bundle -----------------------

VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5
_WIRE_NAMES = {VARINT: "varint", FIXED64: "fixed64", BYTES: "length-delimited", FIXED32: "fixed32"}


def varint(buf, pos: int, end: int, what: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError(f"{what}: truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def decode_message(buf: bytes, what: str) -> dict[int, list[tuple[int, int | bytes]]]:
    """Decode one protobuf message into field number -> [(wire type, value)] (ints for varint /
    fixed, bytes for length-delimited). Unknown fields are kept; groups are refused. Read a
    field through `_one` / `_many`, which check its wire type."""
    out: dict[int, list] = {}
    pos, end = 0, len(buf)
    while pos < end:
        tag, pos = varint(buf, pos, end, what)
        number, wire = tag >> 3, tag & 7
        if wire == VARINT:
            value, pos = varint(buf, pos, end, what)
        elif wire == FIXED64 or wire == FIXED32:
            width = 8 if wire == FIXED64 else 4
            if pos + width > end:
                raise ValueError(f"{what}: truncated fixed field {number}")
            value = int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        elif wire == BYTES:
            length, pos = varint(buf, pos, end, what)
            if pos + length > end:
                raise ValueError(f"{what}: field {number} runs past the message")
            value, pos = bytes(buf[pos : pos + length]), pos + length
        else:
            raise ValueError(f"{what}: unsupported wire type {wire} for field {number}")
        out.setdefault(number, []).append((wire, value))
    return out


def many(message: dict, number: int, wire: int, what: str) -> list:
    """Every value of a repeated field, each of the expected wire type."""
    values = message.get(number, [])
    for got, _ in values:
        if got != wire:
            raise ValueError(
                f"{what}: field {number} has wire type {got} ({_WIRE_NAMES.get(got, '?')}), expected "
                f"{_WIRE_NAMES[wire]}"
            )
    return [value for _, value in values]


def one(message: dict, number: int, wire: int, default, what: str):
    """A singular field: at most once, of the expected wire type (protobuf would keep the last of
    several; a bundle TensorFlow wrote never repeats one, so a repeat is refused, not resolved)."""
    values = many(message, number, wire, what)
    if len(values) > 1:
        raise ValueError(f"{what}: field {number} appears {len(values)} times")
    return values[0] if values else default


def int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# --- the sorted table of the .index file --------------------------------------------------------


def block(data: bytes, where: tuple[int, int], limit: int, what: str) -> memoryview:
    offset, size = where
    if offset + size + BLOCK_TRAILER_BYTES > limit:
        raise ValueError(f"{what} at byte {offset} (+{size}) runs past the table's end ({limit})")
    view = memoryview(data)[offset : offset + size]
    kind = data[offset + size]
    stored = int.from_bytes(data[offset + size + 1 : offset + size + 5], "little")
    if mask_crc(crc32c(data[offset : offset + size + 1])) != stored:
        raise ValueError(f"{what} at byte {offset}: block checksum mismatch")
    if kind != 0:
        raise ValueError(f"{what} at byte {offset}: compressed blocks (type {kind}) are not supported")
    return view


def records(block: memoryview, what: str):
    """Yield (key, value) from one table block: prefix-compressed records, then restart offsets."""
    if len(block) < 4:
        raise ValueError(f"{what}: block too short")
    restarts = int.from_bytes(block[-4:], "little")
    end = len(block) - 4 - 4 * restarts
    if restarts < 1 or end < 0:
        raise ValueError(f"{what}: bad restart count {restarts}")
    pos, key = 0, b""
    while pos < end:
        shared, pos = varint(block, pos, end, what)
        unshared, pos = varint(block, pos, end, what)
        length, pos = varint(block, pos, end, what)
        if shared > len(key) or pos + unshared + length > end:
            raise ValueError(f"{what}: record at byte {pos} runs past its block")
        key = key[:shared] + bytes(block[pos : pos + unshared])
        pos += unshared
        yield key, bytes(block[pos : pos + length])
        pos += length


def handle(buf, pos: int, end: int, what: str) -> tuple[tuple[int, int], int]:
    offset, pos = varint(buf, pos, end, what)
    size, pos = varint(buf, pos, end, what)
    return (offset, size), pos


def shown_key(key: bytes) -> str:
    return repr(key.decode("utf-8", errors="backslashreplace"))


def read_table(data: bytes) -> dict[bytes, bytes]:
    """Every record of the sorted table, its keys proven strictly increasing: a duplicate or an
    out-of-order key (which a lookup and a scan would resolve differently) is refused, and each
    data block's keys must lie between its index entry and the one before, as LevelDB writes them."""
    size = len(data)
    if size < FOOTER_BYTES:
        raise ValueError(f"{size} bytes is shorter than the table footer ({FOOTER_BYTES}): truncated")
    footer = data[-FOOTER_BYTES:]
    magic = struct.unpack("<Q", footer[-8:])[0]
    if magic != TABLE_MAGIC:
        raise ValueError(
            f"bad magic number {magic:#018x} (expected {TABLE_MAGIC:#018x}): not a TensorFlow checkpoint index"
        )
    _meta, pos = handle(footer, 0, 40, "footer")
    index_handle, _ = handle(footer, pos, 40, "footer")
    limit = size - FOOTER_BYTES
    table: dict[bytes, bytes] = {}
    previous: bytes | None = None
    previous_separator: bytes | None = None
    for separator, value in records(block(data, index_handle, limit, "index block"), "index block"):
        if previous_separator is not None and separator <= previous_separator:
            raise ValueError(f"index block: key {shown_key(separator)} is not after {shown_key(previous_separator)}")
        where, _ = handle(value, 0, len(value), "index entry")
        for key, record in records(block(data, where, limit, "data block"), "data block"):
            if previous is not None and key <= previous:
                how = "a duplicate" if key == previous else "out of order"
                raise ValueError(f"key {shown_key(key)} is {how} (after {shown_key(previous)}): the keys must increase")
            if key > separator or (previous_separator is not None and key <= previous_separator):
                raise ValueError(
                    f"key {shown_key(key)} lies outside its data block's range in the index block "
                    f"(up to {shown_key(separator)})"
                )
            table[key] = record
            previous = key
        previous_separator = separator
    return table


__all__ = [
    "BYTES",
    "FIXED32",
    "FIXED64",
    "TABLE_MAGIC",
    "VARINT",
    "crc32c",
    "decode_message",
    "int64",
    "many",
    "mask_crc",
    "one",
    "read_table",
    "shown_key",
    "varint",
]
