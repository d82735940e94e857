"""Training on compiled shards: a map-style Dataset, an IterableDataset, and a collate.

    from torch.utils.data import DataLoader
    from graphattn.shards.dataset import ShardDataset, ShardIterableDataset, collate

    loader = DataLoader(ShardDataset("shards/"), batch_size=8, shuffle=True, num_workers=2, collate_fn=collate)
    stream = DataLoader(
        ShardIterableDataset("shards/", shuffle=True, seed=0), batch_size=8, num_workers=2, collate_fn=collate
    )

Items are `EtcInstance`s equal to what `graphattn.compile` returns in memory (dense side inputs;
`compact=True` keeps the compact form, which `collate` pads and expands in one step).

Shards are Parquet files read through memory maps, one row group at a time: the row group is the
unit of decoding, so `ShardDataset` keeps the last few decoded row groups per worker (random
access by index costs one row-group decode on a miss), and `ShardIterableDataset` hands whole row
groups to DataLoader workers (and ranks), shuffled per epoch, with an optional shuffle buffer
across them. Shards are also plain tables: `read_table("shards/")` or
``datasets.load_dataset("parquet", data_files="shards/*.parquet")``.
"""

from __future__ import annotations

import bisect
import os
import random
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from graphattn.compile.batching import collate as _collate
from graphattn.contract import EtcBatch, EtcInstance
from graphattn.errors import GraphattnError
from graphattn.shards.format import Provenance
from graphattn.shards.reader import DecodedRows, ShardInfo, Source, read_info, read_row_group, shard_paths
from graphattn.shards.verify import ShardFormatError, check_digests, check_same_run, classes_from_footer


class _Shards:
    """Open shard files (memory-mapped) and a small cache of decoded row groups, per process.

    Opening checks every footer and that the shards come from one run, and (`verify_sha256`)
    each file against its done marker; every row group decoded is checked before it is used
    (`graphattn.shards.verify`). `classes`: per class-valued target array the schema's class
    count (default: the footer schema's)."""

    def __init__(
        self, paths: list[str], cache_size: int, classes: dict[str, int] | None = None, verify_sha256: bool = True
    ):
        self.paths = paths
        self.cache_size = max(1, cache_size)
        if verify_sha256:
            check_digests(paths)  # several files at a time; a file whose stamp holds is not hashed again
        self.infos = [read_info(p, verify_sha256=verify_sha256) for p in paths]
        for info in self.infos[1:]:
            check_same_run(self.infos[0], info)
        footer_classes = classes_from_footer(self.infos[0]) if self.infos else None
        self.classes = footer_classes if classes is None else classes
        self.first_rows = [np.cumsum([0, *info.row_groups]).tolist() for info in self.infos]  # per shard, per group
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._files: dict[int, pq.ParquetFile] = {}
        self._cache: OrderedDict[tuple[int, int], DecodedRows] = OrderedDict()

    def __getstate__(self):  # open files and caches never travel to another process
        return {
            "paths": self.paths,
            "cache_size": self.cache_size,
            "infos": self.infos,
            "classes": self.classes,
            "first_rows": self.first_rows,
        }

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self._reset()

    def row_group(self, shard: int, group: int) -> DecodedRows:
        if os.getpid() != self._pid:  # a forked DataLoader worker: its own handles
            self._reset()
        key = (shard, group)
        rows = self._cache.get(key)
        if rows is not None:
            self._cache.move_to_end(key)
            return rows
        pf = self._files.get(shard)
        info = self.infos[shard]
        if pf is None:
            try:
                pf = self._files[shard] = pq.ParquetFile(pa.memory_map(self.paths[shard], "r"))
            except (OSError, pa.ArrowException) as err:
                raise ShardFormatError(f"cannot be read again: {' '.join(str(err).split())}", file=info.path) from None
        rows = DecodedRows(read_row_group(pf, info, group), info, self.classes, self.first_rows[shard][group])
        self._cache[key] = rows
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return rows

    def units(self) -> list[tuple[int, int]]:
        """Every (shard, row group), in order."""
        return [(s, g) for s, info in enumerate(self.infos) for g in range(len(info.row_groups))]


