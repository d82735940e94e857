"""Data for the training loop: batches of in-memory examples, or of compiled Parquet shards.

Both loaders give the same order for the same (seed, epoch), which exact resume relies on, and
both split the data between DDP ranks so that every rank runs the same number of batches.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from graphattn.compile.batching import collate
from graphattn.errors import GraphattnError
from graphattn.train.distributed import get_rank, get_world_size


class InstanceLoader:
    """Batches of in-memory items (EtcInstances, or whatever `collate_fn` understands).

    Shuffled per epoch from (seed, epoch) when `shuffle`; under DDP, rank r takes every
    world_size-th item of the epoch's order after the order is cut to a multiple of world_size,
    so with batch size b per rank, step j of all ranks together sees exactly the items a single
    process with batch size b * world_size sees at step j."""

    def __init__(
        self,
        items: Sequence[Any],
        batch_size: int,
        collate_fn: Callable[[list], Any] = collate,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ):
        if batch_size < 1:
            raise GraphattnError(f"batch_size must be >= 1, got {batch_size}")
        self.items, self.batch_size, self.collate_fn = list(items), batch_size, collate_fn
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rank = get_rank() if rank is None else rank
        self.world_size = get_world_size() if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise GraphattnError(f"rank {self.rank} is outside world_size {self.world_size}")
        if len(self.items) < self.world_size:
            raise GraphattnError(f"{len(self.items)} items cannot feed {self.world_size} ranks")
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _my_indices(self) -> np.ndarray:
        order = np.arange(len(self.items))
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(order)
        usable = len(order) - len(order) % self.world_size
        return order[:usable][self.rank :: self.world_size]

    def __len__(self) -> int:
        per_rank = len(self.items) // self.world_size
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        indices = self._my_indices()
        for start in range(0, len(indices), self.batch_size):
            chunk = indices[start : start + self.batch_size]
            if self.drop_last and len(chunk) < self.batch_size:
                return
            yield self.collate_fn([self.items[i] for i in chunk])


def shard_loader(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    buffer_size: int = 1024,
    num_workers: int = 0,
    compact: bool = False,
    pad_to_long: int | None = None,
    pad_to_global: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    classes: dict[str, int] | None = None,
    verify_sha256: bool = True,
) -> DataLoader:
    """A DataLoader of EtcBatches streamed from compiled shards (`graphattn compile` output: a
    directory, files, globs), task targets included in `batch.targets`.

    Row groups are split across ranks and workers and shuffled per epoch (the Trainer calls
    set_epoch); ranks whose share runs out first end the epoch for everyone (see Trainer).
    `compact=True` keeps instances in the compact form until collate (what the shuffle buffer
    should hold: dense side inputs are O(L * G) per instance). Every row group is checked as it
    is decoded (`classes`: the schema's class count per class-valued target array), and each
    shard against its done marker unless `verify_sha256` is False (`graphattn.shards.verify`)."""
    from graphattn.shards.dataset import ShardIterableDataset  # the shard reader pulls in pyarrow; import on use

    rank = get_rank() if rank is None else rank
    world_size = get_world_size() if world_size is None else world_size
    dataset = ShardIterableDataset(
        source,
        shuffle=shuffle,
        buffer_size=buffer_size,
        seed=seed,
        compact=compact,
        rank=rank,
        world_size=world_size,
        classes=classes,
        verify_sha256=verify_sha256,
    )

    collate_batch = functools.partial(collate, pad_to_long=pad_to_long, pad_to_global=pad_to_global)
    return _ShardLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate_batch,
    )


class _WorkerError:
    """A GraphattnError met while reading shards, carried to the loader as an item."""

    def __init__(self, error: GraphattnError):
        self.error = error  # pickles with its message and location


class _ErrorsAsItems(IterableDataset):
    """`dataset`, ending with a _WorkerError item where it raises a GraphattnError; its length and
    attributes (set_epoch, shards, ...) are the dataset's."""

    def __init__(self, dataset: IterableDataset):
        self.dataset = dataset

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self.dataset
        except GraphattnError as error:
            yield _WorkerError(error)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (while unpickling in a worker): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)


class _ShardLoader(DataLoader):
    """A DataLoader that raises a GraphattnError met in a worker process (a shard that fails its
    checks) as that same error, with its message and location. torch itself would re-raise it
    with the worker's traceback folded into the message."""

    def __init__(self, dataset: IterableDataset, *, collate_fn: Callable, **options: Any):
        collate_batch = functools.partial(_collate_or_error, collate_fn)
        options["worker_init_fn"] = functools.partial(_start_worker, options.get("worker_init_fn"))
        super().__init__(_ErrorsAsItems(dataset), collate_fn=collate_batch, **options)

    def __iter__(self) -> Iterator[Any]:
        with stop_signals_blocked(self.num_workers > 0):  # the workers start here: none may die of a stop signal
            iterator = super().__iter__()
        for batch in iterator:
            if isinstance(batch, _WorkerError):
                raise batch.error from None
            yield batch


def _collate_or_error(collate_fn: Callable, items: list) -> Any:
    """The batch, or the _WorkerError among its items."""
    return next((item for item in items if isinstance(item, _WorkerError)), None) or collate_fn(items)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_signals_blocked(enabled: bool = True) -> Iterator[None]:
    """SIGINT and SIGTERM held back (delivered on exit) while DataLoader workers are forked: a
    worker inherits the mask, so a signal sent to the process group between its start and
    `_ignore_interrupts` waits instead of killing it with torch's default SIGTERM action."""
    if not enabled or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _start_worker(init_fn: Callable[[int], None] | None, worker_id: int) -> None:
    """DataLoader workers leave Ctrl-C and SIGTERM to the trainer, which finishes its step,
    checkpoints and shuts them down (Ctrl-C in a terminal, `scancel`, `docker stop` and
    Kubernetes signal every process of the group or job, workers included). SIGINT is ignored;
    SIGTERM stays blocked (as the loader started the worker) and a thread takes it with
    sigwaitinfo: from the parent (DataLoader's own shutdown, multiprocessing at exit) the worker
    ends as torch's handler would end it, from anyone else it is dropped. A worker whose parent
    is gone still ends: torch's watchdog in the worker sees it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "sigwaitinfo"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        threading.Thread(
            target=_end_on_parents_sigterm, args=(os.getppid(),), daemon=True, name="graphattn-sigterm"
        ).start()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    else:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if init_fn is not None:
        init_fn(worker_id)


def _end_on_parents_sigterm(parent: int) -> None:
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM})
        if info.si_pid == parent:
            os._exit(0)
