"""The ETC encoder: config, global-local attention module, post-LN layer and encoder stack.

Other attention patterns (Longformer, LongNet, Compressive) live in graphattn.patterns and plug in
through `AttentionPattern` and the layer's `memory` argument."""

from graphattn.nn.attention import AttentionPattern, GlobalLocalAttention
from graphattn.nn.config import EtcConfig
from graphattn.nn.encoder import EtcEmbeddings, EtcEncoder, EtcLayer

__all__ = ["AttentionPattern", "EtcConfig", "GlobalLocalAttention", "EtcLayer", "EtcEmbeddings", "EtcEncoder"]
