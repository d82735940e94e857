"""Corpus compile throughput and shard size: 1 and 2 local workers and the Ray engine, beside tokenizers.

    python benchmarks/corpus.py            # 2,000 HotpotQA-like documents
    python benchmarks/corpus.py --quick    # 400 documents
    python benchmarks/corpus.py --profile  # and the top entries of a one-worker profile

Generates documents in HotpotQA's JSON layout (question, 10 paragraphs of titled sentences),
compiles them with schemas/hotpotqa.yaml (etc-sentences if it is missing) and the project's
tokenizer, and prints docs/s and tokens/s per engine beside the peer measured in the same run:
HF `tokenizers` encoding the same texts one by one (`Tokenizer.encode`, what a tokenize-only
pipeline pays; docs/DESIGN.md §9: compiling should cost no more than tokenizing), and the floor
under any compile to shards: reading the same JSON lines, encoding each record's text and writing
the token ids with the project's Parquet writer (no graph, no side inputs). Everything is
pinned to one thread per process (RAYON_NUM_THREADS=1, one torch thread) so that ratios compare
work, not cores. CPU seconds per run show whether the work grows with workers, which wall-clock
time on a loaded machine cannot. Shard size is given in bytes per long token, split into the
token-id column and everything else (target: <= 4 bytes per long token besides the token ids),
beside what the eight dense int32 side inputs would take.

Targets (#16): one worker >= 0.8x the tokenizers peer; 2 workers >= 1.7x one worker; the Ray
engine with 2 workers >= 0.9x the local engine with 2 workers (Ray's start-up reported apart).
For the Ray row the CPU seconds of every process Ray started (raylet, gcs_server, its agents,
the actors) are read from /proc before, during and after the run, so that what Ray's own
processes take from the cores is printed beside what its actors spend compiling.
The numbers depend on the machine's load: on a shared machine, say so when quoting them.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import os
import pstats
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before tokenizers loads: one thread, inherited by workers
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graphattn.compile.compiler import BATCH_SIZE  # noqa: E402
from graphattn.corpus.pipeline import CompileOptions, run_compile  # noqa: E402
from graphattn.schema import SCHEMA_DIR, load_schema  # noqa: E402

TOKENIZER = REPO / "examples" / "data" / "tokenizer.json"


def generate(path: Path, documents: int, seed: int = 0) -> list[str]:
    """HotpotQA-like records as JSON lines; returns their texts for the tokenizer peer."""
    words = (REPO / "examples" / "data" / "corpus.txt").read_text(encoding="utf-8").split()
    rng = random.Random(seed)
    sentence = lambda: " ".join(rng.choice(words) for _ in range(rng.randint(8, 25))) + "."  # noqa: E731
    texts = []
    with path.open("w", encoding="utf-8") as handle:
        for i in range(documents):
            context = [
                [
                    " ".join(rng.choice(words) for _ in range(rng.randint(1, 4))),
                    [sentence() for _ in range(rng.randint(2, 6))],
                ]
                for _ in range(10)
            ]
            record = {
                "_id": f"bench{i}",
                "question": " ".join(rng.choice(words) for _ in range(rng.randint(8, 16))) + "?",
                "answer": rng.choice(words),
                "type": "bridge",
                "level": "medium",
                "context": context,
                "supporting_facts": [[context[0][0], 0], [context[3][0], 1]],
            }
            handle.write(json.dumps(record) + "\n")
            texts.append(record_text(record))
    return texts


def record_text(record: dict) -> str:
    """The text of a record as the peers encode it: the question, then each title and its sentences."""
    return "\n\n".join([record["question"]] + [title + "\n" + " ".join(s) for title, s in record["context"]])


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the local engine's workers)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def process_cpu() -> dict[int, tuple[str, float]]:
    """{pid: (name, CPU seconds so far)} of every process below this one (Linux /proc; {} elsewhere):
    when Ray was started from here, its raylet, gcs_server, agents and actors."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parents, names, cpu = {}, {}, {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_text().split("\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        parents[pid], cpu[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
        script = next((a for a in argv[1:3] if a.endswith(".py")), None)  # Ray's Python daemons
        names[pid] = argv[0] if argv[0].startswith("ray::") else Path(script or argv[0]).name
    below, frontier = {}, [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in below:
                below[pid] = (names[pid], cpu[pid])
                frontier.append(pid)
    return below


def cpu_by_name(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds spent between two `process_cpu` snapshots, summed per process name."""
    spent: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        spent[name] = spent.get(name, 0.0) + cpu - before.get(pid, (name, 0.0))[1]
    return spent


def ray_cpu_line(label: str, spent: dict[str, float], driver: float) -> str:
    """'actors 4.1 s; Ray's own 0.3 s (raylet 0.1, ...); driver 0.2 s' for one window of the Ray run."""
    actors = sum(cpu for name, cpu in spent.items() if name.startswith("ray::ShardWriter"))
    own = {name: cpu for name, cpu in spent.items() if not name.startswith("ray::ShardWriter") and cpu >= 0.005}
    detail = ", ".join(f"{name} {cpu:.2f}" for name, cpu in sorted(own.items(), key=lambda item: -item[1]))
    total = sum(own.values())
    return f"  {label}: actors {actors:.2f} s; Ray's own processes {total:.2f} s ({detail}); driver {driver:.2f} s"


def tokenizer_peer(texts: list[str]) -> tuple[float, float]:
    """(seconds, CPU seconds) HF tokenizers takes to encode the texts one by one in one thread
    (best of two each)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    runs, cpus = [], []
    for _ in range(2):
        start, cpu = time.perf_counter(), time.process_time()
        for text in texts:
            tokenizer.encode(text, add_special_tokens=False)
        runs.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return min(runs), min(cpus)


def read_tokenize_write_peer(data: Path, out: Path, shard_size: int) -> tuple[float, float]:
    """(seconds, CPU seconds) of the least any compile to shards does, best of two: read the JSON
    lines, encode the records' texts (`Tokenizer.encode_batch`, `BATCH_SIZE` at a time as the
    compiler does, one thread) and write the token ids as Parquet shards of `shard_size` records
    with the project's writer (same row groups and compression, atomic rename). No graph, no side
    inputs: the floor under the one-worker row."""
    from tokenizers import Tokenizer

    from graphattn.shards.format import encode_shard, write_atomic

    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    out.mkdir(exist_ok=True)
    runs, cpus = [], []
    for _ in range(2):
        start, cpu = time.perf_counter(), time.process_time()
        with data.open(encoding="utf-8") as handle:
            lines = iter(handle)
            for shard in itertools.count():
                batch = [json.loads(line) for line in itertools.islice(lines, shard_size)]
                if not batch:
                    break
                texts = [record_text(record) for record in batch]
                encodings = [
                    encoding
                    for k in range(0, len(texts), BATCH_SIZE)  # as the compiler's tokenizer calls are
                    for encoding in tokenizer.encode_batch(texts[k : k + BATCH_SIZE], add_special_tokens=False)
                ]
                ids = [np.array(encoding.ids, np.int32) for encoding in encodings]
                offsets = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int32)
                column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(ids)))
                write_atomic(str(out / f"floor-{shard:05d}.parquet"), encode_shard(pa.table({"ids": column}), {}))
        runs.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return min(runs), min(cpus)


def steady_state(stamps: list[tuple[float, int]], workers: int) -> tuple[float, float]:
    """(docs/s after the first wave of `workers` shards, when that wave ended): throughput apart
    from start-up (process or actor start, loading schema and tokenizer)."""
    stamps = sorted(stamps)
    if len(stamps) <= workers:
        return (sum(d for _, d in stamps) / stamps[-1][0] if stamps else 0.0), (stamps[-1][0] if stamps else 0.0)
    first = stamps[workers - 1][0]
    later = sum(d for _, d in stamps[workers:])
    return later / max(stamps[-1][0] - first, 1e-9), first


def one_thread() -> None:
    """One torch thread (RAYON_NUM_THREADS is set before tokenizers loads)."""
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


def profile_one_worker(data: Path, schema: str, shard_size: int, out: Path) -> str:
    """The top entries of a profile of the local engine with one worker (this process)."""
    profile = cProfile.Profile()
    profile.runcall(
        run_compile,
        CompileOptions(
            inputs=[str(data)],
            schema=schema,
            out=str(out),
            tokenizer=str(TOKENIZER),
            workers=1,
            shard_size=shard_size,
            progress=False,
        ),
        print_fn=None,
    )
    stream = io.StringIO()
    pstats.Stats(profile, stream=stream).sort_stats("tottime").print_stats(20)
    return "\n".join(line for line in stream.getvalue().splitlines() if line.strip())


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
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray engine")
    parser.add_argument("--profile", action="store_true", help="print the top entries of a one-worker profile")
    args = parser.parse_args(argv)
    one_thread()
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
                import ray  # noqa: F401

                runs.append(("ray, 2 workers", "ray", 2))
            except ImportError as err:
                print(f"(ray skipped: {err})")
        peer, peer_cpu = tokenizer_peer(texts)
        floor, floor_cpu = read_tokenize_write_peer(data, tmp / "floor", shard_size)
        if args.profile:
            profiled = profile_one_worker(data, schema, max(1, documents // 8), tmp / "profiled")
        rows: list = []
        outputs = []
        steady = {}
        ray_windows: dict[str, tuple[dict, float]] = {}  # Ray run: CPU per process in the whole run, steady state
        for label, engine, workers in runs:
            out = tmp / f"out-{engine}-{workers}"
            if engine == "ray":  # started here, after the local rows, so that its daemons idle through none of them
                from graphattn.corpus.ray_engine import start_ray

                start = time.perf_counter()
                start_ray(workers, None)
                ray_startup = time.perf_counter() - start
            before = cpu_seconds()
            stamps: list[tuple[float, int]] = []
            actor_cpu: list[float] = []
            snapshots = {"start": (process_cpu(), cpu_seconds())} if engine == "ray" else {}

            started = time.perf_counter()

            def on_shard(
                written, stamps=stamps, actor_cpu=actor_cpu, started=started, snapshots=snapshots, workers=workers
            ):
                stamps.append((time.perf_counter() - started, written.stats["documents"]))
                actor_cpu.append(written.cpu_seconds or 0.0)
                if snapshots:  # the actors are gone once the run returns: read them at each shard
                    snapshots["first wave" if len(stamps) == workers else "last"] = (process_cpu(), cpu_seconds())

            summary = run_compile(
                CompileOptions(
                    inputs=[str(data)],
                    schema=schema,
                    out=str(out),
                    tokenizer=str(TOKENIZER),
                    workers=workers,
                    engine=engine,
                    shard_size=shard_size,
                    progress=False,
                ),
                print_fn=None,
                on_shard=on_shard,
            )
            cpu = cpu_seconds() - before
            if snapshots:
                (start_procs, start_cpu), (last_procs, last_cpu) = snapshots["start"], snapshots["last"]
                wave_procs, wave_cpu = snapshots.get("first wave", snapshots["start"])
                ray_windows["whole run"] = (cpu_by_name(start_procs, last_procs), last_cpu - start_cpu)
                ray_windows["steady state"] = (cpu_by_name(wave_procs, last_procs), last_cpu - wave_cpu)
                spent, driver = ray_windows["whole run"]
                cpu = driver + sum(spent.values()) if last_procs else sum(actor_cpu)  # no /proc: compile time only
            rows.append((label, summary, cpu))
            outputs.append(out)
            steady[label] = steady_state(stamps, workers)
        if ray_startup is not None:
            import ray

            ray.shutdown()

        base = rows[0][1].seconds
        print(
            f"corpus compile: {documents:,} HotpotQA-like documents, schema {schema}, shards of {shard_size} "
            f"documents; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (a shared machine: "
            "wall-clock figures are indicative)"
        )
        print(
            f"{'engine':<22}{'seconds':>9}{'docs/s':>10}{'tokens/s':>12}{'vs 1 worker':>13}{'vs peer':>9}{'cpu s':>8}"
        )
        for label, s, cpu in rows:
            cpu_text = f"{cpu:>8.2f}" if cpu is not None else f"{'n/a':>8}"
            print(
                f"{label:<22}{s.seconds:>9.2f}{s.documents / s.seconds:>10,.1f}{s.long_tokens / s.seconds:>12,.0f}"
                f"{base / s.seconds:>12.2f}x{peer / s.seconds:>8.2f}x{cpu_text}"
            )
        tokens = rows[0][1].long_tokens
        print(
            f"{'peer: HF tokenizers':<22}{peer:>9.2f}{documents / peer:>10,.1f}{tokens / peer:>12,.0f}"
            f"{base / peer:>12.2f}x{1:>8.2f}x   (Tokenizer.encode of the same texts one by one, one thread)"
        )
        print(
            f"{'peer: read+encode+write':<22}{floor:>9.2f}{documents / floor:>10,.1f}{tokens / floor:>12,.0f}"
            f"{base / floor:>12.2f}x{peer / floor:>8.2f}x{floor_cpu:>8.2f}   (the same texts from the JSON lines, "
            "token ids written as shards: no graph, no side inputs)"
        )
        if ray_startup is not None:
            print(f"ray startup (ray.init, not in the ray row): {ray_startup:.1f} s")
        if ray_windows:
            print("CPU seconds during the Ray run, per process (from /proc):")
            for window, (spent, driver) in ray_windows.items():
                print(ray_cpu_line(window, spent, driver))
        print(
            "steady state (shards after each worker's first, which carries its start-up): "
            + "; ".join(
                f"{label} {rate:,.1f} docs/s, first wave {first:.1f} s" for label, (rate, first) in steady.items()
            )
        )
        total, ids = shard_bytes(outputs[0])
        radius = load_schema(schema).local_radius
        print(
            f"shards: {total / 1e6:.2f} MB for {tokens:,} long tokens = {total / tokens:.2f} bytes/token "
            f"(token ids {ids / tokens:.2f}, everything else {(total - ids) / tokens:.2f}; target <= 4.00)"
        )
        dense = dense_bytes_per_token(outputs[0], radius)
        print(
            f"peer: the eight dense int32 side inputs alone would take {dense:,.0f} bytes/token "
            f"({dense / (total / tokens):,.0f}x the shards)"
        )
        same = all(
            sorted(p.name for p in o.iterdir()) == sorted(p.name for p in outputs[0].iterdir())
            and all((o / p.name).read_bytes() == p.read_bytes() for p in outputs[0].iterdir())
            for o in outputs[1:]
        )
        print(f"byte-identical outputs across engines and worker counts: {'yes' if same else 'NO'}")
        cpu_one, cpu_two = rows[0][2], rows[1][2]
        print(
            f"cpu s = driver + worker processes (Ray: driver, actors and Ray's own processes): 2 workers spend "
            f"{cpu_two / cpu_one:.2f}x the CPU of one, so on two idle cores they would approach "
            f"{min(2.0, 2 * cpu_one / cpu_two):.2f}x"
            + (
                f"; the Ray run spends {rows[2][2] / cpu_two:.2f}x the CPU of the 2 local workers"
                if len(rows) > 2
                else ""
            )
        )
        speedup = base / rows[1][1].seconds
        met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
        print(
            f"target 2 workers >= 1.7x one worker: {speedup:.2f}x -> {met(speedup >= 1.7)}; "
            f"shards <= 4 bytes/token besides ids: {(total - ids) / tokens:.2f} -> {met((total - ids) / tokens <= 4)}"
        )
        print(
            f"target one worker >= 0.8x the tokenizers peer: {peer / base:.2f}x -> {met(peer / base >= 0.8)} "
            f"(in CPU seconds, which the machine's other work and its hour disturb less: {peer_cpu:.2f} s for "
            f"the peer against {rows[0][2]:.2f} s for the one-worker run, {peer_cpu / rows[0][2]:.2f}x)"
        )
        print(
            f"floor: reading the records and writing the token ids already take the pipeline to "
            f"{peer_cpu / floor_cpu:.2f}x the tokenizers peer in CPU seconds; the one-worker compile runs at "
            f"{floor_cpu / rows[0][2]:.2f}x that floor"
        )
        if len(rows) > 2:
            ray_ratio = rows[1][1].seconds / rows[2][1].seconds
            ray_steady = steady[rows[2][0]][0] / max(steady[rows[1][0]][0], 1e-9)
            print(
                f"target ray 2 workers >= 0.9x local 2 workers: {ray_ratio:.2f}x end to end (actor start-up "
                f"included), {ray_steady:.2f}x in the steady state -> {met(ray_steady >= 0.9)}"
            )
        if args.profile:
            print("\nprofile of the local engine, one worker (top 20 by own time):")
            print(profiled)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
