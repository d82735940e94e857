"""`graphattn` command line: one sub-command per stage, each owned by its stage's module.

Each owning module exposes ``add_arguments(parser)`` and ``run(args) -> int``; this file only
dispatches, and imports a stage's module only when its command runs (so `graphattn viz` does not
pay for Ray or the encoder).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from graphattn.errors import GraphattnError

COMMANDS = {
    "compile": ("graphattn.corpus.cli", "compile documents or a corpus into Parquet shards"),
    "inspect": ("graphattn.shards.inspect", "summarize compiled shards and print an instance"),
    "viz": ("graphattn.viz.cli", "draw the attention pattern of a compiled instance"),
    "train": ("graphattn.train.cli", "fine-tune the schema's task heads on compiled shards (checkpoints, resume, DDP)"),
    "evaluate": ("graphattn.train.evaluate", "score a trained model on compiled shards: each task's standard metric"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `only`, just that command's arguments are loaded (fast start)."""
    parser = argparse.ArgumentParser(prog="graphattn", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(_module=module_name)
        if only is None or name == only:
            importlib.import_module(module_name).add_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(only=chosen).parse_args(argv)
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except GraphattnError as err:
        print(f"graphattn {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
