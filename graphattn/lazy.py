"""Package attributes imported on first use (PEP 562), one mechanism for every package that
re-exports: importing a package stays cheap (a shard reader loads no schema loader, `train
--help` no torch) while `from graphattn.x import Name` keeps working."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose names in `exports` live in the named modules."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)  # later look-ups find it without this function
        return value

    def __dir__() -> list[str]:
        return sorted([*vars(sys.modules[package]), *exports])

    return __getattr__, __dir__
