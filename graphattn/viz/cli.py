"""`graphattn viz INPUT --schema S [--out FILE.png|.svg|.html] [--queries A:B] [--keys A:B]`.

INPUT is what `graphattn compile` reads or writes: a document file (HTML, text, or JSON / JSON
lines in any format of `graphattn.ingest.formats`, told by suffix and by the records' keys, or
given with --format / --mapping), compiled with the schema and tokenizer first (the same default
tokenizer as `graphattn compile`); or a compiled Parquet shard or a compile output directory
(--instance counts across its shards). Either way the instance stays in its compact form, so a
262K-token input draws in bounded memory. A document that a strided layout (truncation policy
`windows`, e.g. NQ) cuts into several windows draws window --window N, and the output says which
one it is. Without --out the terminal view is printed.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

from graphattn.cli import add_verbosity_arguments, verbosity
from graphattn.contract import EtcInstance
from graphattn.errors import GraphattnError, IngestError
from graphattn.ingest.formats import FORMATS as DOCUMENT_FORMATS
from graphattn.shards.inspect import add_verify_argument
from graphattn.tokenize.files import DEFAULT_TOKENIZER, TOKENIZER_HELP

SHARD_SUFFIXES = (".parquet",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from graphattn.corpus.cli import add_html_arguments

    parser.add_argument(
        "input",
        help="document (.html, .txt, .json/.jsonl of any known format) or compiled shard "
        "(.parquet, or a compile output directory)",
    )
    parser.add_argument(
        "--schema", help="relation schema: a YAML/JSON file or a shipped schema name (needed for documents)"
    )
    parser.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help=TOKENIZER_HELP + "; or spacy:<lang>")
    parser.add_argument(
        "--format",
        choices=("auto", *DOCUMENT_FORMATS),
        default="auto",
        help="how to read a document (auto: by suffix, and JSON records by their keys)",
    )
    parser.add_argument("--mapping", metavar="FILE", help="read JSON records with this generic mapping (YAML/JSON)")
    parser.add_argument("--out", help="write FILE.png, FILE.svg or FILE.html instead of printing to the terminal")
    parser.add_argument(
        "--queries", help="query rows A:B over [global ; long] positions; g/l prefixes count in one part (l0:l64)"
    )
    parser.add_argument("--keys", help="key columns A:B, as --queries")
    parser.add_argument(
        "--instance", type=int, default=0, help="which record of a dataset file, or which instance of a shard"
    )
    parser.add_argument(
        "--window",
        type=int,
        default=0,
        metavar="N",
        help="which window of a document that the schema's strided layout (truncation: windows) cuts into several",
    )
    parser.add_argument(
        "--style",
        choices=("auto", "plain", "letters", "color"),
        default="auto",
        help="terminal view style (auto: color on a terminal, letters otherwise)",
    )
    parser.add_argument("--ascii", action="store_true", help="terminal view in ASCII only")
    parser.add_argument(
        "--block-size", type=int, help="draw blocks of this many tokens (PNG/SVG) instead of choosing by size"
    )
    parser.add_argument("--title", help="title of the picture or page")
    add_html_arguments(parser)
    add_verify_argument(parser)
    add_verbosity_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from graphattn.corpus.cli import html_options
    from graphattn.viz.pattern import Pattern, parse_range

    loaded = load_instance(
        args.input,
        schema=args.schema,
        tokenizer=args.tokenizer,
        format=args.format,
        index=args.instance,
        window=args.window,
        html_options=html_options(args),
        mapping=args.mapping,
        verify_sha256=args.verify_sha256,
    )
    talk = verbosity(args) >= 0
    if talk and loaded.where:
        print(f"drawing {loaded.where}", file=sys.stderr if args.out is None else sys.stdout)
    pattern = Pattern(loaded.instance)
    G, L = pattern.global_length, pattern.long_length
    queries = parse_range(args.queries, G, L, "--queries")
    keys = parse_range(args.keys, G, L, "--keys")
    if args.block_size is not None and args.block_size < 1:
        raise GraphattnError(f"--block-size must be at least 1, got {args.block_size}")
    if args.out is None:
        from graphattn.viz.terminal import pick_style, terminal_view

        style, ascii_only = pick_style(sys.stdout)
        style = style if args.style == "auto" else args.style
        sys.stdout.write(terminal_view(pattern, queries, keys, style=style, ascii_only=ascii_only or args.ascii))
        return 0
    out = Path(args.out)
    if out.suffix.lower() not in (".png", ".svg", ".html"):
        raise GraphattnError(
            f"cannot write a picture with suffix {out.suffix!r}; use .png or .svg (or .html for the viewer)",
            file=str(out),
        )
    if out.suffix.lower() == ".html":
        from graphattn.viz.html import viewer_html

        page = viewer_html(pattern, title=args.title, queries=queries, keys=keys)
        _write(out, lambda: out.write_text(page, encoding="utf-8"), len(page))
        if talk:
            print(f"wrote {out} (G={G}, L={L}; open it in a browser)")
        return 0
    from graphattn.viz.picture import render

    rendering = render(pattern, queries, keys, block_size=args.block_size, title=args.title)
    _write(out, lambda: rendering.save(out))
    if talk:
        print(f"wrote {out} ({rendering.level}, queries {queries.start}:{queries.stop}, keys {keys.start}:{keys.stop})")
    return 0


def _write(out: Path, write, size: int = 0) -> None:
    """Create --out's folder and write it; a refusal of the file system is one line naming the path."""
    from graphattn.corpus.output import writing

    with writing(out, size, expected="--out must name a file in a directory you may write to"):
        out.parent.mkdir(parents=True, exist_ok=True)
        write()


