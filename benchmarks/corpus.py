"""Corpus compile throughput and shard size: 1 and 2 local workers, and Ray Data.

    python benchmarks/corpus.py            # 2,000 HotpotQA-like documents
    python benchmarks/corpus.py --quick    # 400 documents

Generates documents in HotpotQA's JSON layout (question, 10 paragraphs of titled sentences),
compiles them with schemas/hotpotqa.yaml (etc-sentences if it is missing) and the project's
tokenizer, and prints docs/s and tokens/s per engine beside a peer measured in the same run:
HF `tokenizers` encoding the same texts one by one in one thread, as a worker does (docs/DESIGN.md §9:
compiling should cost no more than tokenizing). CPU seconds per run show whether the work grows
with workers, which wall-clock time on a loaded machine cannot. Shard size is given in bytes per long token, split into the token-id column and
everything else (target: <= 4 bytes per long token besides the token ids), beside what the
eight dense int32 side inputs would take. Targets: 2 workers >= 1.7x one worker.

The numbers depend on the machine's load: on a shared machine, say so when quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graphattn.corpus.pipeline import CompileOptions, run_compile  # noqa: E402
from graphattn.schema import SCHEMA_DIR, load_schema  # noqa: E402
from graphattn.tokenize import load_tokenizer  # noqa: E402

TOKENIZER = REPO / "examples" / "data" / "tokenizer.json"


def generate(path: Path, documents: int, seed: int = 0) -> list[str]:
    """HotpotQA-like records as JSON lines; returns their texts for the tokenizer peer."""
    words = (REPO / "examples" / "data" / "corpus.txt").read_text(encoding="utf-8").split()
    rng = random.Random(seed)
    sentence = lambda: " ".join(rng.choice(words) for _ in range(rng.randint(8, 25))) + "."  # noqa: E731
    texts = []
    with path.open("w", encoding="utf-8") as handle:
        for i in range(documents):
            context = [[" ".join(rng.choice(words) for _ in range(rng.randint(1, 4))),
                        [sentence() for _ in range(rng.randint(2, 6))]] for _ in range(10)]
            record = {"_id": f"bench{i}", "question": " ".join(rng.choice(words) for _ in range(rng.randint(8, 16))) + "?",
                      "answer": rng.choice(words), "type": "bridge", "level": "medium", "context": context,
                      "supporting_facts": [[context[0][0], 0], [context[3][0], 1]]}
            handle.write(json.dumps(record) + "\n")
            texts.append("\n\n".join([record["question"]] + [t + "\n" + " ".join(s) for t, s in context]))
    return texts


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the local engine's workers)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def tokenizer_peer(texts: list[str]) -> float:
    """Seconds HF tokenizers takes to encode the texts one by one in one thread (as one worker does)."""
    tokenizer = load_tokenizer(str(TOKENIZER))
    start = time.perf_counter()
    for text in texts:
        tokenizer.encode(text)
    return time.perf_counter() - start


def shard_bytes(out: Path) -> tuple[int, int]:
    """(all shard bytes, bytes of the long_token_ids column chunks)."""
    total = ids = 0
    for path in sorted(out.glob("*.parquet")):
        total += path.stat().st_size
        meta = pq.ParquetFile(path).metadata
        for rg in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                column = meta.row_group(rg).column(c)
                if column.path_in_schema.startswith("long_token_ids."):
                    ids += column.total_compressed_size
    return total, ids


def dense_bytes_per_token(out: Path, radius: int) -> float:
    """What the eight dense int32 side inputs of these instances would take per long token."""
    total = tokens = 0
    for path in sorted(out.glob("*.parquet")):
        table = pq.read_table(path, columns=["long_length", "global_length"])
        for L, G in zip(table.column("long_length").to_pylist(), table.column("global_length").to_pylist()):
            total += 4 * (2 * L * (2 * radius + 1) + 2 * G * G + 4 * L * G)  # l2l, g2g, l2g + g2l: mask and ids
            tokens += L
    return total / max(tokens, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="400 documents instead of 2,000")
    parser.add_argument("--documents", type=int, help="number of documents (overrides --quick)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray Data engine")
    args = parser.parse_args(argv)
    documents = args.documents or (400 if args.quick else 2000)
    schema = "hotpotqa" if (SCHEMA_DIR / "hotpotqa.yaml").is_file() else "etc-sentences"

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "hotpot.jsonl"
        texts = generate(data, documents)
        shard_size = max(1, documents // 8)
        runs = [("local, 1 worker", "local", 1), ("local, 2 workers", "local", 2)]
        ray_startup = None
        if not args.no_ray:
            try:
                import ray

                start = time.perf_counter()
                ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
                ray_startup = time.perf_counter() - start
                runs.append(("ray data, 2 workers", "ray", 2))
            except Exception as err:  # noqa: BLE001 - the table says why Ray is missing
                print(f"(ray skipped: {err})")
        peer = tokenizer_peer(texts)
        rows: list = []
        outputs = []
        for label, engine, workers in runs:
            out = tmp / f"out-{engine}-{workers}"
            before = cpu_seconds()
            summary = run_compile(CompileOptions(inputs=[str(data)], schema=schema, out=str(out), tokenizer=str(TOKENIZER),
                                                 workers=workers, engine=engine, shard_size=shard_size, progress=False), print_fn=None)
            rows.append((label, summary, cpu_seconds() - before if engine == "local" else None))
            outputs.append(out)
        if ray_startup is not None:
            import ray

            ray.shutdown()

        base = rows[0][1].seconds
        print(f"corpus compile: {documents:,} HotpotQA-like documents, schema {schema}, shards of {shard_size} documents; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (a shared machine: wall-clock figures are indicative)")
        print(f"{'engine':<22}{'seconds':>9}{'docs/s':>10}{'tokens/s':>12}{'vs 1 worker':>13}{'cpu s':>8}")
        for label, s, cpu in rows:
            cpu_text = f"{cpu:>8.2f}" if cpu is not None else f"{'n/a':>8}"
            print(f"{label:<22}{s.seconds:>9.2f}{s.documents / s.seconds:>10,.1f}{s.long_tokens / s.seconds:>12,.0f}"
                  f"{base / s.seconds:>12.2f}x{cpu_text}")
        tokens = rows[0][1].long_tokens
        print(f"{'peer: HF tokenizers':<22}{peer:>9.2f}{documents / peer:>10,.1f}{tokens / peer:>12,.0f}{base / peer:>12.2f}x"
              "   (encode of the same texts, one thread)")
        if ray_startup is not None:
            print(f"ray startup (not in the ray row): {ray_startup:.1f} s")
        total, ids = shard_bytes(outputs[0])
        radius = load_schema(schema).local_radius
        print(f"shards: {total / 1e6:.2f} MB for {tokens:,} long tokens = {total / tokens:.2f} bytes/token "
              f"(token ids {ids / tokens:.2f}, everything else {(total - ids) / tokens:.2f}; target <= 4.00)")
        dense = dense_bytes_per_token(outputs[0], radius)
        print(f"peer: the eight dense int32 side inputs alone would take {dense:,.0f} bytes/token ({dense / (total / tokens):,.0f}x the shards)")
        same = all(sorted(p.name for p in o.iterdir()) == sorted(p.name for p in outputs[0].iterdir()) and
                   all((o / p.name).read_bytes() == p.read_bytes() for p in outputs[0].iterdir()) for o in outputs[1:])
        print(f"byte-identical outputs across engines and worker counts: {'yes' if same else 'NO'}")
        cpu_one, cpu_two = rows[0][2], rows[1][2]
        print(f"cpu s = driver + worker processes (Ray actors not counted): 2 workers spend {cpu_two / cpu_one:.2f}x the CPU "
              f"of one, so on two idle cores they would approach {min(2.0, 2 * cpu_one / cpu_two):.2f}x")
        speedup = base / rows[1][1].seconds
        print(f"target 2 workers >= 1.7x one worker: {speedup:.2f}x -> {'met' if speedup >= 1.7 else 'NOT met'}; "
              f"shards <= 4 bytes/token besides ids: {(total - ids) / tokens:.2f} -> {'met' if (total - ids) / tokens <= 4 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
