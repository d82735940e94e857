"""The Ray engine on a local two-node cluster (`ray.cluster_utils.Cluster`, one CPU per node):
actors on both nodes write shards into the shared output directory, the bytes equal the local
engine's, and the driver's memory does not grow with the corpus (no shard passes through it).

The cluster runs in a subprocess of its own (`ray_cluster_run.py`, in a new process group that
this test ends), so that Ray's start and teardown never share the test run's process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is the optional graphattn[ray] extra")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster")
    script = Path(__file__).with_name("ray_cluster_run.py")
    process = subprocess.Popen(
        [sys.executable, str(script), str(work)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "RAY_DEDUP_LOGS": "0"},
    )
    try:
        out, err = process.communicate(timeout=600)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # what is left of the cluster this subprocess started
        except ProcessLookupError:
            pass
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        if "could not" in err.lower() or "failed to start" in err.lower():
            pytest.skip(f"a local two-node Ray cluster cannot start on this machine: {err.strip()[-300:]}")
        raise AssertionError(f"the cluster run printed no result (exit {process.returncode}):\n{err[-3000:]}")
    return json.loads(lines[-1])


def test_two_nodes_write_the_local_engines_bytes(cluster_run):
    assert cluster_run["nodes"] == 2, "both nodes wrote shards"
    assert cluster_run["shards"] == list(range(8))
    assert cluster_run["identical"], "the Ray engine's directory equals the local engine's, byte for byte"


def test_the_drivers_memory_does_not_grow_with_the_corpus(cluster_run):
    small, large = cluster_run["small_peak"], cluster_run["large_peak"]
    # Five times the corpus (and megabytes of shards): the driver's Python heap peaks where it did.
    assert large < 1.5 * small + 500_000, (small, large, cluster_run["large_shard_bytes"])
    assert not cluster_run["bytes_returned"]  # counts come back from the actors, never shard bytes
