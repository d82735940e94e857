"""Time drawing a compiled instance: ours beside the plain matplotlib way, same run, same input.

    python benchmarks/viz_render.py [--quick] [--sentences 256] [--words 15]

The input is a real compile: a generated document of `--sentences` sentences of `--words` words
and a period each (the spaCy word tokenizer, so 256 x 16 = 4096 long tokens and 256 globals
under the shipped `etc-sentences` schema, radius 84), compiled dense and compact.
Peer, on the same instance:
  dense-imshow  materialize the whole [G+L, G+L] label grid (band unrolled, numpy, vectorized)
                and imshow it one pixel per pair: what one writes with matplotlib directly.
Rows are wall-clock seconds (best of --repeat), ratios are peer / ours where a peer exists.
Numbers on a shared machine are noisy: read the ratios.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
    repeat = 1 if args.quick else args.repeat
    out = Path(tempfile.mkdtemp(prefix="graphattn-viz-bench-"))

    rows = []
    for kind in ("dense", "compact"):
        instance = make_instance(args.sentences, args.words, compact=kind == "compact")
        G, L = instance.global_length, instance.long_length
        zoom = AxisRange(G + L // 2, G + L // 2 + 256)
        cases = [
            ("block summary (whole)", lambda: block_summary(Pattern(instance)), None),
            ("PNG, blocks (whole)", lambda: render(instance).save(out / "whole.png"), lambda: dense_imshow(instance, out / "peer.png")),
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


if __name__ == "__main__":
    main()
