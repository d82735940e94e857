"""Training memory and speed from shards: `graphattn train --data` over 2,000 vs 20,000 records.

    python benchmarks/train_stream.py            # 2,000 and 20,000 HotpotQA-like records, 30 steps
    python benchmarks/train_stream.py --quick    # 200 and 2,000 records, 10 steps

Generates HotpotQA-like records (benchmarks/corpus.py's generator), compiles each corpus into
shards with `graphattn compile`, then runs `graphattn train --data SHARDS` in a fresh process per
corpus for the same number of steps and reports that process's peak RSS (os.wait4) and its steps
per second. Target: under 10% more peak RSS for 10x the records, since the stream holds one row
group and a fixed shuffle buffer whatever the corpus size (the buffer is sized below the smaller
corpus, min(1024, records / 2), so that it is full in both runs).

Beside it, the raw-record path it replaces (the old `graphattn train --data records.json`): every
record compiled in memory (dense side inputs) before step 1, then batches from that list. It is
run on the smaller corpus only; its memory grows with the records (the larger corpus would need
about 10x of it), and its compile time is paid on every run.

The numbers depend on the machine's load: on a shared machine, say so when quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

TOKENIZER = REPO / "examples" / "data" / "tokenizer.json"
MODEL = [
    "--hidden-size",
    "64",
    "--layers",
    "2",
    "--heads",
    "2",
    "--batch-size",
    "4",
    "--lr",
    "1e-3",
    "--precision",
    "fp32",
]


def measured(command: list[str]) -> tuple[float, str]:
    """Run `command` and report its own peak RSS (MB): wait4 on a child we do not let communicate() reap."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if process.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:4])} ... exited {process.returncode}:\n{err.read()[-2000:]}")
        return usage.ru_maxrss / 1024, out.read()


def compile_corpus(records: int, root: Path) -> Path:
    from corpus import generate

    from graphattn.corpus.pipeline import CompileOptions, run_compile

    source = root / f"records-{records}.jsonl"
    generate(source, records, seed=records)
    out = root / f"shards-{records}"
    started = time.perf_counter()
    run_compile(
        CompileOptions(
            inputs=[str(source)], schema="hotpotqa", out=str(out), tokenizer=str(TOKENIZER), workers=2, progress=False
        ),
        print_fn=None,
    )
    print(f"  compiled {records:,} records in {time.perf_counter() - started:.1f} s", flush=True)
    return out


def train_from_shards(shards: Path, steps: int, root: Path, buffer: int) -> dict:
    run = root / f"run-{shards.name}"
    command = [
        "graphattn",
        "train",
        "--data",
        str(shards),
        "--out",
        str(run),
        "--steps",
        str(steps),
        *MODEL,
        "--buffer-size",
        str(buffer),
        "--no-progress",
        "--seed",
        "0",
    ]
    rss, out = measured(command)
    rate = float(out.rsplit(", ", 1)[-1].split(" steps/s")[0])
    return {"rss_mb": rss, "steps_per_s": rate}


def in_memory_child(records: str, steps: int) -> None:
    """The raw-record path: compile every record into memory, then train from the list."""
    from graphattn.compile import collate, compile_windows
    from graphattn.ingest.formats import read_documents
    from graphattn.nn import EtcConfig, EtcEncoder
    from graphattn.schema import load_schema
    from graphattn.tokenize import load_tokenizer
    from graphattn.train import InstanceLoader, TaskModel, TrainConfig, Trainer

    warnings.simplefilter("ignore")  # answers the generator draws at random match nothing: not what is measured here
    schema, tokenizer = load_schema("hotpotqa"), load_tokenizer(str(TOKENIZER))
    started = time.perf_counter()
    instances = [inst for graph in read_documents(records) for inst in compile_windows(graph, schema, tokenizer)]
    compiled = time.perf_counter() - started
    config = EtcConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        local_radius=schema.local_radius,
        relative_pos_max_distance=schema.relative_pos_max_distance,
        relative_vocab_size=schema.relative_vocab_size,
    )
    model = TaskModel(EtcEncoder(config), schema)
    train = TrainConfig(max_steps=steps, learning_rate=1e-3, precision="fp32", progress=False, seed=0, warmup_ratio=0.1)
    result = Trainer(model, train).fit(InstanceLoader(instances, 4, collate, shuffle=True, seed=0))
    print(
        json.dumps(
            {"steps_per_s": result.steps_run / result.seconds, "compile_s": compiled, "instances": len(instances)}
        )
    )


def train_in_memory(records: Path, steps: int) -> dict:
    rss, out = measured([sys.executable, __file__, "--child-memory", str(records), "--steps", str(steps)])
    return {"rss_mb": rss, **json.loads(out.strip().splitlines()[-1])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 and 2,000 records, 10 steps")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--child-memory", metavar="RECORDS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps = args.steps or (10 if args.quick else 30)
    if args.child_memory:
        in_memory_child(args.child_memory, steps)
        return 0
    small, large = (200, 2000) if args.quick else (2000, 20000)
    buffer = min(1024, small // 2)  # the shuffle buffer fills on both corpora: what is left to grow is the corpus
    print(
        f"load average {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} CPUs; {steps} steps of 4 per run; "
        f"shuffle buffer {buffer} instances",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        shards = {n: compile_corpus(n, root) for n in (small, large)}
        rows = {n: train_from_shards(shards[n], steps, root, buffer) for n in (small, large)}
        memory = train_in_memory(root / f"records-{small}.jsonl", steps)
    growth = rows[large]["rss_mb"] / rows[small]["rss_mb"] - 1
    print("\n| path | records | peak RSS MB | steps/s | compile before step 1 |")
    print("|---|---|---|---|---|")
    for n in (small, large):
        row = rows[n]
        print(
            f"| `graphattn train --data SHARDS` (streamed) | {n:,} | {row['rss_mb']:.0f} | "
            f"{row['steps_per_s']:.2f} | none |"
        )
    print(
        f"| raw records compiled in memory (the path it replaces) | {small:,} | {memory['rss_mb']:.0f} | "
        f"{memory['steps_per_s']:.2f} | {memory['compile_s']:.1f} s for {memory['instances']:,} instances |"
    )
    verdict = "meets" if growth < 0.10 else "misses"
    print(
        f"\npeak RSS grows {growth:+.1%} for {large // small}x the records when streaming from shards "
        f"({verdict} the < 10% target)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
