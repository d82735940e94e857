"""`graphattn train --data SHARDS... --out DIR (--steps N | --epochs N)`: fine-tune on compiled shards.

    graphattn compile data/hotpot_train.json --schema hotpotqa --tokenizer tokenizer.json --out shards/hotpot
    graphattn train --data shards/hotpot --out runs/hotpot --steps 2000 --init-from ./bert-base-uncased
    graphattn evaluate --model runs/hotpot --data shards/hotpot-dev

--data names compiled shards: directories, .parquet files or globs. A head is trained for every
target of the schema the shards were compiled with (`--targets` picks some); the shards are
streamed (`graphattn.train.finetune`), nothing is compiled again. Raw records (anything
`graphattn compile` reads) are compiled into DIR/compiled first, with --schema, --tokenizer
and --set, and the command says so; later runs reuse that directory. A flag that would do
nothing is refused: --tokenizer or --set with shards (their ids and schema values are compiled
in; compile again to change them), --schema with shards of another geometry, --hidden-size /
--layers / --heads with --init-from (the checkpoint says them), --trust-undigested without --resume.
Checkpoints, run.json and log.jsonl go to DIR; a DIR that holds a run is refused unless --resume
(continue it exactly, with the same settings) or --overwrite, and a second `train` on DIR stops at
once (graphattn.train.rundir).
Ctrl-C or SIGTERM finishes the step under way, saves a checkpoint, prints the command that
resumes, and exits 130 (143 for SIGTERM). Under `torchrun` it runs DDP.

Every argument is checked (bounds, files that must exist, --eval-data's schema) before torch is
imported or the training data read, so `--help` and a typo answer in well under a second.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shlex
import signal
import sys
from pathlib import Path

from graphattn.cli import add_verbosity_arguments, verbosity
from graphattn.corpus.cli import add_set_argument
from graphattn.errors import GraphattnError
from graphattn.shards.inspect import add_verify_argument
from graphattn.train.arguments import bounded, path_exists
from graphattn.train.checkpoint_dirs import TRUST_FLAG

THROTTLE_ENV = "GRAPHATTN_TRAIN_THROTTLE"  # seconds to sleep after each step (tests interrupt runs with it)
EXIT_SIGNAL_BASE = 128  # a run stopped by signal N exits 128 + N (130 Ctrl-C, 143 SIGTERM)


MAX_STEPS = 1_000_000_000
RANDOM_ENCODER = {"hidden_size": 256, "layers": 4, "heads": 4}  # the shape of a new encoder (no --init-from)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data",
        required=True,
        nargs="+",
        metavar="SHARDS",
        help="compiled shards: directories, .parquet files or globs (raw records are compiled first)",
    )
    parser.add_argument("--out", required=True, help="directory for checkpoints, run.json and log.jsonl")
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=bounded(int, 1, MAX_STEPS), help="optimizer steps")
    length.add_argument("--epochs", type=bounded(int, 1, 1_000_000), help="passes over --data")
    parser.add_argument(
        "--targets", nargs="+", metavar="NAME", help="train only these targets of the schema (default: all)"
    )
    parser.add_argument(
        "--eval-data", nargs="*", default=[], help="shards to print `graphattn evaluate`'s metrics on after training"
    )
    parser.add_argument(
        "--schema",
        help="raw-record --data: the relation schema to compile with; shards: use this schema's "
        "targets instead of the footer's",
    )
    parser.add_argument("--tokenizer", help="raw-record --data: tokenizer.json to compile with")
    add_set_argument(parser, " (raw-record --data only: shards are compiled already)")
    parser.add_argument(
        "--init-from",
        help="start the encoder from a local checkpoint: an ETC checkpoint directory (etc_config.json + "
        "model.ckpt.*, e.g. etc_base_2x_pretrain) or a HF BERT/RoBERTa directory to lift",
    )
    parser.add_argument(
        "--hidden-size",
        type=bounded(int, 2, 16_384),
        help=f"random encoder (no --init-from): hidden size (default {RANDOM_ENCODER['hidden_size']})",
    )
    parser.add_argument(
        "--layers", type=bounded(int, 1, 256), help=f"random encoder: layers (default {RANDOM_ENCODER['layers']})"
    )
    parser.add_argument(
        "--heads",
        type=bounded(int, 1, 1_024),
        help=f"random encoder: attention heads (default {RANDOM_ENCODER['heads']})",
    )
    parser.add_argument("--dropout", type=bounded(float, 0.0, 0.99), default=0.1, help="random encoder: hidden dropout")
    parser.add_argument("--batch-size", type=bounded(int, 1, 65_536), default=8, help="instances per step and process")
    parser.add_argument("--lr", type=bounded(float, 0.0, 10.0, low_open=True), default=5e-5)
    parser.add_argument("--optimizer", choices=("adamw", "lamb"), default="adamw")
    parser.add_argument("--warmup-ratio", type=bounded(float, 0.0, 0.99), default=0.1)
    parser.add_argument("--accumulate", type=bounded(int, 1, 65_536), default=1, help="batches per optimizer step")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    parser.add_argument(
        "--checkpoint-every",
        type=bounded(int, 0, MAX_STEPS),
        default=0,
        help="steps between checkpoints (0: at the end, and on Ctrl-C / SIGTERM)",
    )
    parser.add_argument(
        "--log-every",
        type=bounded(int, 1, MAX_STEPS),
        default=10,
        help="steps between the records of --out/log.jsonl: losses per target, learning rate",
    )
    run_dir = parser.add_mutually_exclusive_group()
    run_dir.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
    run_dir.add_argument(
        "--overwrite", action="store_true", help="--out holds a run: delete its checkpoints, run.json and log first"
    )
    parser.add_argument(
        TRUST_FLAG,
        action="store_true",
        help="with --resume: the newest checkpoint has no digest.json (an older graphattn wrote it, or its digest was "
        "removed): check that it loads, record its digest.json and continue from it",
    )
    parser.add_argument(
        "--workers", type=bounded(int, 0, 256), default=0, help="DataLoader worker processes reading shards (default 0)"
    )
    parser.add_argument(
        "--buffer-size",
        type=bounded(int, 1, 10_000_000),
        default=1024,
        help="instances in the shuffle buffer (default 1024)",
    )
    parser.add_argument("--seed", type=bounded(int, 0, 2**63 - 1), default=0)
    add_verify_argument(parser)
    add_verbosity_arguments(parser, "--no-progress")  # -q/--quiet; --no-progress is its older name


def is_shard_source(arg: str) -> bool:
    """A directory holding *.parquet, a .parquet file, or a glob matching only .parquet files."""
    path = Path(arg)
    if path.is_dir():
        return any(path.glob("*.parquet"))
    if path.is_file():
        return path.suffix.lower() == ".parquet"
    matches = glob.glob(arg, recursive=True) if glob.has_magic(arg) else []
    return bool(matches) and all(m.lower().endswith(".parquet") for m in matches)


def compile_raw(inputs: list[str], args: argparse.Namespace) -> str:
    """Raw records -> DIR/compiled (resuming an earlier compile there); says what it does."""
    from graphattn.corpus.pipeline import CompileOptions, run_compile

    if not args.schema or not args.tokenizer:
        raise GraphattnError(
            f"--data {inputs[0]} is not compiled shards: compile it with `graphattn compile` first, or give "
            "--schema and --tokenizer to compile it into --out/compiled now"
        )
    target = Path(args.out) / "compiled"
    again = (target / "run.json").is_file()
    print(
        f"--data holds raw records, not shards: compiling them into {target} first (graphattn compile"
        + (", finishing or reusing the earlier compile there" if again else "")
        + f"); next time pass --data {target}"
    )
    run_compile(
        CompileOptions(
            inputs=inputs,
            schema=args.schema,
            out=str(target),
            tokenizer=args.tokenizer,
            resume=again,
            progress=verbosity(args) >= 0,
            sets=list(getattr(args, "sets", None) or []),
        )
    )
    return str(target)


def resume_command(args: argparse.Namespace) -> str:
    """The command line that continues this run: the user's own words (or, when called from
    Python, the parsed options), with --resume."""
    words = ["graphattn", "train"]
    if "train" in sys.argv[1:]:
        words += sys.argv[sys.argv.index("train", 1) + 1 :]
    else:
        for key, value in vars(args).items():
            if key == "verbose":
                words += ["-v"] * int(value or 0)
                continue
            if key.startswith("_") or key == "command" or value is None or value is False or value == []:
                continue
            if key in RANDOM_ENCODER and getattr(args, "init_from", None):
                continue  # the checkpoint gives the shape; --init-from refuses these
            if key == "sets":
                words += [w for text in value for w in ("--set", str(text))]
                continue
            flag = "--" + key.replace("_", "-")
            words += (
                [flag] if value is True else [flag, *map(str, value)] if isinstance(value, list) else [flag, str(value)]
            )
    words = [w for w in words if w != "--overwrite"]  # the run now holds what it should resume
    if "--resume" not in words:
        words.append("--resume")
    return " ".join(shlex.quote(w) for w in words)


def _throttle_callbacks() -> list:
    seconds = float(os.environ.get(THROTTLE_ENV, "0") or 0)
    if not seconds:
        return []
    import time

    return [lambda trainer, record: time.sleep(seconds)]


def check_arguments(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Everything that can be checked without torch or reading the training data; returns
    (shard sources, raw-record sources) of --data."""
    _check_unused_flags(args)
    if not args.init_from and args.hidden_size % args.heads:
        raise GraphattnError(f"--hidden-size {args.hidden_size} is not divisible by --heads {args.heads}")
    for flag, values in (("--data", args.data), ("--eval-data", args.eval_data)):
        missing = next((v for v in values if not path_exists(v)), None)
        if missing is not None:
            raise GraphattnError(f"{flag} {missing}: no such file or directory (nor a glob that matches one)")
    shards = [a for a in args.data if is_shard_source(a)]
    raw = [a for a in args.data if a not in shards]
    if shards and raw:
        raise GraphattnError(
            f"--data mixes compiled shards ({shards[0]}) and raw records ({raw[0]}); compile the records first"
        )
    if raw and (not args.schema or not args.tokenizer):
        raise GraphattnError(
            f"--data {raw[0]} is not compiled shards: compile it with `graphattn compile` first, or give "
            "--schema and --tokenizer to compile it into --out/compiled now"
        )
    if shards:
        _check_shard_flags(args, shards)
    elif raw:
        from graphattn.schema import load_schema

        load_schema(args.schema, list(getattr(args, "sets", None) or []))  # a bad --set stops before --out is touched
    if args.init_from and not Path(args.init_from).is_dir():
        raise GraphattnError(f"--init-from {args.init_from}: no such directory (a local BERT/RoBERTa checkpoint)")
    not_shards = next((v for v in args.eval_data if not is_shard_source(v)), None)
    if not_shards is not None:
        raise GraphattnError(
            f"--eval-data {not_shards}: not compiled shards (a directory of .parquet, or .parquet files)"
        )
    if args.eval_data:
        _check_eval_targets(args, shards)
    return shards, raw


