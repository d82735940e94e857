"""graphattn: compile typed document graphs into ETC global-local transformer inputs.

The public API is importable from here; names load on first use so that ``import graphattn``
(e.g. for the CLI's --help) does not pay for torch.
"""

from graphattn.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "DocGraph": "graphattn.graph",
    "load_schema": "graphattn.schema",
    "Schema": "graphattn.schema",
    "load_tokenizer": "graphattn.tokenize",
    "compile_instance": "graphattn.compile.compiler",
    "compile_windows": "graphattn.compile.compiler",
    "pack": "graphattn.compile.compiler",
    "pack_groups": "graphattn.compile.compiler",
    "collate": "graphattn.compile.batching",
    "CompactSideInputs": "graphattn.compact",
    "EtcInstance": "graphattn.contract",
    "EtcBatch": "graphattn.contract",
    "SideInputs": "graphattn.contract",
    "TruncationReport": "graphattn.contract",
    "LabelVocab": "graphattn.labels",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
