"""The shard format: compiled instances as rows of a Parquet table, side inputs in compact form.

One row per instance. Columns have plain names and plain Arrow types, so a shard reads as an
ordinary table in pyarrow, pandas or HF `datasets`:

    provenance   doc_numbers, doc_ids, sources, source_lines, source_records, window, windows
    sequences    long_token_ids, long_type_ids, global_token_ids, global_type_ids,
                 global_node_ids, global_node_types, long_char_start, long_char_end, texts
    compact      long_doc, long_segment, long_hard_l2g, owner_<level> ...,
    side inputs  global_doc, global_segment, global_blockable, global_hard_g2l,
                 link_long, link_global, link_label, g2g_src, g2g_dst, g2g_label, cross_segment_label
    truncation   long_length, global_length, truncated, long_tokens_before/after,
                 globals_before/after, dropped_nodes, dropped_targets, truncation_messages
    features     feature:<global|long>:<name> (the schema's per-token / per-global arrays)
    targets      target:<array> (the schema's task labels: int16 per global, int32 scalars, or
                 int32 rows flattened; -100 where there is no label)

docs/SHARDS.md lists every column with its dtype, shape, meaning and ignore values.

The dense [L, G] / [G, L] / [G, G] tensors are never stored: `CompactSideInputs.to_dense`
derives them when a row is loaded. Ids and positions use the narrowest dtype the *run* allows
(token ids uint16 when the vocabulary fits, global positions int16, labels int8, ...), chosen
from the schema and tokenizer rather than from the data, so that every shard of a run has one
Arrow schema. Values that would not fit raise (the document is rejected), never wrap.

The footer carries the run's settings, the schema text and the LabelVocab (keys
``graphattn.*``), and no timestamp or host name: the same inputs and settings give the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from graphattn.compact import CompactSideInputs
from graphattn.contract import EtcInstance
from graphattn.errors import GraphattnError
from graphattn.labels import LabelVocab
from graphattn.schema.targets import target_arrays
from graphattn.shards import arrow

FORMAT = "graphattn-shards/3"  # 2: hard-mask flags per query row only; 3: task targets (target:*, dropped_targets)
ROWS_PER_GROUP = 64  # rows per Parquet row group: the unit of random access and of worker sharding
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 3
META_PREFIX = "graphattn."

# Compact-side fields and how they are stored: per-long / per-global arrays and sparse lists.
LONG_ARRAYS = {"long_doc": "doc", "long_segment": "int32", "long_hard_l2g": "bool"}
GLOBAL_ARRAYS = {"global_doc": "doc", "global_segment": "int32", "global_blockable": "bool", "global_hard_g2l": "bool"}
SPARSE_ARRAYS = {
    "link_long": "int32",
    "link_global": "gpos",
    "link_label": "label",
    "g2g_src": "gpos",
    "g2g_dst": "gpos",
    "g2g_label": "label",
}
_SCALARS = ("local_radius", "max_distance", "levels", "owners", "cross_segment_label")
_COMPACT_FIELDS = set(LONG_ARRAYS) | set(GLOBAL_ARRAYS) | set(SPARSE_ARRAYS) | set(_SCALARS)
_STRING_LISTS = (
    "doc_ids",
    "sources",
    "texts",
    "global_node_ids",
    "global_node_types",
    "dropped_nodes",
    "dropped_targets",
    "truncation_messages",
)
_INT_SCALARS = (
    "window",
    "windows",
    "long_length",
    "global_length",
    "long_tokens_before",
    "long_tokens_after",
    "globals_before",
    "globals_after",
)


@dataclass(frozen=True)
class ShardColumns:
    """What a run's rows look like: fixed by the schema and the tokenizer, shared by all shards."""

    token: str  # numpy dtype names
    type: str
    gpos: str
    label: str
    doc: str
    levels: tuple[str, ...]
    features: tuple[tuple[str, str], ...]  # (key like "global:font_size", dtype)
    local_radius: int
    max_distance: int
    targets: tuple[tuple[str, str, tuple[int, ...]], ...] = ()  # (array name, axis "global" | "", fixed shape)

    @classmethod
    def for_run(cls, schema, vocab_size: int) -> ShardColumns:
        features = tuple(
            (f"{side}:{f.name}", "float32" if f.dtype == "float32" else "int32")
            for f in schema.features
            for side in ("global", "long")
        )
        return cls(
            token="uint16" if vocab_size <= 1 << 16 else "int32",
            type="int16",
            gpos="int16" if schema.max_global_length < 1 << 15 else "int32",
            label="int8" if schema.relative_vocab_size < 1 << 7 else "int16",
            doc="int8" if schema.max_documents < 1 << 7 else "int16",
            levels=tuple(schema.global_types),
            features=tuple(sorted(features)),
            local_radius=schema.local_radius,
            max_distance=schema.relative_pos_max_distance,
            targets=tuple((a.name, a.axis, a.shape) for a in target_arrays(schema.targets)),
        )

    def dtype(self, kind: str) -> np.dtype:
        return np.dtype(getattr(self, kind) if kind in ("token", "type", "gpos", "label", "doc") else kind)

    def to_dict(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "type": self.type,
            "gpos": self.gpos,
            "label": self.label,
            "doc": self.doc,
            "levels": list(self.levels),
            "features": [list(f) for f in self.features],
            "local_radius": self.local_radius,
            "max_distance": self.max_distance,
            "targets": [[name, axis, list(shape)] for name, axis, shape in self.targets],
        }

    @classmethod
    def from_dict(cls, data: dict) -> ShardColumns:
        targets = tuple((name, axis, tuple(shape)) for name, axis, shape in data.get("targets", []))
        features = tuple(tuple(f) for f in data["features"])
        return cls(**{**data, "levels": tuple(data["levels"]), "features": features, "targets": targets})

    def target_type(self, axis: str, shape: tuple[int, ...]) -> pa.DataType:
        """Per-global labels as list<int16>, scalars as int32, fixed rows as flat list<int32>."""
        if axis == "global":
            return pa.list_(pa.int16())
        return pa.int32() if not shape else pa.list_(pa.int32())

    def arrow_schema(self) -> pa.Schema:
        """Column names and types of every shard of the run, in order."""
        a = lambda kind: pa.from_numpy_dtype(self.dtype(kind))  # noqa: E731
        cols: list[tuple[str, pa.DataType]] = [
            ("doc_numbers", pa.list_(pa.int64())),
            ("doc_ids", pa.list_(pa.string())),
            ("sources", pa.list_(pa.string())),
            ("source_lines", pa.list_(pa.int64())),
            ("source_records", pa.list_(pa.int64())),
            ("window", pa.int32()),
            ("windows", pa.int32()),
            ("long_length", pa.int32()),
            ("global_length", pa.int32()),
            ("long_token_ids", pa.list_(a("token"))),
            ("long_type_ids", pa.list_(a("type"))),
            ("global_token_ids", pa.list_(a("token"))),
            ("global_type_ids", pa.list_(a("type"))),
            ("global_node_ids", pa.list_(pa.string())),
            ("global_node_types", pa.list_(pa.string())),
            ("long_char_gap", pa.list_(pa.int32())),
            ("long_char_length", pa.list_(pa.int32())),
        ]
        cols += [(name, pa.list_(a(kind))) for name, kind in LONG_ARRAYS.items()]
        cols += [(f"owner_{level}", pa.list_(a("gpos"))) for level in self.levels]
        cols += [(name, pa.list_(a(kind))) for name, kind in GLOBAL_ARRAYS.items()]
        cols += [(name, pa.list_(a(kind))) for name, kind in SPARSE_ARRAYS.items()]
        cols += [("cross_segment_label", a("label")), ("truncated", pa.bool_())]
        cols += [
            (name, pa.int32())
            for name in ("long_tokens_before", "long_tokens_after", "globals_before", "globals_after")
        ]
        cols += [
            ("dropped_nodes", pa.list_(pa.string())),
            ("dropped_targets", pa.list_(pa.string())),
            ("truncation_messages", pa.list_(pa.string())),
        ]
        cols += [(f"feature:{key}", pa.list_(pa.from_numpy_dtype(np.dtype(dtype)))) for key, dtype in self.features]
        cols += [(f"target:{name}", self.target_type(axis, shape)) for name, axis, shape in self.targets]
        cols += [("texts", pa.list_(pa.string()))]
        return pa.schema(cols)


