"""`graphattn viz INPUT --schema S [--out FILE.png|.svg|.html] [--queries A:B] [--keys A:B]`.

INPUT is what `graphattn compile` reads or writes: a document file (HTML, text, or JSON / JSON
lines in any format of `graphattn.ingest.formats`, told by suffix and by the records' keys, or
given with --format / --mapping), compiled with the schema and tokenizer first; or a compiled
Parquet shard or a compile output directory (read through `graphattn.shards.dataset`). Without
--out the terminal view is printed.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import sys
from pathlib import Path

from graphattn.contract import EtcInstance
from graphattn.errors import GraphattnError, IngestError
from graphattn.ingest.formats import FORMATS as DOCUMENT_FORMATS

SHARD_SUFFIXES = (".parquet",)
DEFAULT_TOKENIZER = "spacy:en"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="document (.html, .txt, .json/.jsonl of any known format) or compiled shard "
                        "(.parquet, or a compile output directory)")
    parser.add_argument("--schema", help="relation schema: a YAML/JSON file or a shipped schema name (needed for documents)")
    parser.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help=f"tokenizer.json path or spacy:<lang> (default {DEFAULT_TOKENIZER})")
    parser.add_argument("--format", choices=("auto", *DOCUMENT_FORMATS), default="auto",
                        help="how to read a document (default auto: by suffix, and JSON records by their keys)")
    parser.add_argument("--mapping", metavar="FILE", help="read JSON records with this generic mapping (YAML/JSON)")
    parser.add_argument("--out", help="write FILE.png, FILE.svg or FILE.html instead of printing to the terminal")
    parser.add_argument("--queries", help="query rows A:B over [global ; long] positions; g/l prefixes count in one part (l0:l64)")
    parser.add_argument("--keys", help="key columns A:B, as --queries")
    parser.add_argument("--instance", type=int, default=0, help="which record of a dataset file, or which instance of a shard (default 0)")
    parser.add_argument(
        "--style", choices=("auto", "plain", "letters", "color"), default="auto",
        help="terminal view style (default: color on a terminal, letters otherwise)",
    )
    parser.add_argument("--ascii", action="store_true", help="terminal view in ASCII only")
    parser.add_argument("--block-size", type=int, help="draw blocks of this many tokens (PNG/SVG) instead of choosing by size")
    parser.add_argument("--title", help="title of the picture or page")


def run(args: argparse.Namespace) -> int:
    from graphattn.viz.pattern import Pattern, parse_range

    instance = load_instance(args.input, schema=args.schema, tokenizer=args.tokenizer, format=args.format,
                             index=args.instance, mapping=args.mapping)
    pattern = Pattern(instance)
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
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".html":
        from graphattn.viz.html import write_viewer

        write_viewer(pattern, out, title=args.title, queries=queries, keys=keys)
        print(f"wrote {out} (G={G}, L={L}; open it in a browser)")
        return 0
    from graphattn.viz.picture import render

    rendering = render(pattern, queries, keys, block_size=args.block_size, title=args.title)
    rendering.save(out)
    print(f"wrote {out} ({rendering.level}, queries {queries.start}:{queries.stop}, keys {keys.start}:{keys.stop})")
    return 0


# -- inputs --------------------------------------------------------------------------------
def load_instance(path: str | Path, *, schema=None, tokenizer=DEFAULT_TOKENIZER, format: str | None = "auto",
                  index: int = 0, mapping=None) -> EtcInstance:
    """The instance to draw: compiled from a document, or read from a compiled shard (file or directory)."""
    path = Path(path)
    if not path.exists():
        raise GraphattnError("no such file", file=str(path))
    if index < 0:
        raise GraphattnError(f"--instance must be >= 0, got {index}", file=str(path))
    if path.is_dir() or path.suffix.lower() in SHARD_SUFFIXES:
        return load_from_shard(path, index)
    graph = read_document(path, format, index, mapping)
    if schema is None:
        raise GraphattnError("--schema is required to compile a document (a YAML/JSON file or a shipped name)", file=str(path))
    from graphattn.schema import load_schema
    from graphattn.tokenize import load_tokenizer

    try:
        from graphattn.compile import compile_instance as compile_graph
    except ImportError:
        raise GraphattnError("compiling a document needs graphattn.compile.compile, which this installation lacks", file=str(path)) from None
    compiled = compile_graph(graph, load_schema(schema), load_tokenizer(tokenizer))
    if isinstance(compiled, EtcInstance):
        return compiled
    compiled = list(compiled)  # a compiler that splits one document into several instances
    if not compiled:
        raise GraphattnError("the compiler returned no instance for this document", file=str(path))
    return compiled[0]


def load_from_shard(path: Path, index: int) -> EtcInstance:
    """Instance `index` of a compiled shard or output directory (`graphattn.shards.dataset.read_instance`)."""
    try:
        data = importlib.import_module("graphattn.shards.dataset")
    except ModuleNotFoundError as err:
        if err.name not in ("graphattn.shards.dataset", "graphattn"):
            raise
        raise GraphattnError("reading compiled shards needs the graphattn.shards.dataset module, which this installation does not have", file=str(path)) from None
    if not hasattr(data, "read_instance"):
        raise GraphattnError("graphattn.shards.dataset has no read_instance(path, index) to read a shard with", file=str(path))
    return data.read_instance(path, index)


def read_document(path: Path, format: str | None = "auto", index: int = 0, mapping=None):
    """A DocGraph from a document file (`graphattn.ingest.formats`); `index` picks the record of a multi-record file."""
    from graphattn.ingest.formats import read_documents

    graph = next(itertools.islice(read_documents(path, format or "auto", mapping), index, None), None)
    if graph is None:
        raise IngestError(f"has no record {index} (--instance counts from 0)", file=str(path))
    return graph
