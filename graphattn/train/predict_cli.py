"""`graphattn predict --model RUN INPUTS... --out FILE`: a trained run's answers, one record per document.

INPUTS are raw documents (files, directories, globs in any format `graphattn compile` reads;
they are compiled with the run's own schema and tokenizer) or compiled shards. `--format`:

    jsonl      one JSON object per line and document (`graphattn.train.predict_records`), the default
    hotpotqa   HotpotQA's official prediction file, {"answer": {id: text}, "sp": {id: [[title, sent], ...]}},
               which HotpotQA's hotpot_evaluate_v1.py reads (the run's span target is the answer, its
               supporting-fact target the sp; the schema must be HotpotQA's)
    wikihop    QAngaroo WikiHop's prediction file, {id: chosen candidate's text} (the run's choice target)
    openkp     OpenKP's candidate file, JSON lines {"url": id, "KeyPhrases": [[word, ...], ...]} with the
               `--n-best` best keyphrases (the run's spans target), as OpenKP's evaluation reads it

NQ's official prediction file names its answers by the original HTML page's token and byte
offsets, which a compiled graph does not keep: `--format nq` is refused (jsonl gives the answers
with their character offsets in the document text instead). The file is written whole or not at
all (a temporary file renamed at the end). The command exits 1 when some documents got no
prediction (they did not compile: each is named on stderr), 2 on an error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from graphattn.errors import GraphattnError
from graphattn.train.arguments import bounded, path_exists
from graphattn.train.checkpoint_dirs import TRUST_FLAG
from graphattn.train.evaluate import _device_name
from graphattn.train.predict import MAX_BATCH_SIZE
from graphattn.train.spans import DEFAULT_N_BEST, MAX_ANSWER_LENGTH_LIMIT, MAX_N_BEST

FORMATS = ("jsonl", "hotpotqa", "wikihop", "openkp", "nq")
SHOWN_REJECTIONS = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from graphattn.cli import add_verbosity_arguments
    from graphattn.shards.inspect import add_verify_argument
    from graphattn.train.evaluate import add_model_argument

    add_model_argument(parser)
    parser.add_argument(
        "inputs", nargs="+", metavar="INPUTS", help="raw documents (files, directories, globs) or compiled shards"
    )
    parser.add_argument("--out", required=True, metavar="FILE", help="the predictions file to write")
    parser.add_argument("--format", choices=FORMATS, default="jsonl", help="jsonl, or an official prediction file")
    from graphattn.corpus.sources import FORMATS as INPUT_FORMATS

    parser.add_argument(
        "--input-format", choices=INPUT_FORMATS, default="auto", help="how raw INPUTS are read (compile's --format)"
    )
    parser.add_argument("--tokenizer", help="raw INPUTS: the run's tokenizer, where run.json's path is not found here")
    parser.add_argument("--batch-size", type=bounded(int, 1, MAX_BATCH_SIZE), default=8)
    parser.add_argument("--device", type=_device_name, default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--n-best", type=bounded(int, 1, MAX_N_BEST), default=DEFAULT_N_BEST, help="answers / keyphrases per document"
    )
    parser.add_argument(
        "--max-answer-length",
        type=bounded(int, 1, MAX_ANSWER_LENGTH_LIMIT),
        help="longest span answer in long tokens (default: the run's span head's, 30)",
    )
    parser.add_argument(
        TRUST_FLAG, action="store_true", help="the checkpoint has no digest.json: check that it loads and record one"
    )
    add_verify_argument(parser)
    add_verbosity_arguments(parser)


def _target_of(specs: dict[str, Any], kind: str, format: str) -> str:
    """The run's first target of `kind`, which an official file is made of, or a one-line refusal."""
    name = next((n for n, s in specs.items() if s.kind == kind), None)
    if name is None:
        kinds = ", ".join(f"{n} ({s.kind})" for n, s in specs.items())
        raise GraphattnError(f"--format {format} needs a {kind} target; the run has {kinds}")
    return name


