"""graphattn for Hugging Face models: packed documents, prefix trees and schema graphs as the
`attention_mask` of any model on transformers' attention interface (the optional extra `hf`).

    name = graphattn.hf.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name)
    batch = graphattn.hf.pack_documents(docs)
    model(**batch)

docs/HF.md explains the pieces; transformers is imported only inside the calls that need it.
"""

from graphattn.hf.attention import register
from graphattn.hf.chunked import chunked_attention
from graphattn.hf.pack import PackingCollator, pack_documents, pack_tree, tree_lm_loss
from graphattn.hf.parity import ParityReport, check_parity, leaf_paths, tree_token_ratio
from graphattn.hf.prompts import BlockCache, Prefill
from graphattn.hf.schema import (
    attach_relative_bias,
    attention_modules,
    compile_schema,
    dense_mask,
    structure_from_instances,
)
from graphattn.hf.structure import GraphattnMaskError, LayerMask, LayerRule, Structure
from graphattn.hf.tree_decode import generate_tree

__all__ = [
    "BlockCache",
    "GraphattnMaskError",
    "LayerMask",
    "LayerRule",
    "PackingCollator",
    "ParityReport",
    "Prefill",
    "Structure",
    "attach_relative_bias",
    "attention_modules",
    "chunked_attention",
    "check_parity",
    "compile_schema",
    "dense_mask",
    "generate_tree",
    "leaf_paths",
    "pack_documents",
    "pack_tree",
    "register",
    "structure_from_instances",
    "tree_lm_loss",
    "tree_token_ratio",
]
