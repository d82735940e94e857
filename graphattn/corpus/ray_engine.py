"""The Ray Data engine: the same shard tasks, compiled by a pool of Ray actors.

    graphattn compile corpus/ --schema hotpotqa --tokenizer tok.json --out shards/ --engine ray --workers 8
    graphattn compile ... --engine ray --ray-address auto        # join a running cluster

Each shard task is one row of a Ray Dataset; `map_batches` runs `compile_shard` (the local
engine's function) in `workers` actors that load schema and tokenizer once, and returns the
Parquet bytes, which this driver writes. Shards are therefore byte-identical to the local
engine's. Workers read the input files by path: on a cluster, inputs must sit on storage every
node sees (as for any Ray Data read), and graphattn must be installed on every node.

Without --ray-address a local Ray instance with `workers` CPUs is started and shut down again;
without --workers, every CPU of the instance (or of the cluster joined) gets an actor.
"""

from __future__ import annotations

import logging
import pickle
from typing import Callable, Iterator

import numpy as np

from graphattn.corpus.worker import ShardResult, ShardTask, WorkerState, compile_shard
from graphattn.errors import GraphattnError


class _CompileShards:
    """Ray Data callable class: one per actor, holding the loaded worker state."""

    def __init__(self, state_bytes: bytes):
        self.state: WorkerState = pickle.loads(state_bytes)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = [compile_shard(pickle.loads(task), self.state) for task in batch["task"]]
        return {"index": np.asarray([r.index for r in results], np.int64),
                "result": np.asarray([pickle.dumps(r) for r in results], dtype=object)}


def _start(workers: int | None, address: str | None) -> bool:
    """Connect to Ray; True when this call started the (local) instance and must stop it."""
    try:
        import ray
    except ImportError:
        raise GraphattnError("--engine ray needs Ray: pip install 'graphattn[ray]'") from None
    if ray.is_initialized():
        return False
    quiet = {"include_dashboard": False, "configure_logging": True, "logging_level": logging.WARNING, "log_to_driver": True}
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(num_cpus=workers, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as err:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        raise GraphattnError(f"could not start or join {where}: {err}") from None
    return True


def run_ray(tasks: list[ShardTask], state: WorkerState, workers: int | None, address: str | None,
            progress: Callable[[int, int], None]) -> Iterator[ShardResult]:
    """Compile shard tasks on Ray Data; results as they finish (the driver writes them)."""
    if not tasks:
        return
    started = _start(workers, address)
    import ray

    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        workers = workers or int(ray.cluster_resources().get("CPU", 1))
        actors = max(1, min(workers, len(tasks)))
        items = [{"index": task.index, "task": pickle.dumps(task)} for task in tasks]
        dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            _CompileShards,
            fn_constructor_args=(pickle.dumps(state),),
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=1,
        )
        for batch in dataset.iter_batches(batch_size=1, batch_format="numpy", prefetch_batches=0):
            for blob in batch["result"]:
                result: ShardResult = pickle.loads(blob)
                progress(result.stats["documents"], result.stats["long_tokens"])
                yield result
    finally:
        if started:
            ray.shutdown()
