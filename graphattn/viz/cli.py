"""`graphattn viz INPUT --schema S [--out FILE.png|.svg|.html] [--queries A:B] [--keys A:B]`.

INPUT is a document (a DocGraph JSON, HTML, plain text, or a HotpotQA / WikiHop / NQ file with
--format) that is compiled with the schema and tokenizer first (the same default tokenizer as
`graphattn compile`), or a compiled Parquet shard (read through `graphattn.shards.dataset`).
Either way the instance stays in its compact form, so a 262K-token input draws in bounded
memory. A document that a strided layout (truncation policy `windows`, e.g. NQ) cuts into
several windows draws window --window N, and the output says which one it is.
Without --out the terminal view is printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from graphattn.cli import add_verbosity_arguments, verbosity
from graphattn.contract import EtcInstance
from graphattn.errors import GraphattnError, GraphError, IngestError
from graphattn.tokenizer_files import DEFAULT_TOKENIZER, TOKENIZER_HELP

DOCUMENT_FORMATS = ("docgraph", "html", "text", "hotpotqa", "wikihop", "nq")
SUFFIX_FORMATS = {".html": "html", ".htm": "html", ".xhtml": "html", ".txt": "text", ".text": "text", ".md": "text", ".json": "docgraph"}
SHARD_SUFFIXES = (".parquet",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from graphattn.corpus.cli import add_html_arguments

    parser.add_argument("input", help="document (.json DocGraph, .html, .txt; datasets with --format) or compiled shard (.parquet)")
    parser.add_argument("--schema", help="relation schema: a YAML/JSON file or a shipped schema name (needed for documents)")
    parser.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help=TOKENIZER_HELP + "; or spacy:<lang>")
    parser.add_argument("--format", choices=DOCUMENT_FORMATS, help="how to read a document (default: from its suffix)")
    parser.add_argument("--out", help="write FILE.png, FILE.svg or FILE.html instead of printing to the terminal")
    parser.add_argument("--queries", help="query rows A:B over [global ; long] positions; g/l prefixes count in one part (l0:l64)")
    parser.add_argument("--keys", help="key columns A:B, as --queries")
    parser.add_argument("--instance", type=int, default=0,
                        help="which record of a dataset file, or which instance of a shard")
    parser.add_argument("--window", type=int, default=0, metavar="N",
                        help="which window of a document that the schema's strided layout (truncation: windows) "
                             "cuts into several")
    parser.add_argument(
        "--style", choices=("auto", "plain", "letters", "color"), default="auto",
        help="terminal view style (auto: color on a terminal, letters otherwise)",
    )
    parser.add_argument("--ascii", action="store_true", help="terminal view in ASCII only")
    parser.add_argument("--block-size", type=int, help="draw blocks of this many tokens (PNG/SVG) instead of choosing by size")
    parser.add_argument("--title", help="title of the picture or page")
    add_html_arguments(parser)
    add_verbosity_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from graphattn.corpus.cli import html_options
    from graphattn.viz.pattern import Pattern, parse_range

    loaded = load_instance(args.input, schema=args.schema, tokenizer=args.tokenizer, format=args.format,
                           index=args.instance, window=args.window, html_options=html_options(args))
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
        raise GraphattnError(f"cannot write a picture with suffix {out.suffix!r}; use .png or .svg "
                             "(or .html for the viewer)", file=str(out))
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


def load_instance(path: str | Path, *, schema=None, tokenizer=DEFAULT_TOKENIZER, format: str | None = None,
                  index: int = 0, window: int = 0, html_options: dict | None = None) -> Loaded:
    """The instance to draw, in its compact form: compiled from a document, or read from a shard."""
    path = Path(path)
    if not path.exists():
        raise GraphattnError("no such file", file=str(path))
    if index < 0:
        raise GraphattnError(f"--instance must be >= 0, got {index}", file=str(path))
    if window < 0:
        raise GraphattnError(f"--window must be >= 0, got {window}", file=str(path))
    if path.suffix.lower() in SHARD_SUFFIXES:
        if window:
            raise GraphattnError("--window picks a window of a document; in a shard every window is an instance "
                                 "of its own: use --instance", file=str(path))
        return load_from_shard(path, index)
    graph = read_document(path, format, index, html_options)
    if schema is None:
        raise GraphattnError("--schema is required to compile a document (a YAML/JSON file or a shipped name)", file=str(path))
    from graphattn.compile import compile_windows
    from graphattn.schema import load_schema
    from graphattn.tokenize import load_tokenizer

    schema = load_schema(schema)
    windows = compile_windows(graph, schema, load_tokenizer(tokenizer), compact=True)
    if not windows:
        raise GraphattnError("the compiler returned no instance for this document", file=str(path))
    if window >= len(windows):
        raise GraphattnError(f"--window {window} is out of range: the schema's strided layout gives this document "
                             f"{len(windows)} window(s), numbered from 0", file=str(path))
    if len(windows) == 1:
        return Loaded(windows[0])
    stride = schema.truncation.stride
    every = f"; windows start every {stride} long tokens" if stride else ""
    return Loaded(windows[window], f"window {window + 1} of {len(windows)} (--window {window}{every})")


def load_from_shard(path: Path, index: int) -> Loaded:
    """Instance `index` of a compiled shard, compact (`graphattn.shards.format.read_row`: no torch)."""
    from graphattn.shards.format import read_row

    instance, provenance = read_row(path, index, compact=True)
    where = ""
    if provenance.windows > 1:
        where = (f"instance {index}: window {provenance.window + 1} of {provenance.windows} "
                 f"of document #{provenance.doc_numbers[0]}")
    return Loaded(instance, where)


def read_document(path: Path, format: str | None, index: int = 0, html_options: dict | None = None):
    """A DocGraph from a document file; `index` picks the record of a multi-record file."""
    format = format or SUFFIX_FORMATS.get(path.suffix.lower())
    if format is None:
        raise IngestError(
            f"cannot tell how to read a {path.suffix or 'suffix-less'} file; pass --format ({', '.join(DOCUMENT_FORMATS)})",
            file=str(path),
        )
    if format == "docgraph":
        return _read_docgraph(path, index)
    if format == "html":
        from graphattn.ingest.html import read_html

        return read_html(path, **(html_options or {}))
    if format == "text":
        from graphattn.ingest.text import text_to_graph

        return text_to_graph(_read_text(path), doc_id=path.stem, source=str(path))
    from graphattn.ingest.json import read_json

    record = next(itertools.islice(read_json(path, format), index, None), None)
    if record is None:
        raise IngestError(f"has no record {index} (--instance counts from 0)", file=str(path))
    return record


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise IngestError(f"not UTF-8 text ({err.reason} at byte {err.start})", file=str(path)) from None


def _read_docgraph(path: Path, index: int):
    from graphattn.graph import DocGraph

    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as err:
        raise GraphError(f"not valid JSON: {err.msg} (column {err.colno})", file=str(path), line=err.lineno) from None
    if isinstance(data, list):
        if not 0 <= index < len(data):
            raise GraphError(f"has {len(data)} graphs; --instance {index} is out of range", file=str(path))
        data, where = data[index], (index,)
    else:
        where = ()
    if not isinstance(data, dict) or "nodes" not in data:
        raise GraphError(
            "expected a DocGraph object {text, nodes, edges}; for HotpotQA, WikiHop or NQ files pass --format",
            file=str(path), path=where,
        )
    return DocGraph.from_dict(data, source=str(path))
