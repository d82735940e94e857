"""The Ray Data engine: the same shard tasks, compiled and written by a pool of Ray actors.

    graphattn compile corpus/ --schema hotpotqa --tokenizer tok.json --out shards/ --engine ray --workers 8
    graphattn compile ... --engine ray --ray-address auto        # join a running cluster

Each shard task is one row of a Ray Dataset; `map_batches` runs `compile_and_write_shard` in
`workers` actors that load schema and tokenizer once. An actor reads its shard's inputs, compiles
them and writes the shard and its done-marker into the output directory itself (atomic renames,
as the local engine does), so no shard passes through the driver: the driver holds the plan and
receives each shard's counts. The bytes are the local engine's, since both run the same function.

On a cluster the inputs and the output directory must be on storage every node sees under the
same path (NFS, a cluster file system, a mounted bucket), and graphattn must be installed on
every node; see docs/RAY.md. Without --ray-address a local Ray instance with `workers` CPUs is
started and shut down again; without --workers, every CPU of the instance (or of the cluster
joined) gets an actor.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Callable, Iterator

import numpy as np

from graphattn.corpus.output import OutputDir
from graphattn.corpus.worker import ShardTask, ShardWritten, WorkerState, compile_and_write_shard
from graphattn.errors import GraphattnError

ACTOR_START_TIMEOUT_S = 300  # how long the actor pool may take to start before the run fails


class _CompileShards:
    """Ray Data callable class: one per actor, holding the loaded worker state and the output."""

    def __init__(self, state_bytes: bytes, out: OutputDir):
        import ray

        self.state: WorkerState = pickle.loads(state_bytes)
        self.out = out
        self.node = ray.get_runtime_context().get_node_id()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        done = [compile_and_write_shard(pickle.loads(task), self.state, self.out, self.node) for task in batch["task"]]
        return {
            "index": np.asarray([d.index for d in done], np.int64),
            "stats": np.asarray([json.dumps(d.stats) for d in done], dtype=object),
            "where": np.asarray([d.where for d in done], dtype=object),
            "cpu_seconds": np.asarray([d.cpu_seconds for d in done], np.float64),
        }


def _start(workers: int | None, address: str | None) -> bool:
    """Connect to Ray; True when this call started the (local) instance and must stop it."""
    try:
        import ray
    except ImportError:
        raise GraphattnError("--engine ray needs Ray: pip install 'graphattn[ray]'") from None
    if ray.is_initialized():
        return False
    quiet = {
        "include_dashboard": False,
        "configure_logging": True,
        "logging_level": logging.WARNING,
        "log_to_driver": True,
    }
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(address="local", num_cpus=workers, **quiet)  # a new instance, whatever else runs here
    except (ConnectionError, RuntimeError, ValueError) as err:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        raise GraphattnError(f"could not start or join {where}: {err}") from None
    return True


def run_ray(
    tasks: list[ShardTask],
    state: WorkerState,
    out: OutputDir,
    workers: int | None,
    address: str | None,
    progress: Callable[[int, int], None],
) -> Iterator[ShardWritten]:
    """Compile and write shard tasks on Ray Data; each shard's counts as it is written."""
    if not tasks:
        return
    started = _start(workers, address)
    import ray

    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        # every actor up before shards go out, so that all workers get some
        context.wait_for_min_actors_s = ACTOR_START_TIMEOUT_S
        workers = workers or int(ray.cluster_resources().get("CPU", 1))
        actors = max(1, min(workers, len(tasks)))
        items = [{"task": pickle.dumps(task)} for task in tasks]
        dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            _CompileShards,
            fn_constructor_args=(pickle.dumps(state), OutputDir(out.path.resolve())),
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=1,
        )
        try:
            for batch in dataset.iter_batches(batch_size=1, batch_format="numpy", prefetch_batches=0):
                for index, stats, where, cpu in zip(
                    batch["index"], batch["stats"], batch["where"], batch["cpu_seconds"]
                ):
                    written = ShardWritten(int(index), json.loads(stats), str(where), float(cpu))
                    progress(written.stats["documents"], written.stats["long_tokens"])
                    yield written
        except ray.exceptions.GetTimeoutError:
            cpus = int(ray.cluster_resources().get("CPU", 0))
            raise GraphattnError(
                f"{actors} Ray actors (one CPU each) did not start within {ACTOR_START_TIMEOUT_S} s; "
                f"the cluster has {cpus} CPU(s): pass --workers {max(cpus, 1)} or fewer"
            ) from None
    finally:
        if started:
            ray.shutdown()