def _check_unused_flags(args: argparse.Namespace) -> None:
    """Refuse flags that would be ignored with the others given; fill the random encoder's shape."""
    if args.init_from:
        given = [f"--{k.replace('_', '-')}" for k in RANDOM_ENCODER if getattr(args, k, None) is not None]
        if given:
            raise GraphattnError(
                f"{given[0]} shapes a random encoder, but --init-from {args.init_from} gives the encoder its shape "
                f"(its config): leave {', '.join(given)} out"
            )
    for key, value in RANDOM_ENCODER.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if getattr(args, "trust_undigested", False) and not args.resume:
        raise GraphattnError(
            "--trust-undigested applies to --resume (a newest checkpoint without digest.json); "
            "a new run has no checkpoint to trust"
        )


def _check_shard_flags(args: argparse.Namespace, shards: list[str]) -> None:
    """Flags that compile raw records do nothing to compiled shards: refused, naming the way to do it."""
    if args.tokenizer:
        raise GraphattnError(
            f"--tokenizer {args.tokenizer} compiles raw records, but --data {shards[0]} is compiled shards: their "
            "token ids are fixed (the shards record their tokenizer); leave --tokenizer out, or compile the "
            "records again with it (graphattn compile --tokenizer)"
        )
    sets = list(getattr(args, "sets", None) or [])
    if sets:
        raise GraphattnError(
            f"--set {sets[0]} changes the schema raw records are compiled with, but --data {shards[0]} is compiled "
            f"shards: compile them again with it (graphattn compile ... --set {sets[0]}) and train on those"
        )
    if args.schema:
        _check_schema_geometry(args.schema, shards)


