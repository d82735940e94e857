"""The Ray engine: the same shard tasks, compiled and written by a pool of Ray actors.

    graphattn compile corpus/ --schema hotpotqa --tokenizer tok.json --out shards/ --engine ray --workers 8
    graphattn compile ... --engine ray --ray-address auto        # join a running cluster

`workers` actors (`ShardWriter`, one CPU each) load schema and tokenizer once; a
`ray.util.ActorPool` hands each idle actor the next shard task. An actor reads its shard's
inputs, compiles them and writes the shard and its done-marker into the output directory itself
(atomic renames, as the local engine does), so no shard passes through the driver: the driver
holds the plan and receives each shard's counts. The bytes are the local engine's, since both
run the same function.

Why actors and not Ray Data's `map_batches`: a shard task is one row in and a few counts out, so
Ray Data's streaming executor has nothing to stream, yet it costs, per run, an import of
`ray.data` in the driver and in every actor, three helper actors (stats, autoscaling
coordinator, actor locations; a Python process each) and a scheduling loop that polls ten
times a second. On two cores that was most of the gap to the local engine (docs/RAY.md).

On a cluster the inputs and the output directory must be on storage every node sees under the
same path (NFS, a cluster file system, a mounted bucket), and graphattn must be installed on
every node; see docs/RAY.md. Without --ray-address a local Ray instance with `workers` CPUs is
started and shut down again; without --workers, every CPU of the instance (or of the cluster
joined) gets an actor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from graphattn.corpus.output import OutputDir
from graphattn.corpus.worker import ShardTask, ShardWritten, WorkerState, compile_and_write_shard
from graphattn.errors import GraphattnError

ACTOR_START_TIMEOUT_S = 300  # how long the actor pool may take to start before the run fails

# How the driver connects: no dashboard, Ray's own logs kept to warnings, actors' output shown.
CONNECT_OPTIONS = {
    "include_dashboard": False,
    "configure_logging": True,
    "logging_level": logging.WARNING,
    "log_to_driver": True,
}
# A local instance for one run: no metrics collection, and actors at the driver's priority (Ray's
# default worker niceness is 15: on a machine shared with other work, the actors would yield to
# every process the local engine's workers compete with on equal terms).
LOCAL_SYSTEM_CONFIG = {"enable_metrics_collection": False, "worker_niceness": 0}


class ShardWriter:
    """A Ray actor (made remote in `run_ray`): holds the loaded worker state and the output."""

    def __init__(self, state: WorkerState, out: OutputDir):
        import ray

        self.state = state
        self.out = out
        self.node = ray.get_runtime_context().get_node_id()

    def where(self) -> str:
        """The node this actor runs on; answering it also says the actor has started."""
        return self.node

    def compile_and_write(self, task: ShardTask) -> ShardWritten:
        return compile_and_write_shard(task, self.state, self.out, self.node)


def start_ray(workers: int | None, address: str | None) -> bool:
    """Connect to Ray; True when this call started the (local) instance and must stop it."""
    try:
        import ray
    except ImportError:
        raise GraphattnError("--engine ray needs Ray: pip install 'graphattn[ray]'") from None
    if ray.is_initialized():
        return False
    try:
        if address:
            ray.init(address=address, **CONNECT_OPTIONS)  # the cluster keeps the settings its operator chose
        else:  # a new instance, whatever else runs here
            ray.init(address="local", num_cpus=workers, _system_config=LOCAL_SYSTEM_CONFIG, **CONNECT_OPTIONS)
    except (ConnectionError, RuntimeError, ValueError) as err:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        raise GraphattnError(f"could not start or join {where}: {err}") from None
    return True


def _start_actors(ray, count: int, state: WorkerState, out: OutputDir) -> list:
    """`count` started actors, or a GraphattnError when the cluster cannot host them in time."""
    # No restarts: Ray could not promise them (the state is a constructor argument in the object
    # store, and it warns so on every run); a run whose actor dies stops, and --resume finishes it.
    actor_class = ray.remote(num_cpus=1)(ShardWriter)
    state_ref = ray.put(state)  # one copy in the object store, however many actors read it
    actors = [actor_class.remote(state_ref, OutputDir(out.path.resolve())) for _ in range(count)]
    started, pending = ray.wait(
        [actor.where.remote() for actor in actors], num_returns=count, timeout=ACTOR_START_TIMEOUT_S
    )
    failure = None
    try:
        ray.get(started)  # a constructor's error (graphattn missing or older on a node) surfaces here
    except ray.exceptions.RayError as err:
        failure = f"a Ray actor could not start: {err}"
    if pending and failure is None:
        cpus = int(ray.cluster_resources().get("CPU", 0))
        failure = (
            f"{count} Ray actors (one CPU each) did not start within {ACTOR_START_TIMEOUT_S} s; "
            f"the cluster has {cpus} CPU(s): pass --workers {max(cpus, 1)} or fewer"
        )
    if failure:
        for actor in actors:
            ray.kill(actor)
        raise GraphattnError(failure)
    return actors


def run_ray(
    tasks: list[ShardTask],
    state: WorkerState,
    out: OutputDir,
    workers: int | None,
    address: str | None,
    progress: Callable[[int, int], None],
) -> Iterator[ShardWritten]:
    """Compile and write shard tasks on Ray actors; each shard's counts as it is written."""
    if not tasks:
        return
    started = start_ray(workers, address)
    import ray
    from ray.util import ActorPool

    actors: list = []
    try:
        workers = workers or int(ray.cluster_resources().get("CPU", 1))
        actors = _start_actors(ray, max(1, min(workers, len(tasks))), state, out)
        pool = ActorPool(actors)
        for written in pool.map_unordered(lambda actor, task: actor.compile_and_write.remote(task), tasks):
            progress(written.stats["documents"], written.stats["long_tokens"])
            yield written
    finally:
        for actor in actors:
            ray.kill(actor)  # every shard it wrote is on disk by now, or was never renamed into place
        if started:
            ray.shutdown()
