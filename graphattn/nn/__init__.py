"""The ETC encoder: config, global-local attention module, post-LN layer and encoder stack.

Other attention patterns (Longformer, LongNet, Compressive) live in graphattn.patterns and plug in
through `AttentionPattern` and the layer's `memory` argument."""

from graphattn.nn.attention import AttentionPattern, GlobalLocalAttention
from graphattn.nn.config import EtcConfig
from graphattn.nn.encoder import EtcEmbeddings, EtcEncoder, EtcLayer

__all__ = [
    "AttentionPattern",
    "EtcConfig",
    "GlobalLocalAttention",
    "EtcLayer",
    "EtcEmbeddings",
    "EtcEncoder",
    "load_etc_checkpoint",
]


def __getattr__(name: str):
    """`load_etc_checkpoint` on first use: the checkpoint reader's imports stay out of `import graphattn.nn`."""
    if name == "load_etc_checkpoint":
        from graphattn.nn.etc_checkpoint import load_etc_checkpoint

        return load_etc_checkpoint
    raise AttributeError(f"module 'graphattn.nn' has no attribute {name!r}")