class ShardDataset(Dataset):
    """Random access to compiled instances by index (0 .. len-1, shards in path order).

    Every footer, every decoded row group and (`verify_sha256`, the default) each file's done
    marker are checked (`graphattn.shards.verify`); a shard that fails raises ShardFormatError
    naming the file, row and column. `classes` bounds the class-valued targets (default: the
    classes of the schema in the footer)."""

    def __init__(
        self,
        source: Source,
        *,
        compact: bool = False,
        cache_row_groups: int = 4,
        classes: dict[str, int] | None = None,
        verify_sha256: bool = True,
    ):
        self.shards = _Shards(shard_paths(source), cache_row_groups, classes, verify_sha256)
        self.compact = compact
        self._units = self.shards.units()
        sizes = [self.shards.infos[s].row_groups[g] for s, g in self._units]
        self._starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def info(self) -> ShardInfo:
        return self.shards.infos[0]

    def _locate(self, index: int) -> tuple[DecodedRows, int]:
        """The decoded row group holding instance `index`, and the row inside it."""
        n = len(self)
        index = int(index)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range for {n} instances")
        index %= n
        unit = bisect.bisect_right(self._starts, index) - 1
        return self.shards.row_group(*self._units[unit]), index - self._starts[unit]

    def __getitem__(self, index: int) -> EtcInstance:
        rows, row = self._locate(index)
        return rows.instance(row, self.compact)

    def provenance(self, index: int) -> Provenance:
        """Which documents (number, file, line or record) instance `index` was compiled from."""
        rows, row = self._locate(index)
        return rows.provenance(row)


class ShardIterableDataset(IterableDataset):
    """Streams instances; row groups are split across DataLoader workers and ranks.

    With `shuffle`, row-group order is permuted per epoch (`set_epoch`) from `seed`, and a
    buffer of `buffer_size` instances mixes rows across row groups. Every instance comes exactly
    once per epoch over all workers and ranks.
    """

    def __init__(
        self,
        source: Source,
        *,
        shuffle: bool = False,
        buffer_size: int = 1024,
        seed: int = 0,
        compact: bool = False,
        rank: int = 0,
        world_size: int = 1,
        classes: dict[str, int] | None = None,
        verify_sha256: bool = True,
    ):
        if not 0 <= rank < world_size:
            raise GraphattnError(f"rank {rank} is outside world_size {world_size}")
        self.shards = _Shards(shard_paths(source), 1, classes, verify_sha256)
        self.shuffle, self.buffer_size, self.seed, self.compact = shuffle, max(1, buffer_size), seed, compact
        self.rank, self.world_size = rank, world_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return sum(info.num_rows for info in self.shards.infos)

    def _my_units(self) -> tuple[list[tuple[int, int]], int]:
        units = self.shards.units()
        if self.shuffle:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(units)
        worker = get_worker_info()
        workers, worker_id = (1, 0) if worker is None else (worker.num_workers, worker.id)
        reader = self.rank * workers + worker_id
        return units[reader :: self.world_size * workers], reader

    def _rows(self, units: list[tuple[int, int]]) -> Iterator[EtcInstance]:
        for shard, group in units:
            rows = self.shards.row_group(shard, group)
            for i in range(rows.num_rows):
                yield rows.instance(i, self.compact)

    def __iter__(self) -> Iterator[EtcInstance]:
        units, reader = self._my_units()
        if not self.shuffle:
            yield from self._rows(units)
            return
        rng = random.Random(f"{self.seed}:{self.epoch}:{reader}")
        buffer: list[EtcInstance] = []
        for item in self._rows(units):
            if len(buffer) < self.buffer_size:
                buffer.append(item)
                continue
            j = rng.randrange(self.buffer_size)
            buffer[j], item = item, buffer[j]
            yield item
        rng.shuffle(buffer)
        yield from buffer


def collate(
    instances: Sequence[EtcInstance], pad_to_long: int | None = None, pad_to_global: int | None = None
) -> EtcBatch:
    """DataLoader `collate_fn`: pad and stack instances into an EtcBatch (graphattn.compile.batching)."""
    return _collate(instances, pad_to_long=pad_to_long, pad_to_global=pad_to_global)


def read_instance(source: Source, index: int = 0, *, compact: bool = False) -> EtcInstance:
    """Instance `index` of a shard file or a directory of shards (counting across shards)."""
    dataset = ShardDataset(source, compact=compact, cache_row_groups=1)
    if not 0 <= index < len(dataset):
        raise GraphattnError(f"instance {index} is out of range: the shards hold {len(dataset)}", file=str(source))
    return dataset[index]


def read_table(source: Source, columns: Sequence[str] | None = None) -> pa.Table:
    """The shards as one plain Arrow table (optionally only some columns). Footers and column sets
    are checked (`read_info`), the values are not: the datasets above check every row they decode."""
    paths = shard_paths(source)
    for path in paths:
        read_info(path)
    tables = [pq.read_table(path, columns=list(columns) if columns else None) for path in paths]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
