"""Read TensorFlow checkpoints (the TensorBundle format) without TensorFlow.

A checkpoint `PREFIX` is `PREFIX.index`, a table of entries, and the shards
`PREFIX.data-SSSSS-of-NNNNN` holding raw tensor bytes. The index is a LevelDB-style sorted table:
a 48-byte footer (two block handles and the magic number 0xdb4775248b80fb57), an index block
whose values locate the data blocks, and data blocks of prefix-compressed key/value records, each
block followed by a compression byte and a masked crc32c. Key "" maps to a `BundleHeaderProto`
(shard count, endianness, format version); every other key is a tensor name mapping to a
`BundleEntryProto` (dtype, shape, shard, offset, size, masked crc32c of the bytes).

Why our own reader: no maintained pure-Python one exists on PyPI (the one package that claims to
be is an unfinished generated stub), and TensorFlow is never a dependency. Everything read is
bounded and checked before it is used: a bad magic, a truncated file, a checksum that does not
match, a dtype we cannot map or a shape that disagrees with the byte count each raise one
`CheckpointError` naming the file and the tensor. Each shard is memory-mapped once (copy on
write, so the tensors are ordinary writable torch views of the file's pages) and a tensor is a
view of it whenever its offset is aligned for its dtype.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import google_crc32c
import numpy as np
import torch

from graphattn.errors import GraphattnError, Location

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_BYTES = 48  # two block handles padded to 40 bytes, then the 8-byte magic
BLOCK_TRAILER_BYTES = 5  # compression type (0 = none) + masked crc32c
MAX_INDEX_BYTES = 1 << 28  # a checkpoint of 100k tensors has an index of a few MB
MAX_SHARDS = 1 << 16
BUNDLE_FORMAT_VERSION = 1  # TensorFlow's kTensorBundleVersion: the only layout there is
_MASK_DELTA = 0xA282EAD8

# TensorFlow's DataType enum -> (name, torch dtype or None for strings, bytes per element)
DTYPES: dict[int, tuple[str, torch.dtype | None, int]] = {
    1: ("float32", torch.float32, 4),
    2: ("float64", torch.float64, 8),
    3: ("int32", torch.int32, 4),
    4: ("uint8", torch.uint8, 1),
    5: ("int16", torch.int16, 2),
    6: ("int8", torch.int8, 1),
    7: ("string", None, 0),
    8: ("complex64", torch.complex64, 8),
    9: ("int64", torch.int64, 8),
    10: ("bool", torch.bool, 1),
    14: ("bfloat16", torch.bfloat16, 2),
    17: ("uint16", torch.uint16, 2),
    18: ("complex128", torch.complex128, 16),
    19: ("float16", torch.float16, 2),
    22: ("uint32", torch.uint32, 4),
    23: ("uint64", torch.uint64, 8),
}


class CheckpointError(GraphattnError):
    """A checkpoint that cannot be read or does not fit the model: names the file and the tensor
    (or the line / key path of a config file). The one error type of every checkpoint loader."""

    def __init__(self, message: str, file: str | Path | None = None, tensor: str | None = None, **where):
        self.tensor = tensor
        what = f"tensor {tensor!r}: {message}" if tensor is not None else message
        super().__init__(what, Location(file=str(file) if file is not None else None, **where))


def mask_crc(crc: int) -> int:
    """LevelDB/TensorFlow's masked crc32c (rotate right 15, add a constant), stored so that a
    crc of data that itself holds crcs does not look like one."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def crc32c(data, start: int = 0) -> int:
    """crc32c of any bytes-like object, continuing from `start`; google_crc32c takes bytes or a
    numpy array, so a memoryview of a mapped shard goes in as a zero-copy uint8 array."""
    if not isinstance(data, bytes):
        data = np.frombuffer(data, dtype=np.uint8)
    return google_crc32c.extend(start, data)


# --- protobuf wire format: just enough for the three messages of a bundle -----------------------


def _varint(buf, pos: int, end: int, what: str) -> tuple[int, int]:
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


