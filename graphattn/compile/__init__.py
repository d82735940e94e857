"""Lowering passes: DocGraph + relation schema + tokenizer -> ETC inputs (see compiler.py).

The package is itself callable: ``graphattn.compile(graph, schema, tokenizer)`` is
`graphattn.compile.compiler.compile`, so the natural spelling works although the package and
the function share a name (``from graphattn import compile`` gives this callable package).
"""

import sys
import types

from graphattn.compile.collate import collate
from graphattn.compile.compact import CompactSideInputs
from graphattn.compile.compiler import Packed, compile, compile_many, compile_windows, pack, pack_groups, prepare
from graphattn.compile.contract import EtcBatch, EtcInstance, SideInputs, TruncationReport
from graphattn.compile.labels import LabelVocab

__all__ = [
    "CompactSideInputs",
    "EtcBatch",
    "EtcInstance",
    "LabelVocab",
    "Packed",
    "SideInputs",
    "TruncationReport",
    "collate",
    "compile",
    "compile_many",
    "compile_windows",
    "pack",
    "pack_groups",
    "prepare",
]


class _CallableModule(types.ModuleType):
    """A module whose call is `compile` (the package name shadows the function's)."""

    def __call__(self, *args, **kwargs):
        return compile(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