class _Writer:
    """Writes records to FILE.tmp as they come (jsonl, openkp) or at the end (hotpotqa, wikihop),
    then renames it over FILE; on an error FILE is left as it was."""

    def __init__(self, out: str, format: str, specs: dict[str, Any]):
        self.out, self.format = Path(out), format
        if format == "hotpotqa":
            self.answer = _target_of(specs, "span", format)
            self.support = _target_of(specs, "global_labels", format)
            self.official: dict[str, Any] = {"answer": {}, "sp": {}}
        elif format == "wikihop":
            self.answer, self.official = _target_of(specs, "choice", format), {}
        elif format == "openkp":
            self.answer = _target_of(specs, "spans", format)
        self.tmp = self.out.with_name(self.out.name + ".tmp")
        self.handle = self.tmp.open("w", encoding="utf-8")

    def add(self, record: dict) -> None:
        key = str(record["id"] if record["id"] is not None else record["document"])
        if self.format == "jsonl":
            self.handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        elif self.format == "openkp":
            phrases = [phrase["text"].split() for phrase in record[self.answer]]
            self.handle.write(json.dumps({"url": key, "KeyPhrases": phrases}, ensure_ascii=False) + "\n")
        elif self.format == "wikihop":
            self.official[key] = record[self.answer]["text"]
        else:
            facts = record[self.support].get("facts")
            if facts is None:
                raise GraphattnError(
                    f"--format hotpotqa: document {key!r} has no HotpotQA sentences (nodes p<i>.s<j> with a title): "
                    "its supporting facts cannot be named as [title, sentence index]; use --format jsonl"
                )
            self.official["answer"][key] = record[self.answer]["text"]
            self.official["sp"][key] = facts

    def close(self, keep: bool) -> None:
        if keep and self.format in ("hotpotqa", "wikihop"):
            json.dump(self.official, self.handle, ensure_ascii=False)
        self.handle.close()
        if keep:
            os.replace(self.tmp, self.out)
        else:
            self.tmp.unlink(missing_ok=True)


def run(args: argparse.Namespace) -> int:
    from graphattn.cli import EXIT_INCOMPLETE, verbosity

    if args.format == "nq":
        raise GraphattnError(
            "--format nq: NQ's official prediction file names answers by the original page's token and byte offsets, "
            "which compiled graphs do not keep; use --format jsonl (answers with their character offsets)"
        )
    missing = next((v for v in args.inputs if not path_exists(v)), None)
    if missing is not None:
        raise GraphattnError(f"{missing}: no such file or directory (nor a glob that matches one)")
    if not path_exists(args.model):
        raise GraphattnError(f"--model {args.model}: no such directory")
    parent = Path(args.out).resolve().parent
    if not parent.is_dir():
        raise GraphattnError(f"--out {args.out}: directory {parent} does not exist")
    if Path(args.out).is_dir():
        raise GraphattnError(f"--out {args.out}: is a directory; name the predictions file")
    from graphattn.train.predict import Predictor

    quiet = verbosity(args) < 0
    predictor = Predictor.from_run(
        args.model,
        args.device,
        args.batch_size,
        tokenizer=args.tokenizer,
        n_best=args.n_best,
        max_answer_length=args.max_answer_length,
        progress=not quiet,
        trust_undigested=args.trust_undigested,
        print_fn=print,
    )
    writer = _Writer(args.out, args.format, predictor.specs)
    done = False
    try:
        for record in predictor.predict(args.inputs, format=args.input_format, verify_sha256=args.verify_sha256):
            writer.add(record)
        done = predictor.stats.documents > 0
    finally:
        writer.close(keep=done)
    stats = predictor.stats
    if stats.documents == 0:
        raise GraphattnError(f"{args.inputs[0]}: the inputs hold no document (nothing written to {args.out})")
    print(f"wrote {stats.predicted:,} prediction(s) to {args.out} ({args.format})")
    if stats.predicted < stats.documents:
        for entry in stats.rejected[:SHOWN_REJECTIONS]:
            where = entry.get("source", "?") + (f":{entry['line']}" if entry.get("line") is not None else "")
            print(
                f"  not predicted: {where} (document {entry.get('document')}): {entry.get('message')}", file=sys.stderr
            )
        more = len(stats.rejected) - SHOWN_REJECTIONS
        if more > 0:
            print(f"  ... and {more:,} more", file=sys.stderr)
        print(
            f"error: {stats.documents - stats.predicted:,} of {stats.documents:,} document(s) got no prediction",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    return 0
