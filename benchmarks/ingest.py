"""HTML ingestion speed: pages/s and MB/s from file to compiled instance, beside lxml's parse.

    python benchmarks/ingest.py [--quick] [--pages N]

Pages: the installed documentation tree the real-page tests use (e.g. /usr/share/doc/nodejs/api),
else copies of examples/data/openkp_page.html. Rows, each over the same files, medians of
repeats (whole-corpus passes):

  lxml parse          lxml.html.parse of each file (the peer: the floor any lxml ingester pays)
  read_html           file -> DocGraph (parse, visible text, element and text nodes, features)
  read_html+compile   file -> EtcInstance with schemas/openkp-dom.yaml and the shipped tokenizer
  HF tokenize         `tokenizers` encode of the same visible text (what compile must pay anyway)

The ratio column is time / lxml parse. Numbers on a shared machine are noisy: run it alone.
"""

from __future__ import annotations

import argparse
import glob
import statistics
import sys
import time
from pathlib import Path

import lxml.html

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphattn.compile import compile_instance  # noqa: E402
from graphattn.ingest.html import read_html  # noqa: E402
from graphattn.schema import load_schema  # noqa: E402
from graphattn.tokenize import load_tokenizer  # noqa: E402

DOC_TREES = (
    "/usr/share/doc/nodejs/api/*.html",
    "/usr/share/doc/python3*/html/library/*.html",
    "/usr/share/doc/valgrind/html/*.html",
)


def find_pages(limit: int) -> tuple[list[Path], str]:
    for pattern in DOC_TREES:
        pages = sorted(Path(p) for p in glob.glob(pattern) if Path(p).stat().st_size <= 2_000_000)
        if pages:
            return pages[:limit], pattern
    return [ROOT / "examples" / "data" / "openkp_page.html"] * min(limit, 20), "examples/data/openkp_page.html (no doc tree found)"


def timed(fn, pages: list[Path], repeats: int) -> float:
    """Median seconds for one pass of `fn` over all pages."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for page in pages:
            fn(page)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer pages and repeats")
    parser.add_argument("--pages", type=int, default=None, help="how many pages (default 60, 15 with --quick)")
    args = parser.parse_args(argv)
    pages, origin = find_pages(args.pages or (15 if args.quick else 60))
    repeats = 1 if args.quick else 3
    tokenizer = load_tokenizer(str(ROOT / "examples" / "data" / "tokenizer.json"))
    schema = load_schema(ROOT / "schemas" / "openkp-dom.yaml")
    megabytes = sum(p.stat().st_size for p in pages) / 1e6
    texts = {p: read_html(p).text for p in pages}  # also warms caches and imports

    rows = [
        ("lxml parse", timed(lambda p: lxml.html.parse(str(p)), pages, repeats)),
        ("read_html", timed(read_html, pages, repeats)),
        ("read_html+compile", timed(lambda p: compile_instance(read_html(p), schema, tokenizer), pages, repeats)),
        ("HF tokenize (text)", timed(lambda p: tokenizer.encode(texts[p]), pages, repeats)),
    ]
    base = rows[0][1]
    print(f"{len(pages)} pages, {megabytes:.2f} MB, from {origin}; median of {repeats} pass(es)")
    print(f"{'stage':<20} {'seconds':>9} {'pages/s':>9} {'MB/s':>8} {'x lxml':>8}")
    for name, seconds in rows:
        print(f"{name:<20} {seconds:9.3f} {len(pages) / seconds:9.1f} {megabytes / seconds:8.2f} {seconds / base:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
