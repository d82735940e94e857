"""Lowering passes: DocGraph + relation schema + tokenizer -> ETC inputs (see compiler.py).

The entry points are `compile_instance` (one instance; a list of graphs packs them),
`compile_windows`, `compile_many` (many documents per call), `pack` and `pack_groups`;
`collate` pads instances into an `EtcBatch`. The function is not called `compile`: this
package has that name, and a package cannot also be a plain function without swapping its
module class (see docs/ARCHITECTURE.md).

Names load on first use, so that `graphattn.compile.batching` (all that shard readers need)
does not pull in the schema loader and the tokenizers.
"""

from graphattn.lazy import lazy_exports

_EXPORTS = {
    "collate": "graphattn.compile.batching",
    "Packed": "graphattn.compile.compiler",
    "compile_instance": "graphattn.compile.compiler",
    "compile_many": "graphattn.compile.compiler",
    "compile_windows": "graphattn.compile.compiler",
    "load_schema_and_tokenizer": "graphattn.compile.compiler",
    "pack": "graphattn.compile.compiler",
    "pack_groups": "graphattn.compile.compiler",
    "special_token_ids": "graphattn.compile.compiler",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