# -- inputs --------------------------------------------------------------------------------
@dataclass
class Loaded:
    """The instance to draw and, when the source holds several, which one it is."""

    instance: EtcInstance
    where: str = ""  # e.g. "window 2 of 3 (long tokens 2048-6143 of the document)"


def load_instance(
    path: str | Path,
    *,
    schema=None,
    tokenizer=DEFAULT_TOKENIZER,
    format: str | None = "auto",
    index: int = 0,
    window: int = 0,
    html_options: dict | None = None,
    mapping=None,
    verify_sha256: bool = True,
) -> Loaded:
    """The instance to draw, in its compact form: compiled from a document, or read from shards
    (a file or a compile output directory)."""
    path = Path(path)
    if not path.exists():
        raise GraphattnError("no such file", file=str(path))
    if index < 0:
        raise GraphattnError(f"--instance must be >= 0, got {index}", file=str(path))
    if window < 0:
        raise GraphattnError(f"--window must be >= 0, got {window}", file=str(path))
    if path.is_dir() or path.suffix.lower() in SHARD_SUFFIXES:
        if window:
            raise GraphattnError(
                "--window picks a window of a document; in a shard every window is an instance "
                "of its own: use --instance",
                file=str(path),
            )
        return load_from_shard(path, index, verify_sha256)
    graph = read_document(path, format, index, html_options, mapping)
    if schema is None:
        raise GraphattnError(
            "--schema is required to compile a document (a YAML/JSON file or a shipped name)", file=str(path)
        )
    from graphattn.compile import compile_windows
    from graphattn.schema import load_schema
    from graphattn.tokenize import load_tokenizer

    schema = load_schema(schema)
    windows = compile_windows(graph, schema, load_tokenizer(tokenizer), compact=True)
    if not windows:
        raise GraphattnError("the compiler returned no instance for this document", file=str(path))
    if window >= len(windows):
        raise GraphattnError(
            f"--window {window} is out of range: the schema's strided layout gives this document "
            f"{len(windows)} window(s), numbered from 0",
            file=str(path),
        )
    if len(windows) == 1:
        return Loaded(windows[0])
    stride = schema.truncation.stride
    every = f"; windows start every {stride} long tokens" if stride else ""
    return Loaded(windows[window], f"window {window + 1} of {len(windows)} (--window {window}{every})")


def load_from_shard(path: Path, index: int, verify_sha256: bool = True) -> Loaded:
    """Instance `index` of a compiled shard, or of a directory of shards counting across them,
    compact (`graphattn.shards.reader.read_row`: no torch)."""
    from graphattn.shards.reader import read_info, read_row, shard_paths

    files = shard_paths(path)
    file, local = files[0], index
    if len(files) > 1:  # which shard holds it: footers only
        rows = [read_info(f).num_rows for f in files]
        if index >= sum(rows):
            raise GraphattnError(
                f"--instance {index} is out of range: the {len(files)} shards hold {sum(rows)} (counting from 0)",
                file=str(path),
            )
        shard = 0
        while local >= rows[shard]:
            local -= rows[shard]
            shard += 1
        file = files[shard]
    instance, provenance = read_row(file, local, compact=True, verify_sha256=verify_sha256)
    where = f"instance {index} ({Path(file).name} row {local})" if len(files) > 1 else ""
    if provenance.windows > 1:
        where = (
            f"instance {index}: window {provenance.window + 1} of {provenance.windows} "
            f"of document #{provenance.doc_numbers[0]}"
        )
    return Loaded(instance, where)


def read_document(
    path: Path, format: str | None = "auto", index: int = 0, html_options: dict | None = None, mapping=None
):
    """A DocGraph from a document file (`graphattn.ingest.formats`, as compile reads it); `index`
    picks the record of a multi-record file."""
    from graphattn.ingest.formats import read_documents

    documents = read_documents(path, format or "auto", mapping, html_options)
    graph = next(itertools.islice(documents, index, None), None)
    if graph is None:
        raise IngestError(f"has no record {index} (--instance counts from 0)", file=str(path))
    return graph
