"""Run by test_corpus_ray_cluster.py in a subprocess of its own: a local two-node Ray cluster
(`ray.cluster_utils.Cluster`, one CPU per node) compiles corpora with the Ray engine, and what
happened is printed as one JSON line. Ray's cluster start and teardown stay out of the pytest
process (an in-process Cluster can crash the process that hosts it).

    python tests/corpus/ray_cluster_run.py WORK_DIR
"""

from __future__ import annotations

import json
import random
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_helpers import TOKENIZER, directory_bytes  # noqa: E402

from graphattn.corpus.output import OutputDir  # noqa: E402
from graphattn.corpus.pipeline import CompileOptions, plan_run, run_compile  # noqa: E402

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
    with out.lock():  # as run_compile holds it (the released lock leaves an empty .graphattn.lock)
        out.start(run.manifest(), False)
        tracemalloc.start()
        written = list(run_ray(run.tasks, run.state, out, 2, None, lambda docs, tokens: None))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out.finish(len(run.tasks))
    return written, peak, options


def main(work: Path, cluster) -> dict:
    import ray

    ray.init(address=cluster.address, include_dashboard=False, logging_level="ERROR")
    written, _, options = _driver_run(work, "ray", 80)
    local = CompileOptions(**{**vars(options), "out": str(work / "local"), "engine": "local", "workers": 2})
    run_compile(local, print_fn=None)
    result = {
        "nodes": len({w.where for w in written}),
        "shards": sorted(w.index for w in written),
        "identical": directory_bytes(work / "ray") == directory_bytes(work / "local"),
        "bytes_returned": any(isinstance(v, (bytes, bytearray)) for w in written for v in vars(w).values()),
    }
    _driver_run(work, "warm", 10, sentences=5)  # the driver's one-time imports and Ray's caches
    _, result["small_peak"], _ = _driver_run(work, "small", 20, sentences=600)
    written, result["large_peak"], _ = _driver_run(work, "large", 100, sentences=600)
    result["large_shard_bytes"] = sum((work / "large" / f"shard-{w.index:05d}.parquet").stat().st_size for w in written)
    return result


if __name__ == "__main__":
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        print(json.dumps(main(Path(sys.argv[1]), cluster)), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()  # and the test ends whatever this process group still holds
