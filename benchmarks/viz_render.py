"""Time drawing a compiled instance: ours beside the plain matplotlib way, same run, same input.

    python benchmarks/viz_render.py [--quick] [--sentences 256] [--words 15] [--long-tokens 262144 --long-globals 20000]

Part 1, a real compile: a generated document of `--sentences` sentences of `--words` words and a
period each (the spaCy word tokenizer, so 256 x 16 = 4096 long tokens and 256 globals under the
shipped `etc-sentences` schema, radius 84), compiled dense and compact.
Peer, on the same instance:
  dense-imshow  materialize the whole [G+L, G+L] label grid (band unrolled, numpy, vectorized)
                and imshow it one pixel per pair: what one writes with matplotlib directly.
Rows are wall-clock seconds (best of --repeat), ratios are peer / ours where a peer exists.

Part 2, a long input the way a user draws it: a generated document of `--long-tokens` tokens in
`--long-globals` sentences is compiled by `graphattn compile` into a shard, then
`graphattn viz SHARD --out x.png` and `--out x.html` each run in a process of their own; the
table gives their wall-clock time and peak RSS (the target: under 30 s and 2 GB each). The
dense l2g of that instance alone would be 5.2e9 pairs (21 GB as int32).
Numbers on a shared machine are noisy: read the ratios, and `uptime`'s load printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphattn.compile import compile_instance  # noqa: E402
from graphattn.ingest.text import text_to_graph  # noqa: E402
from graphattn.viz.blocks import block_summary  # noqa: E402
from graphattn.viz.html import write_viewer  # noqa: E402
from graphattn.viz.palette import BACKGROUND, label_colors  # noqa: E402
from graphattn.viz.pattern import AxisRange, Pattern  # noqa: E402
from graphattn.viz.picture import render  # noqa: E402
from graphattn.viz.terminal import terminal_view  # noqa: E402

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def make_instance(sentences: int, words: int, compact: bool):
    sentence = " ".join(WORDS[i % len(WORDS)] for i in range(words)) + "."
    graph = text_to_graph(" ".join([sentence] * sentences), doc_id="bench")
    return compile_instance(graph, "etc-sentences", "spacy:en", compact=compact)


def dense_imshow(instance, path: Path) -> None:
    """The peer: the full grid in memory, then one imshow pixel per pair."""
    pattern = Pattern(instance)
    full = pattern.full_range()
    grid = pattern.labels(full, full)  # [N, N]: what the block summary avoids
    image = np.vstack([label_colors(pattern.vocab), BACKGROUND])[grid]
    figure = Figure(figsize=(10, 10), dpi=100)
    FigureCanvasAgg(figure)
    figure.add_subplot().imshow(image, interpolation="nearest")
    figure.savefig(path)


def long_document(tokens: int, sentences: int) -> dict:
    """A DocGraph dict: one document of `sentences` sentences, `tokens` wordpieces in all under the
    default tokenizer (words that are one piece each, and a period per sentence)."""
    from graphattn.tokenize import load_tokenizer

    tokenizer = load_tokenizer("default")
    one_piece = lambda w: w.isalpha() and len(w) > 2 and len(tokenizer.encode(w)) == 1  # noqa: E731
    vocab = sorted(filter(one_piece, tokenizer.tokenizer.get_vocab()))
    rng = np.random.default_rng(0)
    per, extra = divmod(tokens, sentences)
    texts, nodes, position = [], [], 0
    for s in range(sentences):
        words = " ".join(vocab[i] for i in rng.integers(0, len(vocab), per - 1 + (s < extra))) + "."
        start = position + (1 if s else 0)
        nodes.append({"id": f"s{s}", "type": "sentence", "span": [start, start + len(words)]})
        texts.append(words)
        position = start + len(words)
    text = " ".join(texts)
    document = {"id": "doc", "type": "document", "span": [0, len(text)]}
    edges = [{"src": "doc", "relation": "contains", "dst": n["id"]} for n in nodes]
    return {"doc_id": "long", "text": text, "nodes": [document, *nodes], "edges": edges}


# Runs `graphattn` in a child and writes the child's own peak RSS to the file named by its first
# argument. VmHWM is per address space, so unlike ru_maxrss it does not start at the size of the
# process that spawned the child (this benchmark, which holds part 1's instances).
CHILD = """
import resource, sys
from graphattn.cli import main
code = main(sys.argv[2:])
try:
    peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
