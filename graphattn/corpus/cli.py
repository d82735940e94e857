"""`graphattn compile INPUTS... --schema S --out DIR [--tokenizer T] [options]`.

Compiles HTML, text and JSON / JSON-lines documents (files, directories, globs) into Parquet
shards of compiled instances; see `graphattn.corpus.pipeline` for how the work is cut and
`graphattn.shards.format` for what a shard holds. Documents that fail are listed in
DIR/rejected.jsonl and the run goes on; task labels that match nothing are listed in
DIR/warnings.jsonl (--strict rejects their documents instead); a killed run continues with
--resume. The run fails (exit 1) when it compiled nothing or rejected more than --max-rejected
of the documents. `--set KEY=VALUE` overrides a value of the schema (`graphattn.schema.overrides`);
the shards record the effective schema.
"""

from __future__ import annotations

import argparse
import sys

from graphattn.cli import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, add_verbosity_arguments, verbosity
from graphattn.corpus.sources import DEFAULT_MAX_REJECTED, DEFAULT_SHARD_SIZE, FORMATS
from graphattn.tokenize.files import TOKENIZER_HELP

REASONS_SHOWN = 3  # rejection reasons printed on stderr (all of them with -v)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="document files (.html, .txt, .json, .jsonl, .gz), directories or glob patterns",
    )
    parser.add_argument(
        "--schema", required=True, help="relation schema: a YAML/JSON file or a shipped name (e.g. hotpotqa)"
    )
    add_set_argument(parser)
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="output directory for shards, run.json and rejected.jsonl"
    )
    parser.add_argument("--tokenizer", metavar="T", help=TOKENIZER_HELP + "; ids must not depend on input order")
    parser.add_argument(
        "--max-rejected",
        type=float,
        default=DEFAULT_MAX_REJECTED,
        metavar="FRACTION",
        help="fail (exit 1) when more than this share of the documents is rejected; "
        "0: any rejection fails, 1: never (a run that compiles nothing always fails)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="parallel workers: processes (default 1), or Ray actors (default: every CPU Ray has)",
    )
    parser.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local process pool, or Ray actors (needs the graphattn[ray] extra)",
    )
    parser.add_argument(
        "--ray-address", metavar="A", help="join this Ray cluster instead of starting a local Ray instance"
    )
    parser.add_argument(
        "--resume", action="store_true", help="finish a killed run in DIR: compile only the shards not yet done"
    )
    parser.add_argument(
        "--shard-size",
        type=int,
        default=DEFAULT_SHARD_SIZE,
        metavar="N",
        help="documents per shard; packing never crosses a shard",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="how to read the inputs (auto: by suffix, and JSON records by their keys)",
    )
    parser.add_argument(
        "--mapping",
        metavar="FILE",
        help="read JSON records with this generic ingest mapping (YAML/JSON; see docs/FORMATS.md)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="reject a document whose task labels match nothing (default: compile it without "
        "them and list each such label in DIR/warnings.jsonl)",
    )
    add_html_arguments(parser)
    add_verbosity_arguments(parser)


def add_set_argument(parser: argparse.ArgumentParser, extra: str = "") -> None:
    """--set KEY=VALUE (repeatable): a schema value from the command line (compile and train)."""
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        metavar="KEY=VALUE",
        help="override a value of --schema (repeatable): a top-level key or a dotted path, the value read as a YAML "
        "scalar, e.g. --set relative_pos_max_distance=42 --set special_tokens.global=[unused0]; checked against "
        "the relation schema, and the shards record the schema it makes" + extra,
    )


def add_html_arguments(parser: argparse.ArgumentParser) -> None:
    """--encoding / --errors for HTML inputs (shared by compile and viz; `graphattn.ingest.html.read_html`)."""
    parser.add_argument(
        "--encoding",
        metavar="LABEL",
        help="HTML: read every page in this encoding (a WHATWG label: utf-8, windows-1252, "
        "shift_jis, ...), as a server's Content-Type would say it; it overrides <meta charset> "
        "but not a byte-order mark (default: sniff as browsers do: BOM, <meta charset>, else "
        "UTF-8 if valid, else windows-1252)",
    )
    parser.add_argument(
        "--errors",
        choices=("strict", "replace"),
        help="HTML: bytes invalid in the page's encoding reject the page (strict) or read as U+FFFD "
        "(replace) (default: strict)",
    )


def html_options(args: argparse.Namespace) -> dict:
    """The HTML reader options given on the command line (none given: the reader's defaults)."""
    return {name: value for name in ("encoding", "errors") if (value := getattr(args, name, None)) is not None}


def run(args: argparse.Namespace) -> int:
    from graphattn.corpus.pipeline import CompileOptions, run_compile

    level = verbosity(args)
    options = CompileOptions(
        inputs=args.inputs,
        schema=args.schema,
        out=args.out,
        tokenizer=args.tokenizer,
        workers=args.workers,
        engine=args.engine,
        ray_address=args.ray_address,
        resume=args.resume,
        shard_size=args.shard_size,
        format=args.format,
        mapping=args.mapping,
        progress=level >= 0,
        max_rejected=args.max_rejected,
        html_options=html_options(args),
        strict=args.strict,
        sets=list(args.sets or []),
    )
    try:
        summary = run_compile(options)
    except KeyboardInterrupt:
        print(
            f"graphattn compile: interrupted; finished shards are kept in {args.out}: rerun the same command "
            "with --resume to compile the rest",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    for line in summary.problem_lines(REASONS_SHOWN if level < 1 else None):
        print(line, file=sys.stderr)
    return EXIT_INCOMPLETE if summary.failed else EXIT_OK