def _check_schema_geometry(schema_arg: str, shards: list[str]) -> None:
    """--schema with shards picks their targets; its geometry must be the one they were compiled with."""
    from graphattn.schema import load_schema
    from graphattn.shards.reader import read_info, shard_paths
    from graphattn.train.run_match import schema_from_text

    first = shard_paths(shards)[0]
    text = read_info(first).schema_text
    try:
        compiled = schema_from_text(text, first)
    except GraphattnError:
        return  # a footer without a readable schema (compiled from a dict): --schema is what says it
    given = load_schema(schema_arg)
    for key in ("local_radius", "relative_pos_max_distance", "relative_vocab_size", "labels"):
        have, want = getattr(compiled, key), getattr(given, key)
        if have != want:
            raise GraphattnError(
                f"--schema {schema_arg}: its {key} is {want}, but the shards were compiled with {have}; with shards, "
                "--schema picks targets only: give the schema they were compiled with (or leave --schema out)",
                file=first,
            )


def _check_eval_targets(args: argparse.Namespace, shards: list[str]) -> None:
    """--eval-data fits the model this run trains: each of its targets, of the same kind, and
    (against shards --data) the same geometry and tokenizer (`graphattn.train.run_match`, the
    comparison `evaluate` makes); read from the footers and the schema, not the rows."""
    from graphattn.schema import load_schema
    from graphattn.train.run_match import check_shards_match

    schema = load_schema(args.schema, list(getattr(args, "sets", None) or [])) if args.schema else None
    check_shards_match(shards or None, args.eval_data, flag="--eval-data", targets=args.targets, schema=schema)


