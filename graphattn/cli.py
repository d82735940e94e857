"""`graphattn` command line: one sub-command per stage, each owned by its stage's module.

Each owning module exposes ``add_arguments(parser)`` and ``run(args) -> int``; this file only
dispatches, and imports a stage's module only when its command runs or shows its help (so
`graphattn --help` and `graphattn compile --help` never import torch).

Exit status, for every sub-command: 0 done; 1 ran to the end but produced nothing or less than
asked (e.g. `compile` past --max-rejected); 2 bad usage or bad input, said in one line naming
the file; 130 interrupted (Ctrl-C), 143 terminated (SIGTERM, handled as Ctrl-C is: the command
stops cleanly, and `train` saves a checkpoint first).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

from graphattn import __version__
from graphattn.errors import GraphattnError, GraphattnWarning

EXIT_OK, EXIT_INCOMPLETE, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so that every command cleans up
    the same way for both (`kill`, batch schedulers and container stops send SIGTERM)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


DESCRIPTION = (
    "graphattn: compile structured documents (typed graphs + a relation schema) into ETC global-local "
    "inputs, inspect and draw them, train on them."
)


@dataclass(frozen=True)
class Command:
    module: str  # owns add_arguments(parser) and run(args)
    help: str
    example: str


COMMANDS = {
    "compile": Command(
        "graphattn.corpus.cli",
        "compile documents or a corpus into Parquet shards",
        "graphattn compile examples/data/hotpotqa_sample.json --schema hotpotqa --out shards/",
    ),
    "inspect": Command(
        "graphattn.shards.inspect",
        "summarize compiled shards and print an instance",
        "graphattn inspect shards/ --instance 0",
    ),
    "viz": Command(
        "graphattn.viz.cli",
        "draw the attention pattern of a compiled instance",
        "graphattn viz shards/shard-00000.parquet --out mask.png    "
        "(or a document: viz story.txt --schema etc-sentences --out mask.html)",
    ),
    "train": Command(
        "graphattn.train.cli",
        "fine-tune the schema's task heads on compiled shards (checkpoints, resume, DDP)",
        "graphattn train --data shards/ --out runs/hotpotqa --steps 20",
    ),
    "evaluate": Command(
        "graphattn.train.evaluate",
        "score a trained model on shards: each task's standard metric",
        "graphattn evaluate --model runs/hotpotqa --data shards/",
    ),
    "predict": Command(
        "graphattn.train.predict_cli",
        "a trained model's answers for new documents or shards: JSON lines or an official prediction file",
        "graphattn predict --model runs/hotpotqa dev.json --out predictions.jsonl",
    ),
    "plot": Command(
        "graphattn.train.plot",
        "draw a training run's learning curves (losses per target, learning rate) to a PNG",
        "graphattn plot runs/hotpotqa --out curves.png",
    ),
    "tokenizer": Command(
        "graphattn.tokenize.cli",
        "train a WordPiece tokenizer.json on your own text",
        "graphattn tokenizer train corpus.txt --vocab-size 8000 --out tokenizer.json",
    ),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; every option's default shown unless its help says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, argparse.SUPPRESS) or action.option_strings == []:
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {shown})"


def add_verbosity_arguments(parser: argparse.ArgumentParser, *quiet_aliases: str) -> None:
    """-q/--quiet and -v/--verbose, the same on every sub-command (read them with `verbosity`)."""
    group = parser.add_argument_group("output").add_mutually_exclusive_group()
    group.add_argument(
        "-q",
        "--quiet",
        *quiet_aliases,
        action="store_true",
        help="no progress bars or notes: results, warnings and errors only",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="say more where there is more to say (compile: the reason of every rejected document); "
        "-vv also shows the traceback of an error",
    )


def verbosity(args: argparse.Namespace) -> int:
    """-1 quiet, 0 normal, 1.. verbose."""
    return -1 if getattr(args, "quiet", False) else int(getattr(args, "verbose", 0) or 0)


def _subparser(name: str, sub, command: Command) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=command.help,
        description=command.help,
        formatter_class=HelpFormatter,
        epilog=f"example:\n  {command.example}\n\nexit status: 0 done, 1 incomplete result, "
        "2 bad usage or input, 130 interrupted",
    )


def build_parser(only: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser and its sub-parsers. Only the `only` command's arguments are loaded (its module
    imported): the top-level --help lists commands without importing any of them."""
    examples = "\n".join(f"  {c.example}" for c in COMMANDS.values())
    epilog = f"examples:\n{examples}\n\n`graphattn COMMAND --help` shows a command's options."
    parser = argparse.ArgumentParser(
        prog="graphattn", description=DESCRIPTION, formatter_class=HelpFormatter, epilog=epilog
    )
    parser.add_argument("--version", action="version", version=f"graphattn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {}
    for name, command in COMMANDS.items():
        parsers[name] = _subparser(name, sub, command)
        parsers[name].set_defaults(_module=command.module)
        if name == only:
            importlib.import_module(command.module).add_arguments(parsers[name])
    return parser, parsers


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse, with a bad flag reported against the sub-command's usage, not the top level's."""
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser, parsers = build_parser(only=chosen if chosen in COMMANDS else None)
    if chosen is not None and chosen not in COMMANDS and argv and argv[0] == chosen:
        close = difflib.get_close_matches(chosen, COMMANDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        parser.error(f"unknown command {chosen!r}{hint} (commands: {', '.join(COMMANDS)})")
    args, extra = parser.parse_known_args(argv)
    if extra:
        parsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    handle_term = threading.current_thread() is threading.main_thread()
    handle_term = handle_term and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if handle_term:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return _run(args)
    finally:
        if handle_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(args: argparse.Namespace) -> int:
    name = " ".join(["graphattn", args.command, *([args.action] if getattr(args, "action", None) else [])])
    try:
        with one_line_warnings(name):
            return int(importlib.import_module(args._module).run(args) or 0)
    except GraphattnError as err:
        return _fail(args, name, str(err))
    except KeyboardInterrupt as stop:
        print(f"{name}: {'terminated (SIGTERM)' if isinstance(stop, Terminated) else 'interrupted'}", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED
    except BrokenPipeError:  # `graphattn inspect DIR | head`: the reader has gone, nothing to say
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        return EXIT_OK
    except OSError as err:  # the file system said no (permissions, disk full, ...): name the path
        return _fail(args, name, describe_os_error(err))
    except MemoryError as err:
        return _fail(args, name, f"out of memory ({err or 'an allocation failed'}); try a smaller input or range")


@contextlib.contextmanager
def one_line_warnings(name: str) -> Iterator[None]:
    """Each of our warnings (`GraphattnWarning`) said once, in one line on stderr, instead of
    Python's two lines with a source line; other warnings as Python shows them."""
    shown = warnings.showwarning
    said: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, GraphattnWarning):
            return shown(message, category, filename, lineno, file, line)
        text = str(message).removeprefix("graphattn: ")
        if text not in said:
            said.add(text)
            print(f"{name}: warning: {text}", file=sys.stderr)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def _fail(args: argparse.Namespace, name: str, message: str) -> int:
    if getattr(args, "verbose", 0) >= 2:
        raise  # noqa: PLE0704 - re-raised inside the caller's except block: the traceback was asked for
    print(f"{name}: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def describe_os_error(err: OSError) -> str:
    """`path: what went wrong` in one line, for an OSError that reached the command line."""
    what = err.strerror or str(err)
    paths = " -> ".join(str(p) for p in (err.filename, err.filename2) if p is not None)
    return f"{paths}: {what}" if paths else what


if __name__ == "__main__":
    sys.exit(main())
