"""`graphattn compile INPUTS... --schema S --out DIR --tokenizer tokenizer.json [options]`.

Compiles HTML, text and JSON / JSON-lines documents (files, directories, globs) into Parquet
shards of compiled instances; see `graphattn.corpus.pipeline` for how the work is cut and
`graphattn.shards.format` for what a shard holds. Documents that fail are listed in
DIR/rejected.jsonl and the run goes on; task labels that match nothing are listed in
DIR/warnings.jsonl (--strict rejects their documents instead); a killed run continues with --resume.
"""

from __future__ import annotations

import argparse
import sys

from graphattn.corpus.sources import DEFAULT_SHARD_SIZE, FORMATS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="document files (.html, .txt, .json, .jsonl, .gz), directories or glob patterns")
    parser.add_argument("--schema", required=True, help="relation schema: a YAML/JSON file or a shipped name (e.g. hotpotqa)")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory for shards, run.json and rejected.jsonl")
    parser.add_argument("--tokenizer", metavar="FILE", help="tokenizer.json (a fixed vocabulary, so ids do not depend on order)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="parallel workers: processes (default 1), or Ray actors (default: every CPU Ray has)")
    parser.add_argument("--engine", choices=("local", "ray"), default="local",
                        help="local process pool (default) or Ray Data (needs the graphattn[ray] extra)")
    parser.add_argument("--ray-address", metavar="A", help="join this Ray cluster instead of starting a local Ray instance")
    parser.add_argument("--resume", action="store_true", help="finish a killed run in DIR: compile only the shards not yet done")
    parser.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE, metavar="N",
                        help=f"documents per shard (default {DEFAULT_SHARD_SIZE}); packing never crosses a shard")
    parser.add_argument("--format", choices=FORMATS, default="auto",
                        help="how to read the inputs (default auto: by suffix, and JSON records by their keys)")
    parser.add_argument("--mapping", metavar="FILE", help="read JSON records with this generic ingest mapping (YAML/JSON)")
    parser.add_argument("--strict", action="store_true",
                        help="reject a document whose task labels match nothing (default: compile it without "
                             "them and list each such label in DIR/warnings.jsonl)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from graphattn.corpus.pipeline import CompileOptions, run_compile

    options = CompileOptions(
        inputs=args.inputs, schema=args.schema, out=args.out, tokenizer=args.tokenizer, workers=args.workers,
        engine=args.engine, ray_address=args.ray_address, resume=args.resume, shard_size=args.shard_size,
        format=args.format, mapping=args.mapping, progress=not args.quiet, strict=args.strict,
    )
    try:
        run_compile(options)
    except KeyboardInterrupt:
        print(f"graphattn compile: interrupted; finished shards are kept in {args.out}: rerun the same command "
              "with --resume to compile the rest", file=sys.stderr)
        return 130
    return 0