def _narrow(values: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """Cast to the run's dtype, refusing values that would not survive the trip."""
    values = np.asarray(values)
    out = values.astype(dtype, copy=False)
    if out.dtype != values.dtype and values.size and not np.array_equal(out, values):
        bad = values[out != values][0]
        raise GraphattnError(
            f"{what} holds {bad}, which does not fit the shard's {dtype} column "
            "(the schema's limits decide the column types)"
        )
    return out


@dataclass
class Provenance:
    """Where the documents of one instance came from (one entry per packed document)."""

    doc_numbers: list[int]
    sources: list[str]
    lines: list[int | None]
    records: list[int | None]
    window: int = 0
    windows: int = 1


def instance_row(inst: EtcInstance, where: Provenance, layout: ShardColumns) -> dict[str, Any]:
    """One instance as a row: numpy arrays in the run's dtypes, lists of strings, scalars."""
    side = inst.side
    if not isinstance(side, CompactSideInputs):
        raise GraphattnError("shards store the compact form: compile with compact=True")
    unknown = {f.name for f in fields(side)} - _COMPACT_FIELDS
    if unknown:
        raise GraphattnError(f"CompactSideInputs has field(s) {sorted(unknown)} the shard format does not store yet")
    _check_consistent(inst, layout)
    dt = layout.dtype
    trunc = inst.truncation
    row: dict[str, Any] = {
        "doc_numbers": np.asarray(where.doc_numbers, np.int64),
        "doc_ids": list(inst.doc_ids),
        "sources": list(where.sources),
        "source_lines": list(where.lines),
        "source_records": list(where.records),
        "window": where.window,
        "windows": where.windows,
        "long_length": inst.long_length,
        "global_length": inst.global_length,
        "long_token_ids": _narrow(inst.long_token_ids, dt("token"), "long_token_ids"),
        "long_type_ids": _narrow(inst.long_type_ids, dt("type"), "long_type_ids"),
        "global_token_ids": _narrow(inst.global_token_ids, dt("token"), "global_token_ids"),
        "global_type_ids": _narrow(inst.global_type_ids, dt("type"), "global_type_ids"),
        "global_node_ids": list(inst.global_node_ids),
        "global_node_types": list(inst.global_node_types),
        **span_columns(inst.long_char_spans),
        "cross_segment_label": side.cross_segment_label,
        "truncated": trunc.truncated,
        "long_tokens_before": trunc.long_tokens_before,
        "long_tokens_after": trunc.long_tokens_after,
        "globals_before": trunc.globals_before,
        "globals_after": trunc.globals_after,
        "dropped_nodes": list(trunc.dropped_nodes),
        "dropped_targets": list(trunc.dropped_targets),
        "truncation_messages": list(trunc.messages),
        "texts": list(inst.texts),
    }
    for table in (LONG_ARRAYS, GLOBAL_ARRAYS, SPARSE_ARRAYS):
        for name, kind in table.items():
            row[name] = _narrow(getattr(side, name), dt(kind), name)
    for i, level in enumerate(layout.levels):
        row[f"owner_{level}"] = _narrow(side.owners[i], dt("gpos"), f"owner_{level}")
    for key, dtype in layout.features:
        row[f"feature:{key}"] = _narrow(inst.features[key], np.dtype(dtype), f"feature {key}")
    for name, axis, shape in layout.targets:
        value = np.asarray(inst.targets[name])
        if axis == "global":
            row[f"target:{name}"] = _narrow(value, np.dtype("int16"), f"target {name}")
        else:
            flat = int(value) if not shape else _narrow(value.reshape(-1), np.dtype("int32"), f"target {name}")
            row[f"target:{name}"] = flat
    return row


def _check_consistent(inst: EtcInstance, layout: ShardColumns) -> None:
    """What the format stores once must really be one thing (else a compiler change lost data)."""
    side = inst.side
    problems = []
    if tuple(side.levels) != layout.levels or list(inst.long_owners) != list(layout.levels):
        problems.append(f"hierarchy levels {side.levels} differ from the schema's {layout.levels}")
    elif any(not np.array_equal(inst.long_owners[lv], side.owners[i]) for i, lv in enumerate(layout.levels)):
        problems.append("long_owners differ from the compact owners")
    if not np.array_equal(inst.long_doc_index, side.long_doc):
        problems.append("long_doc_index differs from the compact long_doc")
    if inst.global_doc_index is not None and not np.array_equal(inst.global_doc_index, side.global_doc):
        problems.append("global_doc_index differs from the compact global_doc")
    if (side.local_radius, side.max_distance) != (layout.local_radius, layout.max_distance):
        problems.append("local radius / max distance differ from the schema's")
    if sorted(inst.features) != sorted(k for k, _ in layout.features):
        problems.append(f"features {sorted(inst.features)} differ from the schema's {[k for k, _ in layout.features]}")
    declared = {name: (axis, shape) for name, axis, shape in layout.targets}
    found = {
        name: (axis, np.shape(inst.targets[name]) if axis == "" else ()) for name, axis in inst.target_axes.items()
    }
    if found != declared:
        problems.append(f"targets {sorted(found)} differ from the schema's {sorted(declared)} (or their shapes do)")
    if problems:
        raise GraphattnError("instance does not fit the shard format: " + "; ".join(problems))


def span_columns(spans: np.ndarray) -> dict[str, np.ndarray]:
    """Char spans as small numbers: the gap since the previous token's end, and the length.

    Word pieces follow each other, so gaps are mostly 0 or 1 and lengths short; both compress to
    a few bits where raw offsets grow with the text. Inserted tokens (-1, -1) round-trip too.
    """
    start, end = spans[:, 0].astype(np.int64), spans[:, 1].astype(np.int64)
    previous_end = np.concatenate([[0], end[:-1]])
    return {
        "long_char_gap": (start - previous_end).astype(np.int32),
        "long_char_length": (end - start).astype(np.int32),
    }


def spans_from_columns(gap: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Inverse of `span_columns`: start[i] = start[i-1] + length[i-1] + gap[i]."""
    gap, length = gap.astype(np.int64), length.astype(np.int64)
    start = np.cumsum(gap + np.concatenate([[0], length[:-1]]))
    return np.stack([start, start + length], axis=1).astype(np.int32).reshape(-1, 2)


def rows_to_table(rows: Sequence[dict[str, Any]], layout: ShardColumns) -> pa.Table:
    """Rows (from `instance_row`) -> an Arrow table with the run's schema, columns built from buffers."""
    schema = layout.arrow_schema()
    arrays = [arrow.column([row[fld.name] for row in rows], fld.type) for fld in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


# -- writing ---------------------------------------------------------------------------------
def shard_metadata(
    settings: dict, schema_text: str, vocab: LabelVocab, layout: ShardColumns, shard: dict
) -> dict[bytes, bytes]:
    dump = lambda x: json.dumps(x, sort_keys=True, ensure_ascii=False).encode()  # noqa: E731
    return {
        b"graphattn.format": FORMAT.encode(),
        b"graphattn.settings": dump(settings),
        b"graphattn.schema": schema_text.encode(),
        b"graphattn.label_vocab": dump(vocab.to_dict()),
        b"graphattn.layout": dump(layout.to_dict()),
        b"graphattn.shard": dump(shard),
    }


def encode_shard(table: pa.Table, metadata: dict[bytes, bytes]) -> bytes:
    """The Parquet bytes of a shard (deterministic: fixed row groups, no timestamps)."""
    table = table.replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        row_group_size=ROWS_PER_GROUP,
        compression=COMPRESSION,
        compression_level=COMPRESSION_LEVEL,
        write_statistics=False,
        write_page_index=False,
    )
    return sink.getvalue().to_pybytes()


def write_atomic(path: str, data: bytes) -> None:
    """Write bytes to `path` so that a reader (or a killed run) never sees half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:  # disk full, Ctrl-C: no half file stays behind, under either name
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
