"""Shards from instances already compiled in Python (a test, a script, a generator of examples).

    write_shards(instances, "shards/", schema, vocab_size=tokenizer.vocab_size, schema_text=yaml_text)

Corpora from files go through `graphattn compile` (`graphattn.corpus`: planning, workers,
resume, rejected and warnings lists); this writes the same format for instances in hand, so that
training reads them through the one path (`graphattn train --data`, `shard_loader`). Instances
must be compact (`compile_instance(..., compact=True)`); provenance is the instance's position.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from graphattn.contract import EtcInstance
from graphattn.errors import GraphattnError
from graphattn.shards.format import (
    FORMAT,
    Provenance,
    ShardColumns,
    encode_shard,
    instance_row,
    rows_to_table,
    shard_metadata,
    write_atomic,
)


def write_shards(
    instances: Iterable[EtcInstance],
    out: str | os.PathLike,
    schema: Any,
    *,
    vocab_size: int,
    schema_text: str,
    rows_per_shard: int = 1000,
    source: str = "<python>",
) -> list[Path]:
    """Write `shard-00000.parquet`, ... under `out` (which must hold no shards yet); their paths.

    `schema_text` is the schema as YAML/JSON text (the footer carries it, so that training builds
    its heads from the targets); `vocab_size` the tokenizer's."""
    out = Path(out)
    if out.exists() and any(out.glob("*.parquet")):
        raise GraphattnError("this directory already holds shards; write into an empty one", file=str(out))
    if rows_per_shard < 1:
        raise GraphattnError(f"rows_per_shard must be at least 1, got {rows_per_shard}")
    out.mkdir(parents=True, exist_ok=True)
    columns = ShardColumns.for_run(schema, vocab_size)
    settings = {
        "shard_format": FORMAT,
        "schema_name": schema.name,
        "tokenizer": None,
        "tokenizer_vocab_size": vocab_size,
        "source": source,
    }
    paths: list[Path] = []
    rows: list[dict] = []

    def flush() -> None:
        info = {"index": len(paths), "instances": len(rows), "rejected": 0, "warnings": 0}
        metadata = shard_metadata(settings, schema_text, schema.label_vocab(), columns, info)
        path = out / f"shard-{len(paths):05d}.parquet"
        write_atomic(str(path), encode_shard(rows_to_table(rows, columns), metadata))
        paths.append(path)
        rows.clear()

    for number, instance in enumerate(instances):
        rows.append(instance_row(instance, Provenance([number], [source], [None], [number]), columns))
        if len(rows) == rows_per_shard:
            flush()
    if rows:
        flush()
    if not paths:
        raise GraphattnError("no instances to write", file=str(out))
    return paths
