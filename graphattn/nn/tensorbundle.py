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
match, a key that is duplicated or out of order, a protobuf field of the wrong wire type, a
dtype we cannot map, a shape that disagrees with the byte count, a path that is not a regular
file (a directory, a FIFO, a symlink loop) each raise one `CheckpointError` naming the file and
the tensor. A tensor is read (`os.preadv`) into memory of its own and its crc32c computed on
those very bytes: what is handed out was checked, and nothing changes with the file afterwards
(rewriting or truncating the shard while a model holds the tensors cannot touch them).
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from graphattn.errors import GraphattnError, Location
from graphattn.nn.bundle_table import (
    BYTES,
    FIXED32,
    TABLE_MAGIC,
    VARINT,
    crc32c,
    decode_message,
    int64,
    many,
    mask_crc,
    one,
    read_table,
    shown_key,
    varint,
)

MAX_INDEX_BYTES = 1 << 28  # a checkpoint of 100k tensors has an index of a few MB
MAX_SHARDS = 1 << 16
BUNDLE_FORMAT_VERSION = 1  # TensorFlow's kTensorBundleVersion: the only layout there is

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


def open_regular(path: str | Path, what: str, error: type[GraphattnError] | None = None) -> int:
    """A read-only descriptor of `path`, refused in one line when it is not a regular file: a
    missing file, a directory, a FIFO or device (opened non-blocking, so a FIFO never hangs the
    reader), a symlink loop, a permission error. The caller closes it."""
    error = error or CheckpointError
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        reason = {
            errno.ENOENT: "missing",
            errno.ELOOP: "a symlink loop, not a file",
            errno.EACCES: "not readable (permission denied)",
            errno.ENOTDIR: "missing (a path component is not a directory)",
        }.get(err.errno, err.strerror or str(err))
        raise error(f"{what}: {reason}", file=path) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = (
            "a directory"
            if stat.S_ISDIR(mode)
            else "a FIFO (named pipe)"
            if stat.S_ISFIFO(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a device"
        )
        raise error(f"{what}: {kind}, not a regular file", file=path)
    return fd


def read_bounded(path: str | Path, what: str, limit: int, error: type[GraphattnError] | None = None) -> bytes:
    """The bytes of regular file `path`, refused before reading when it holds more than `limit`."""
    error = error or CheckpointError
    fd = open_regular(path, what, error)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise error(f"{what}: {size:,} bytes, more than the {limit:,} such a file may hold", file=path)
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:  # it grew while being read
            raise error(f"{what}: more than the {limit:,} bytes such a file may hold", file=path)
        return b"".join(chunks)
    finally:
        os.close(fd)


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


# --- the bundle -----------------------------------------------------------------------------------


class TensorBundle:
    """A TensorFlow V2 checkpoint opened for reading: `names()`, `entry(name)`, `read(name)`.

    `prefix` is the path without `.index` (e.g. `dir/model.ckpt`). Opening reads and checks the
    index, opens every shard (regular files only) and checks that every tensor's bytes lie inside
    it; reading a tensor copies its bytes into memory of its own and checks their crc32c. Close it
    (`close()`, or use it as a context manager) to release the shards' descriptors."""

    def __init__(self, prefix: str | Path):
        self.prefix = Path(prefix)
        self.index_path = Path(f"{self.prefix}.index")
        self._fds: dict[int, int] = {}
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        data = read_bounded(self.index_path, "checkpoint index", MAX_INDEX_BYTES)
        try:
            table = read_table(data)
        except ValueError as exc:
            raise CheckpointError(str(exc), file=self.index_path) from None
        self.num_shards = self._header(table.pop(b"", None))
        self.shard_paths = [
            Path(f"{self.prefix}.data-{i:05d}-of-{self.num_shards:05d}") for i in range(self.num_shards)
        ]
        self._entries: dict[str, BundleEntry] = {}
        for key, value in table.items():
            try:
                name = key.decode("utf-8")
            except UnicodeDecodeError:
                raise CheckpointError(f"key {shown_key(key)} is not UTF-8", file=self.index_path) from None
            self._entries[name] = self._entry(name, value)
        self._check_extents()

    def __enter__(self) -> TensorBundle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the shards' descriptors (tensors already read are unaffected)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    # index contents

    def _header(self, value: bytes | None) -> int:
        if value is None:
            raise CheckpointError("the index has no header entry (key '')", file=self.index_path)
        try:
            fields = decode_message(value, "header")
            shards = one(fields, 1, VARINT, 0, "header num_shards")
            endianness = one(fields, 2, VARINT, 0, "header endianness")
            version = decode_message(one(fields, 3, BYTES, b"", "header version"), "header version")
            min_consumer = one(version, 2, VARINT, 0, "header version min_consumer")
        except ValueError as exc:
            raise CheckpointError(str(exc), file=self.index_path) from None
        if not 1 <= shards <= MAX_SHARDS:
            raise CheckpointError(f"header says {shards} shards (expected 1..{MAX_SHARDS})", file=self.index_path)
        if endianness != 0:
            raise CheckpointError("big-endian checkpoints are not supported", file=self.index_path)
        if min_consumer > BUNDLE_FORMAT_VERSION:
            raise CheckpointError(
                f"needs a reader of bundle version >= {min_consumer}; this one reads {BUNDLE_FORMAT_VERSION}",
                file=self.index_path,
            )
        return shards

    def _entry(self, name: str, value: bytes) -> BundleEntry:
        def fail(message: str) -> CheckpointError:
            return CheckpointError(message, file=self.index_path, tensor=name)

        try:
            fields = decode_message(value, "entry")
            code = one(fields, 1, VARINT, 0, "entry dtype")
            shape_fields = decode_message(one(fields, 2, BYTES, b"", "entry shape"), "shape")
            dims = [
                one(decode_message(dim, "dim"), 1, VARINT, 0, "dim size") for dim in many(shape_fields, 2, BYTES, "dim")
            ]
            unknown_rank = one(shape_fields, 3, VARINT, 0, "shape unknown_rank")
            shard = one(fields, 3, VARINT, 0, "entry shard_id")
            offset = int64(one(fields, 4, VARINT, 0, "entry offset"))
            size = int64(one(fields, 5, VARINT, 0, "entry size"))
            crc = one(fields, 6, FIXED32, 0, "entry crc32c")
        except ValueError as exc:
            raise fail(str(exc)) from None
        if code not in DTYPES:
            raise fail(f"unknown or unsupported dtype (TensorFlow DataType {code})")
        if fields.get(7):
            raise fail("partitioned (sliced) tensors are not supported")
        if unknown_rank:
            raise fail("shape of unknown rank")
        shape = tuple(int64(d) for d in dims)
        if any(d < 0 for d in shape):
            raise fail(f"shape {list(shape)} has a negative dimension")
        entry = BundleEntry(
            name=name, dtype=DTYPES[code][0], shape=shape, shard=shard, offset=offset, size=size, crc=crc
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
            self._fds[i] = open_regular(path, "data shard")
            sizes[i] = os.fstat(self._fds[i]).st_size
        for entry in self._entries.values():
            if entry.offset + entry.size > sizes[entry.shard]:
                raise CheckpointError(
                    f"bytes {entry.offset}..{entry.offset + entry.size} lie past the end of the shard "
                    f"({sizes[entry.shard]} bytes): truncated",
                    file=self.shard_paths[entry.shard],
                    tensor=entry.name,
                )
        # TensorFlow writes each tensor's bytes once: two entries over the same bytes mean an index
        # that gives one tensor's values to another name
        placed = sorted((e.shard, e.offset, e.offset + e.size, e.name) for e in self._entries.values() if e.size)
        for (shard, _, end, name), (next_shard, start, _, other) in zip(placed, placed[1:]):
            if shard == next_shard and start < end:
                raise CheckpointError(
                    f"its bytes overlap those of {name!r} (from byte {start}, which ends at {end}): the index gives "
                    "one tensor's bytes to two names",
                    file=self.index_path,
                    tensor=other,
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

    def _read_into(self, entry: BundleEntry, out) -> None:
        """Fill the writable buffer `out` (entry.size bytes) from the entry's shard."""
        path = self.shard_paths[entry.shard]
        if entry.shard not in self._fds:
            raise CheckpointError("the bundle is closed", file=path, tensor=entry.name)
        view, done = memoryview(out).cast("B"), 0
        while done < entry.size:
            try:
                got = os.preadv(self._fds[entry.shard], [view[done:]], entry.offset + done)
            except OSError as err:
                raise CheckpointError(f"read failed: {err.strerror}", file=path, tensor=entry.name) from None
            if got == 0:  # the file shrank since it was opened
                raise CheckpointError(
                    f"truncated: the shard ends before byte {entry.offset + entry.size}", file=path, tensor=entry.name
                )
            done += got

    def read(self, name: str, verify: bool = True) -> torch.Tensor | list[bytes]:
        """The tensor `name` as a torch tensor in memory of its own (or a list of bytes for a
        string tensor); `verify` checks the crc32c of exactly the bytes handed out."""
        entry = self.entry(name)
        path = self.shard_paths[entry.shard]
        raw = np.empty(entry.size, dtype=np.uint8)
        self._read_into(entry, raw)
        if entry.dtype == "string":
            return self._strings(entry, memoryview(raw), path, verify)
        if verify:
            actual = mask_crc(crc32c(raw))
            if actual != entry.crc:
                raise CheckpointError(
                    f"crc32c mismatch (index says {entry.crc:#010x}, bytes give {actual:#010x}): the data is corrupt",
                    file=path,
                    tensor=name,
                )
        dtype = next(t for n, t, _ in DTYPES.values() if n == entry.dtype)
        if entry.size == 0:
            return torch.empty(entry.shape, dtype=dtype)
        return torch.from_numpy(raw).view(dtype).reshape(entry.shape)

    def _strings(self, entry: BundleEntry, view: memoryview, path: Path, verify: bool) -> list[bytes]:
        """String tensors: varint64 lengths, a masked crc32c of the lengths, then the bytes. The
        entry's crc covers the lengths (little-endian uint32, uint64 past 4 GiB), that crc, and the
        bytes."""
        lengths, pos, end = [], 0, len(view)
        try:
            for _ in range(entry.numel):
                length, pos = varint(view, pos, end, "string lengths")
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


__all__ = [
    "TABLE_MAGIC",
    "BundleEntry",
    "CheckpointError",
    "TensorBundle",
    "crc32c",
    "mask_crc",
    "open_regular",
    "read_bounded",
]