def _fields(buf: bytes, what: str) -> dict[int, list]:
    """Decode one protobuf message into field number -> values (ints for varint / fixed,
    bytes for length-delimited). Unknown fields are kept; groups are refused."""
    out: dict[int, list] = {}
    pos, end = 0, len(buf)
    while pos < end:
        tag, pos = _varint(buf, pos, end, what)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end, what)
        elif wire == 1 or wire == 5:
            width = 8 if wire == 1 else 4
            if pos + width > end:
                raise ValueError(f"{what}: truncated fixed field {number}")
            value = int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        elif wire == 2:
            length, pos = _varint(buf, pos, end, what)
            if pos + length > end:
                raise ValueError(f"{what}: field {number} runs past the message")
            value, pos = bytes(buf[pos : pos + length]), pos + length
        else:
            raise ValueError(f"{what}: unsupported wire type {wire} for field {number}")
        out.setdefault(number, []).append(value)
    return out


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


@dataclass(frozen=True)
class BundleEntry:
    """Where one tensor lives: dtype name, shape, shard number, byte offset and size, masked crc."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


# --- the sorted table of the .index file --------------------------------------------------------


def _block(data: bytes, handle: tuple[int, int], limit: int, what: str) -> memoryview:
    offset, size = handle
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


def _records(block: memoryview, what: str):
    """Yield (key, value) from one table block: prefix-compressed records, then restart offsets."""
    if len(block) < 4:
        raise ValueError(f"{what}: block too short")
    restarts = int.from_bytes(block[-4:], "little")
    end = len(block) - 4 - 4 * restarts
    if restarts < 1 or end < 0:
        raise ValueError(f"{what}: bad restart count {restarts}")
    pos, key = 0, b""
    while pos < end:
        shared, pos = _varint(block, pos, end, what)
        unshared, pos = _varint(block, pos, end, what)
        length, pos = _varint(block, pos, end, what)
        if shared > len(key) or pos + unshared + length > end:
            raise ValueError(f"{what}: record at byte {pos} runs past its block")
        key = key[:shared] + bytes(block[pos : pos + unshared])
        pos += unshared
        yield key, bytes(block[pos : pos + length])
        pos += length


def _handle(buf, pos: int, end: int, what: str) -> tuple[tuple[int, int], int]:
    offset, pos = _varint(buf, pos, end, what)
    size, pos = _varint(buf, pos, end, what)
    return (offset, size), pos


def _read_table(path: Path) -> dict[bytes, bytes]:
    size = path.stat().st_size
    if size < FOOTER_BYTES:
        raise ValueError(f"{size} bytes is shorter than the table footer ({FOOTER_BYTES}): truncated")
    if size > MAX_INDEX_BYTES:
        raise ValueError(f"{size} bytes is more than an index may hold ({MAX_INDEX_BYTES})")
    data = path.read_bytes()
    footer = data[-FOOTER_BYTES:]
    magic = struct.unpack("<Q", footer[-8:])[0]
    if magic != TABLE_MAGIC:
        raise ValueError(
            f"bad magic number {magic:#018x} (expected {TABLE_MAGIC:#018x}): not a TensorFlow checkpoint index"
        )
    _meta, pos = _handle(footer, 0, 40, "footer")
    index_handle, _ = _handle(footer, pos, 40, "footer")
    limit = size - FOOTER_BYTES
    table: dict[bytes, bytes] = {}
    for _last_key, value in _records(_block(data, index_handle, limit, "index block"), "index block"):
        handle, _ = _handle(value, 0, len(value), "index entry")
        for key, record in _records(_block(data, handle, limit, "data block"), "data block"):
            table[key] = record
    return table


# --- the bundle -----------------------------------------------------------------------------------


class TensorBundle:
    """A TensorFlow V2 checkpoint opened for reading: `names()`, `entry(name)`, `read(name)`.

    `prefix` is the path without `.index` (e.g. `dir/model.ckpt`). Opening reads and checks the
    index and that every tensor's bytes lie inside its shard; reading a tensor maps its shard
    (once) and checks the tensor's crc32c."""

    def __init__(self, prefix: str | Path):
        self.prefix = Path(prefix)
        self.index_path = Path(f"{self.prefix}.index")
        if not self.index_path.is_file():
            raise CheckpointError("no such checkpoint index", file=self.index_path)
        try:
            table = _read_table(self.index_path)
        except ValueError as exc:
            raise CheckpointError(str(exc), file=self.index_path) from None
        self.num_shards = self._header(table.pop(b"", None))
        self.shard_paths = [
            Path(f"{self.prefix}.data-{i:05d}-of-{self.num_shards:05d}") for i in range(self.num_shards)
        ]
        self._entries: dict[str, BundleEntry] = {}
        for key, value in table.items():
            name = key.decode("utf-8", errors="replace")
            self._entries[name] = self._entry(name, value)
        self._maps: dict[int, mmap.mmap] = {}
        self._check_extents()

    # index contents

    def _header(self, value: bytes | None) -> int:
        if value is None:
            raise CheckpointError("the index has no header entry (key '')", file=self.index_path)
        try:
            fields = _fields(value, "header")
            version = _fields(fields.get(3, [b""])[0], "header version")
        except ValueError as exc:
            raise CheckpointError(str(exc), file=self.index_path) from None
        shards = fields.get(1, [0])[0]
        if not 1 <= shards <= MAX_SHARDS:
            raise CheckpointError(f"header says {shards} shards (expected 1..{MAX_SHARDS})", file=self.index_path)
        if fields.get(2, [0])[0] != 0:
            raise CheckpointError("big-endian checkpoints are not supported", file=self.index_path)
        if version.get(2, [0])[0] > BUNDLE_FORMAT_VERSION:
            raise CheckpointError(
                f"needs a reader of bundle version >= {version[2][0]}; this one reads {BUNDLE_FORMAT_VERSION}",
                file=self.index_path,
            )
        return shards

    def _entry(self, name: str, value: bytes) -> BundleEntry:
        def fail(message: str) -> CheckpointError:
            return CheckpointError(message, file=self.index_path, tensor=name)

        try:
            fields = _fields(value, "entry")
            shape_fields = _fields(fields.get(2, [b""])[0], "shape")
            dims = [_fields(dim, "dim").get(1, [0])[0] for dim in shape_fields.get(2, [])]
        except ValueError as exc:
            raise fail(str(exc)) from None
        code = fields.get(1, [0])[0]
        if code not in DTYPES:
            raise fail(f"unknown or unsupported dtype (TensorFlow DataType {code})")
        if fields.get(7):
            raise fail("partitioned (sliced) tensors are not supported")
        if shape_fields.get(3, [0])[0]:
            raise fail("shape of unknown rank")
        shape = tuple(_int64(d) for d in dims)
        if any(d < 0 for d in shape):
            raise fail(f"shape {list(shape)} has a negative dimension")
        entry = BundleEntry(
            name=name,
            dtype=DTYPES[code][0],
            shape=shape,
            shard=fields.get(3, [0])[0],
            offset=_int64(fields.get(4, [0])[0]),
            size=_int64(fields.get(5, [0])[0]),
            crc=fields.get(6, [0])[0],
        )
        if entry.shard >= self.num_shards:
            raise fail(f"shard {entry.shard} but the header says {self.num_shards} shards")
        if entry.offset < 0 or entry.size < 0:
            raise fail(f"negative offset {entry.offset} or size {entry.size}")
        itemsize = DTYPES[code][2]
        if itemsize and entry.numel * itemsize != entry.size:
            raise fail(
                f"shape {list(shape)} of {entry.dtype} needs {entry.numel * itemsize} bytes, "
                f"the entry says {entry.size}"
            )
        return entry

    def _check_extents(self) -> None:
        sizes = {}
        for i, path in enumerate(self.shard_paths):
            if not path.is_file():
                raise CheckpointError("data shard missing", file=path)
            sizes[i] = path.stat().st_size
        for entry in self._entries.values():
            if entry.offset + entry.size > sizes[entry.shard]:
                raise CheckpointError(
                    f"bytes {entry.offset}..{entry.offset + entry.size} lie past the end of the shard "
                    f"({sizes[entry.shard]} bytes): truncated",
                    file=self.shard_paths[entry.shard],
                    tensor=entry.name,
                )

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, name: str) -> BundleEntry:
        if name not in self._entries:
            raise CheckpointError("not in this checkpoint", file=self.index_path, tensor=name)
        return self._entries[name]

    # tensor bytes

    def _shard(self, shard: int) -> mmap.mmap | None:
        if shard not in self._maps:
            path = self.shard_paths[shard]
            if path.stat().st_size == 0:
                return None
            with open(path, "rb") as fh:
                self._maps[shard] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._maps[shard]

    def _bytes(self, entry: BundleEntry) -> memoryview:
        buf = self._shard(entry.shard)
        view = memoryview(buf)[entry.offset : entry.offset + entry.size] if buf is not None else memoryview(b"")
        if len(view) != entry.size:  # the file shrank since it was opened
            raise CheckpointError("truncated", file=self.shard_paths[entry.shard], tensor=entry.name)
        return view

    def read(self, name: str, verify: bool = True) -> torch.Tensor | list[bytes]:
        """The tensor `name` as a torch tensor (a view of the mapped shard when aligned), or a
        list of bytes for a string tensor; `verify` checks its crc32c first."""
        entry = self.entry(name)
        view = self._bytes(entry)
        path = self.shard_paths[entry.shard]
        if entry.dtype == "string":
            return self._strings(entry, view, path, verify)
        if verify:
            actual = mask_crc(crc32c(view))
            if actual != entry.crc:
                raise CheckpointError(
                    f"crc32c mismatch (index says {entry.crc:#010x}, bytes give {actual:#010x}): the data is corrupt",
                    file=path,
                    tensor=name,
                )
        dtype = next(t for n, t, _ in DTYPES.values() if n == entry.dtype)
        if entry.size == 0:
            return torch.empty(entry.shape, dtype=dtype)
        if entry.offset % dtype.itemsize:  # unaligned for its dtype: one copy
            return torch.frombuffer(bytearray(view), dtype=dtype).reshape(entry.shape)
        return torch.frombuffer(self._maps[entry.shard], dtype=dtype, count=entry.numel, offset=entry.offset).reshape(
            entry.shape
        )

    def _strings(self, entry: BundleEntry, view: memoryview, path: Path, verify: bool) -> list[bytes]:
        """String tensors: varint64 lengths, a masked crc32c of the lengths, then the bytes. The
        entry's crc covers the lengths (little-endian uint32, uint64 past 4 GiB), that crc, and the
        bytes."""
        lengths, pos, end = [], 0, len(view)
        try:
            for _ in range(entry.numel):
                length, pos = _varint(view, pos, end, "string lengths")
                lengths.append(length)
        except ValueError as exc:
            raise CheckpointError(str(exc), file=path, tensor=entry.name) from None
        if pos + 4 + sum(lengths) != end:
            raise CheckpointError(
                f"{len(lengths)} strings of {sum(lengths)} bytes do not fill the entry's {end} bytes",
                file=path,
                tensor=entry.name,
            )
        length_crc = bytes(view[pos : pos + 4])
        packed = b"".join(struct.pack("<I" if n < 1 << 32 else "<Q", n) for n in lengths)
        crc = crc32c(packed) if packed else 0
        if verify and mask_crc(crc) != int.from_bytes(length_crc, "little"):
            raise CheckpointError("crc32c mismatch in the string lengths", file=path, tensor=entry.name)
        crc = crc32c(length_crc, crc)
        pos += 4
        out = []
        for length in lengths:
            chunk = bytes(view[pos : pos + length])
            crc = crc32c(chunk, crc) if chunk else crc
            out.append(chunk)
            pos += length
        if verify and mask_crc(crc) != entry.crc:
            raise CheckpointError("crc32c mismatch: the data is corrupt", file=path, tensor=entry.name)
        return out


__all__ = ["BundleEntry", "CheckpointError", "TensorBundle", "crc32c", "mask_crc"]
