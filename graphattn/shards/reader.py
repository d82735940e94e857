"""Reading shards back: which files a source names, a shard's footer (checked), and its rows.

The format itself (columns, dtypes, footer keys) is `graphattn.shards.format`; the checks a
footer, a column or a row must pass are `graphattn.shards.verify` and `verify_rows`. Every
reader (dataset, inspect, viz, train, evaluate) comes through here, so a shard that fails a
check is refused alike everywhere, with the file, the row and the column named.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from graphattn.compact import CompactSideInputs
from graphattn.contract import EtcInstance, TruncationReport
from graphattn.errors import GraphattnError
from graphattn.labels import LabelVocab
from graphattn.shards.format import (
    FORMAT,
    GLOBAL_ARRAYS,
    LONG_ARRAYS,
    SPARSE_ARRAYS,
    Provenance,
    ShardColumns,
    spans_from_columns,
)
from graphattn.shards.verify import (
    ShardFormatError,
    check_columns,
    check_digest,
    check_label_vocab,
    check_layout,
    check_settings,
    classes_from_footer,
    footer_json,
    footer_text,
)
from graphattn.shards.verify_rows import check_rows

Source = str | os.PathLike | Sequence[str | os.PathLike]


def shard_paths(source: Source) -> list[str]:
    """The shard files a source names: a file, a directory of ``*.parquet`` shards, a glob
    pattern (``runs/*/shard-*.parquet``), or a list of these."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            found = sorted(str(p) for p in path.glob("*.parquet"))
            if not found:
                raise GraphattnError("no *.parquet shards in this directory", file=str(path))
            return found
        if not path.exists() and glob.has_magic(str(source)):
            matches = sorted(p for p in glob.glob(str(source), recursive=True) if os.path.isfile(p))
            if not matches:
                raise GraphattnError(f"the pattern {str(source)!r} matches no shard file")
            return matches
        if not path.is_file():
            raise GraphattnError("no such shard file or directory", file=str(path))
        return [str(path)]
    paths = [p for item in source for p in shard_paths(item)]
    if not paths:
        raise GraphattnError("no shards given")
    return paths


@dataclass(frozen=True)
class ShardInfo:
    """A shard's footer: what is needed to turn its rows back into instances."""

    path: str
    settings: dict
    schema_text: str
    label_vocab: LabelVocab
    layout: ShardColumns
    shard: dict
    num_rows: int
    row_groups: tuple[int, ...]  # rows per row group


def read_info(
    path: str | os.PathLike, parquet_file: pq.ParquetFile | None = None, *, verify_sha256: bool = False
) -> ShardInfo:
    """A shard's footer, checked (`graphattn.shards.verify`): keys, types, the column set; with
    `verify_sha256`, also the file against its done marker."""
    path = str(path)
    if verify_sha256:
        check_digest(path)
    try:
        pf = parquet_file or pq.ParquetFile(path)
        meta = pf.schema_arrow.metadata or {}
    except (OSError, pa.ArrowException) as err:
        raise ShardFormatError(f"not a readable Parquet file: {' '.join(str(err).split())}", file=path) from None
    if meta.get(b"graphattn.format") != FORMAT.encode():
        found = meta.get(b"graphattn.format", b"none").decode(errors="replace")
        raise ShardFormatError(f"not a graphattn shard (format {found!r}, expected {FORMAT!r})", file=path)
    md = pf.metadata
    settings, shard = footer_json(meta, "settings", path), footer_json(meta, "shard", path)
    layout_data = check_layout(footer_json(meta, "layout", path), path)
    vocab = check_label_vocab(footer_json(meta, "label_vocab", path), layout_data, path)
    layout = ShardColumns.from_dict(layout_data)
    check_columns(pf.schema_arrow, layout.arrow_schema(), path)
    check_settings(settings, shard, md.num_rows, path)
    return ShardInfo(
        path=path,
        settings=settings,
        schema_text=footer_text(meta, "schema", path),
        label_vocab=vocab,
        layout=layout,
        shard=shard,
        num_rows=md.num_rows,
        row_groups=tuple(md.row_group(i).num_rows for i in range(md.num_row_groups)),
    )


def read_row_group(pf: pq.ParquetFile, info: ShardInfo, group: int) -> pa.Table:
    """Row group `group` of an open shard; pages that do not decode are a ShardFormatError."""
    try:
        return pf.read_row_group(group)
    except (OSError, pa.ArrowException) as err:  # a footer that reads, pages that do not
        raise ShardFormatError(
            f"damaged shard: row group {group} cannot be read ({' '.join(str(err).split())}); compile it again",
            file=info.path,
        ) from None


class DecodedRows:
    """Rows of a table (e.g. one row group) decoded column-wise once, then cut into instances."""

    def __init__(self, table: pa.Table, info: ShardInfo, classes: dict[str, int] | None = None, first_row: int = 0):
        """Decode `table` (rows from `first_row` of the shard), checked first (`check_rows`;
        `classes`: the schema's class count per class-valued target array)."""
        rows = check_rows(table, info, classes, first_row)  # the checks' own view of the buffers, reused
        self.info = info
        self.num_rows = table.num_rows
        self._flat: dict[str, tuple[np.ndarray, Any]] = {}
        self._scalars: dict[str, list] = {}
        for name in table.column_names if rows is not None else ():
            if name in ("source_lines", "source_records"):  # nulls stay None
                offsets, _ = rows.list_column(name)
                column = rows.array(name)
                start = column.offsets[0].as_py()
                self._flat[name] = (offsets, column.values.slice(start, int(offsets[-1])).to_pylist())
            elif pa.types.is_list(table.schema.field(name).type):
                offsets, values = rows.list_column(name)
                self._flat[name] = (offsets, values.to_pylist() if isinstance(values, pa.Array) else values)
            else:
                self._scalars[name] = rows.scalar(name).tolist()

    def column(self, name: str, i: int):
        offsets, values = self._flat[name]
        return values[offsets[i] : offsets[i + 1]]

    def scalar(self, name: str, i: int):
        return self._scalars[name][i]

    def provenance(self, i: int) -> Provenance:
        return Provenance(
            list(map(int, self.column("doc_numbers", i))),
            self.column("sources", i),
            self.column("source_lines", i),
            self.column("source_records", i),
            self.scalar("window", i),
            self.scalar("windows", i),
        )

    def instance(self, i: int, compact: bool = False) -> EtcInstance:
        """Row i as the EtcInstance the compiler made (dense side inputs unless `compact`)."""
        layout = self.info.layout
        i32 = lambda name: self.column(name, i).astype(np.int32)  # noqa: E731
        flag = lambda name: self.column(name, i).astype(bool)  # noqa: E731
        L, G = self.scalar("long_length", i), self.scalar("global_length", i)
        owners = np.stack([i32(f"owner_{lv}") for lv in layout.levels]) if layout.levels else np.zeros((0, L), np.int32)
        side = CompactSideInputs(
            local_radius=layout.local_radius,
            max_distance=layout.max_distance,
            levels=layout.levels,
            owners=owners,
            **{
                name: (flag(name) if kind == "bool" else i32(name))
                for name, kind in {**LONG_ARRAYS, **GLOBAL_ARRAYS}.items()
            },
            **{name: i32(name) for name in SPARSE_ARRAYS},
            cross_segment_label=int(self.scalar("cross_segment_label", i)),
        )
        if side.long_length != L or side.global_length != G:
            raise ShardFormatError(
                f"row {i} has L={side.long_length}, G={side.global_length} but says {L}, {G}", file=self.info.path
            )
        truncation = TruncationReport(
            long_tokens_before=self.scalar("long_tokens_before", i),
            long_tokens_after=self.scalar("long_tokens_after", i),
            globals_before=self.scalar("globals_before", i),
            globals_after=self.scalar("globals_after", i),
            dropped_nodes=list(self.column("dropped_nodes", i)),
            messages=list(self.column("truncation_messages", i)),
            dropped_targets=list(self.column("dropped_targets", i)),
        )
        return EtcInstance(
            long_token_ids=i32("long_token_ids"),
            long_type_ids=i32("long_type_ids"),
            global_token_ids=i32("global_token_ids"),
            global_type_ids=i32("global_type_ids"),
            side=side if compact else side.to_dense(),
            label_vocab=self.info.label_vocab,
            global_node_ids=list(self.column("global_node_ids", i)),
            global_node_types=list(self.column("global_node_types", i)),
            long_char_spans=spans_from_columns(self.column("long_char_gap", i), self.column("long_char_length", i)),
            long_doc_index=side.long_doc.copy(),
            long_owners={lv: owners[k].copy() for k, lv in enumerate(layout.levels)},
            doc_ids=list(self.column("doc_ids", i)),
            texts=list(self.column("texts", i)),
            truncation=truncation,
            features={key: self.column(f"feature:{key}", i).astype(dtype) for key, dtype in layout.features},
            global_doc_index=side.global_doc.copy(),
            targets=self.targets(i),
            target_axes={name: axis for name, axis, _ in layout.targets},
        )

    def targets(self, i: int) -> dict[str, np.ndarray]:
        """Row i's target arrays, int32 in the shapes the compiler gave them."""
        out = {}
        for name, axis, shape in self.info.layout.targets:
            column = f"target:{name}"
            if axis == "global" or shape:
                out[name] = self.column(column, i).astype(np.int32).reshape(shape or (-1,))
            else:
                out[name] = np.asarray(self.scalar(column, i), np.int32)
        return out


def read_row(
    path: str | os.PathLike, index: int, *, compact: bool = True, verify_sha256: bool = True
) -> tuple[EtcInstance, Provenance]:
    """Instance `index` of one shard file and where it came from, decoding only its row group
    (checked, as every row group a reader decodes; `verify_sha256`: the file against its done
    marker, when it has one).

    Needs no torch (the datasets do): `graphattn viz` reads a shard this way, in its compact
    form unless asked otherwise.
    """
    path = str(path)
    try:
        pf = pq.ParquetFile(pa.memory_map(path, "r"))
    except (OSError, pa.ArrowException) as err:
        raise ShardFormatError(f"not a readable Parquet file: {' '.join(str(err).split())}", file=path) from None
    info = read_info(path, pf, verify_sha256=verify_sha256)
    if not 0 <= index < info.num_rows:
        raise ShardFormatError(
            f"instance {index} is out of range: the shard holds {info.num_rows} (counting from 0)", file=path
        )
    group, first = 0, 0
    while index >= first + info.row_groups[group]:
        first += info.row_groups[group]
        group += 1
    classes = classes_from_footer(info)
    rows = DecodedRows(read_row_group(pf, info, group), info, classes, first)
    return rows.instance(index - first, compact), rows.provenance(index - first)