def _is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def run(args: argparse.Namespace) -> int:
    shards, raw = check_arguments(args)  # before rundir, whose encoder bounds import torch
    from graphattn.train.rundir import claim_run_directory, settings_of

    settings = settings_of(vars(args))
    lock = (
        claim_run_directory(
            args.out,
            resume=args.resume,
            overwrite=args.overwrite,
            settings=settings,
            trust_undigested=args.trust_undigested,
        )
        if _is_rank_zero()
        else contextlib.nullcontext()
    )
    with lock:
        return _train(args, shards, raw, settings)


def _train(args: argparse.Namespace, shards: list[str], raw: list[str], settings: dict) -> int:
    from graphattn.cli import Terminated
    from graphattn.train.distributed import cleanup_distributed, init_distributed, is_main_process
    from graphattn.train.finetune import fine_tune
    from graphattn.train.loop import TrainingInterrupted

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        init_distributed()
    try:
        data = shards or [compile_raw(raw, args)]
        callbacks = _throttle_callbacks()
        result = fine_tune(
            data,
            args.out,
            steps=args.steps,
            epochs=args.epochs,
            batch_size=args.batch_size,
            learning_rate=args.lr,
            optimizer=args.optimizer,
            warmup_ratio=args.warmup_ratio,
            accumulate=args.accumulate,
            precision=args.precision,
            checkpoint_every=args.checkpoint_every,
            resume=args.resume,
            seed=args.seed,
            workers=args.workers,
            buffer_size=args.buffer_size,
            init_from=args.init_from,
            hidden_size=args.hidden_size,
            layers=args.layers,
            heads=args.heads,
            dropout=args.dropout,
            targets=args.targets,
            schema=args.schema if shards else None,
            progress=verbosity(args) >= 0,
            print_fn=print if is_main_process() else None,
            callbacks=callbacks,
            log_every=1 if callbacks else args.log_every,
            settings=settings,
            verify_sha256=args.verify_sha256,
            trust_undigested=args.trust_undigested,
        )
    except TrainingInterrupted as stop:
        if is_main_process():
            where = f"checkpoint {stop.checkpoint}" if stop.checkpoint else "no checkpoint"
            if stop.unsaved:
                where = f"the data loader's workers ended during step {stop.step + 1}, so the newest is {where}"
            how = "SIGTERM" if stop.signal == signal.SIGTERM else "Ctrl-C"
            print(
                f"graphattn train: interrupted ({how}) at step {stop.step}; {where}. Resume with:\n"
                f"  {resume_command(args)}",
                file=sys.stderr,
            )
        return EXIT_SIGNAL_BASE + int(stop.signal)
    except KeyboardInterrupt as stop:  # before the first step: nothing trained, nothing to save
        print("graphattn train: interrupted before training started; nothing was saved", file=sys.stderr)
        return EXIT_SIGNAL_BASE + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
    finally:
        if distributed:
            cleanup_distributed()
    if is_main_process():
        last = result.history[-1] if result.history else {}
        rate = f", {result.steps_run / result.seconds:.2f} steps/s" if result.seconds > 0 and result.steps_run else ""
        print(
            f"trained {result.step} steps; last loss {last.get('loss', float('nan')):.4f}; "
            f"checkpoint {result.checkpoint} ({result.steps_run} step(s) in {result.seconds:.1f} s{rate}); "
            f"log {Path(args.out) / 'log.jsonl'}"
        )
        if args.eval_data:
            from graphattn.train.evaluate import evaluate_model, report_lines

            report = evaluate_model(
                args.out, args.eval_data, batch_size=args.batch_size, verify_sha256=args.verify_sha256
            )
            print("\n".join(report_lines(report)))
    return 0
