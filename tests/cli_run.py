"""`graphattn ARGV...` run in the test's own process, for tests that read its exit status and output."""

from __future__ import annotations

from graphattn.cli import main


def run_main(capsys, argv: list) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `graphattn *argv`; argparse's exits (usage errors, --help) included."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit:
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err
