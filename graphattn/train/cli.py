"""`graphattn train --data SHARDS... --out DIR (--steps N | --epochs N)`: fine-tune on compiled shards.

    graphattn compile data/hotpot_train.json --schema hotpotqa --tokenizer tokenizer.json --out shards/hotpot
    graphattn train --data shards/hotpot --out runs/hotpot --steps 2000 --init-from ./bert-base-uncased
    graphattn evaluate --model runs/hotpot --data shards/hotpot-dev

--data names compiled shards: directories, .parquet files or globs. A head is trained for every
target of the schema the shards were compiled with (`--targets` picks some); the shards are
streamed (`graphattn.train.finetune`), nothing is compiled again. Raw records (anything
`graphattn compile` reads) are compiled into DIR/compiled first, with --schema and --tokenizer,
and the command says so; later runs reuse that directory. Checkpoints and run.json go to DIR;
--resume continues exactly. Ctrl-C finishes the step under way, saves a checkpoint, prints the
command that resumes, and exits 130. Under `torchrun` it runs DDP.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import sys
from pathlib import Path

from graphattn.cli import add_verbosity_arguments, verbosity
from graphattn.errors import GraphattnError
from graphattn.shards.inspect import add_verify_argument

THROTTLE_ENV = "GRAPHATTN_TRAIN_THROTTLE"  # seconds to sleep after each step (tests interrupt runs with it)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data",
        required=True,
        nargs="+",
        metavar="SHARDS",
        help="compiled shards: directories, .parquet files or globs (raw records are compiled first)",
    )
    parser.add_argument("--out", required=True, help="directory for checkpoints and run.json")
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=int, help="optimizer steps")
    length.add_argument("--epochs", type=int, help="passes over --data")
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
    parser.add_argument(
        "--init-from",
        help="start the encoder from a local checkpoint: an ETC checkpoint directory (etc_config.json + "
        "model.ckpt.*, e.g. etc_base_2x_pretrain) or a HF BERT/RoBERTa directory to lift",
    )
    parser.add_argument("--hidden-size", type=int, default=256, help="random encoder (no --init-from): hidden size")
    parser.add_argument("--layers", type=int, default=4, help="random encoder: layers")
    parser.add_argument("--heads", type=int, default=4, help="random encoder: attention heads")
    parser.add_argument("--dropout", type=float, default=0.1, help="random encoder: hidden dropout")
    parser.add_argument("--batch-size", type=int, default=8, help="instances per step and process")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--optimizer", choices=("adamw", "lamb"), default="adamw")
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--accumulate", type=int, default=1, help="batches per optimizer step")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: at the end, and on Ctrl-C)"
    )
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint under --out")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes reading shards (default 0)")
    parser.add_argument("--buffer-size", type=int, default=1024, help="instances in the shuffle buffer (default 1024)")
    parser.add_argument("--seed", type=int, default=0)
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
            flag = "--" + key.replace("_", "-")
            words += (
                [flag] if value is True else [flag, *map(str, value)] if isinstance(value, list) else [flag, str(value)]
            )
    if "--resume" not in words:
        words.append("--resume")
    return " ".join(shlex.quote(w) for w in words)


def _throttle_callbacks() -> list:
    seconds = float(os.environ.get(THROTTLE_ENV, "0") or 0)
    if not seconds:
        return []
    import time

    return [lambda trainer, record: time.sleep(seconds)]


def run(args: argparse.Namespace) -> int:
    from graphattn.train.distributed import cleanup_distributed, init_distributed, is_main_process
    from graphattn.train.finetune import fine_tune
    from graphattn.train.loop import TrainingInterrupted

    shards = [a for a in args.data if is_shard_source(a)]
    raw = [a for a in args.data if a not in shards]
    if shards and raw:
        raise GraphattnError(
            f"--data mixes compiled shards ({shards[0]}) and raw records ({raw[0]}); compile the records first"
        )
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
            log_every=1 if callbacks else 10,
            verify_sha256=args.verify_sha256,
        )
    except TrainingInterrupted as stop:
        if is_main_process():
            where = f"checkpoint {stop.checkpoint}" if stop.checkpoint else "no checkpoint"
            print(
                f"graphattn train: interrupted at step {stop.step}; {where}. Resume with:\n  {resume_command(args)}",
                file=sys.stderr,
            )
        return 130
    except KeyboardInterrupt:  # before the first step: nothing trained, nothing to save
        print("graphattn train: interrupted before training started; nothing was saved", file=sys.stderr)
        return 130
    finally:
        if distributed:
            cleanup_distributed()
    if is_main_process():
        last = result.history[-1] if result.history else {}
        rate = f", {result.steps_run / result.seconds:.2f} steps/s" if result.seconds > 0 and result.steps_run else ""
        print(
            f"trained {result.step} steps; last loss {last.get('loss', float('nan')):.4f}; "
            f"checkpoint {result.checkpoint} ({result.steps_run} step(s) in {result.seconds:.1f} s{rate})"
        )
        if args.eval_data:
            from graphattn.train.evaluate import evaluate_model, report_lines

            report = evaluate_model(
                args.out, args.eval_data, batch_size=args.batch_size, verify_sha256=args.verify_sha256
            )
            print("\n".join(report_lines(report)))
    return 0