except (OSError, StopIteration):
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
open(sys.argv[1], "w").write(str(peak_kb))
sys.exit(code)
"""


def timed_command(argv: list[str], out: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one `graphattn` command in a process of its own."""
    peak_file = out / "peak-rss-kb"
    start = time.perf_counter()
    child = [sys.executable, "-c", CHILD, str(peak_file), *argv]
    proc = subprocess.run(child, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"graphattn {' '.join(argv)} failed: {proc.stderr.decode()}")
    return seconds, int(peak_file.read_text()) / 1024


def long_input(out: Path, tokens: int, sentences: int) -> list[tuple[str, float, float]]:
    """Part 2: compile the long document to a shard, then draw it as PNG and as HTML."""
    import yaml

    from graphattn.schema import SCHEMA_DIR

    schema = yaml.safe_load((SCHEMA_DIR / "etc-sentences.yaml").read_text())
    schema.update(name="etc-sentences-long", max_long_length=tokens, max_global_length=sentences)
    (out / "long.yaml").write_text(yaml.safe_dump(schema))
    (out / "long.json").write_text(json.dumps(long_document(tokens, sentences)))
    long_json, long_yaml, shards = (str(out / name) for name in ("long.json", "long.yaml", "shards"))
    compile_argv = ["compile", long_json, "--schema", long_yaml, "-q", "--out", shards]
    rows = [("graphattn compile (setup)", *timed_command(compile_argv, out))]
    shard = str(out / "shards" / "shard-00000.parquet")
    for suffix in ("png", "html"):
        viz_argv = ["viz", shard, "--out", str(out / f"long.{suffix}"), "-q"]
        rows.append((f"graphattn viz -> .{suffix}", *timed_command(viz_argv, out)))
    return rows


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, no SVG")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--words", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--long-tokens", type=int, default=262_144, help="part 2: long tokens (0: skip part 2)")
    parser.add_argument("--long-globals", type=int, default=20_000, help="part 2: sentence globals")
    args = parser.parse_args()
    repeat = 1 if args.quick else args.repeat
    out = Path(tempfile.mkdtemp(prefix="graphattn-viz-bench-"))

    rows = []
    for kind in ("dense", "compact"):
        instance = make_instance(args.sentences, args.words, compact=kind == "compact")
        G, L = instance.global_length, instance.long_length
        zoom = AxisRange(G + L // 2, G + L // 2 + min(256, L // 2))
        cases = [
            ("block summary (whole)", lambda: block_summary(Pattern(instance)), None),
            (
                "PNG, blocks (whole)",
                lambda: render(instance).save(out / "whole.png"),
                lambda: dense_imshow(instance, out / "peer.png"),
            ),
            ("PNG, tokens (256 x 256 zoom)", lambda: render(instance, zoom, zoom).save(out / "zoom.png"), None),
            ("HTML viewer", lambda: write_viewer(instance, out / "viewer.html"), None),
            ("terminal (blocks)", lambda: terminal_view(instance, style="plain"), None),
        ]
        if not args.quick:
            cases.insert(2, ("SVG, blocks (whole)", lambda: render(instance).save(out / "whole.svg"), None))
        for name, ours, peer in cases:
            ours_s = best_of(ours, repeat)
            peer_s = best_of(peer, repeat) if peer else None
            rows.append((kind, f"{G}+{L}", name, ours_s, peer_s))

    print(f"{'side':8} {'G+L':10} {'case':30} {'ours s':>8} {'dense-imshow s':>15} {'ratio':>7}")
    for kind, size, name, ours_s, peer_s in rows:
        peer_text = f"{peer_s:15.3f}" if peer_s is not None else f"{'-':>15}"
        ratio = f"{peer_s / ours_s:7.1f}" if peer_s is not None else f"{'-':>7}"
        print(f"{kind:8} {size:10} {name:30} {ours_s:8.3f} {peer_text} {ratio}")
    print(f"(files in {out}; python and matplotlib import time not included)")
    if args.long_tokens:
        print(
            f"\nlong input: {args.long_tokens:,} long tokens, {args.long_globals:,} globals (one process per command)"
        )
        print(f"{'command':30} {'wall s':>8} {'peak RSS MB':>12}")
        for name, seconds, rss in long_input(out, args.long_tokens, args.long_globals):
            print(f"{name:30} {seconds:8.1f} {rss:12.0f}")
    print(f"load average (1, 5, 15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
