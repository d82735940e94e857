"""Argument types and checks shared by `graphattn train` and `graphattn evaluate`: no torch here,
so that every argument is checked (and `--help` answers) before torch is imported."""

from __future__ import annotations

import argparse
import glob
from pathlib import Path


def bounded(kind: type, low: float, high: float, *, low_open: bool = False):
    """An argparse type: a `kind` number within [low, high] (low excluded with low_open), or an
    argument error that names the bounds."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            expected = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        inside = (low < value if low_open else low <= value) and value <= high
        if not inside:
            opening = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"must be in {opening}{low:,}, {high:,}], got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def path_exists(arg: str) -> bool:
    """A file or directory, or a glob that matches at least one."""
    return Path(arg).exists() or (glob.has_magic(arg) and bool(glob.glob(arg, recursive=True)))
