"""The Ray engine on a local two-node cluster (`ray.cluster_utils.Cluster`, one CPU per node):
actors on both nodes write shards into the shared output directory, the bytes equal the local
engine's, and the driver's memory does not grow with the corpus (no shard passes through it)."""

from __future__ import annotations

import json
import random
import tracemalloc

import pytest

from corpus_helpers import TOKENIZER, directory_bytes
from graphattn.corpus.output import OutputDir
from graphattn.corpus.pipeline import CompileOptions, plan_run, run_compile

ray = pytest.importorskip("ray", reason="Ray is the optional graphattn[ray] extra")
pytest.importorskip("ray.data", reason="Ray Data needs the graphattn[ray] extra (ray[data])")
pytestmark = pytest.mark.slow

WORDS = "river mills towns grain wool stories storms ships bridges harvest markets music lanterns winter".split()


def _corpus(path, documents: int, length: int = 30) -> None:
    """DocGraph records; with many sentences each shard is far larger than its counts (shards keep
    the whole text, and under `tail` only what can be kept is tokenized)."""
    rng = random.Random(documents)
    with path.open("w", encoding="utf-8") as handle:
        for i in range(documents):
            sentences = [
                " ".join(rng.choices(WORDS, k=rng.randint(5, 15))) + "." for _ in range(rng.randint(length, 2 * length))
            ]
            text, nodes, edges = "", [{"id": "doc", "type": "document"}], []
            for s, sentence in enumerate(sentences):
                start = len(text) + (1 if text else 0)
                text += (" " if text else "") + sentence
                nodes.append({"id": f"s{s}", "type": "sentence", "span": [start, len(text)]})
                edges.append({"src": "doc", "relation": "contains", "dst": f"s{s}"})
            nodes[0]["span"] = [0, len(text)]
            handle.write(json.dumps({"doc_id": f"d{i}", "text": text, "nodes": nodes, "edges": edges}) + "\n")


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, include_dashboard=False, logging_level="ERROR")
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"a local two-node Ray cluster cannot start on this machine: {err}")
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _driver_run(tmp_path, name: str, documents: int, sentences: int = 30):
    """Plan in this process, compile on the cluster; (written shards, peak Python memory of the driver)."""
    from graphattn.corpus.ray_engine import run_ray

    data = tmp_path / f"{name}.jsonl"
    _corpus(data, documents, length=sentences)
    options = CompileOptions(
        inputs=[str(data)],
        schema="etc-sentences",
        out=str(tmp_path / name),
        tokenizer=TOKENIZER,
        engine="ray",
        workers=2,
        shard_size=10,
        progress=False,
    )
    run = plan_run(options)
    out = OutputDir(tmp_path / name)
    out.start(run.manifest(), False)
    tracemalloc.start()
    written = list(run_ray(run.tasks, run.state, out, 2, None, lambda docs, tokens: None))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out.finish(len(run.tasks))
    return written, peak, options


def test_two_nodes_write_the_local_engines_bytes(tmp_path, cluster):
    written, _, options = _driver_run(tmp_path, "ray", 80)
    assert len({w.where for w in written}) == 2, "both nodes wrote shards"
    assert sorted(w.index for w in written) == list(range(8))
    local = CompileOptions(**{**vars(options), "out": str(tmp_path / "local"), "engine": "local", "workers": 2})
    run_compile(local, print_fn=None)
    assert directory_bytes(tmp_path / "ray") == directory_bytes(tmp_path / "local")


def test_the_drivers_memory_does_not_grow_with_the_corpus(tmp_path, cluster):
    _driver_run(tmp_path, "warm", 10, sentences=5)  # Ray Data's one-time imports and caches
    _, small, _ = _driver_run(tmp_path, "small", 20, sentences=600)
    written, large, _ = _driver_run(tmp_path, "large", 100, sentences=600)
    shard_bytes = sum((tmp_path / "large" / f"shard-{w.index:05d}.parquet").stat().st_size for w in written)
    print(f"driver peak: {small:,} B for 20 documents, {large:,} B for 100 ({shard_bytes:,} B of shards)")
    assert large < 1.5 * small + 500_000, (small, large)  # five times the corpus and the shards, the same driver
    assert all(not isinstance(v, (bytes, bytearray)) for w in written for v in vars(w).values())  # counts, never bytes
