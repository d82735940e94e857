"""The ETC encoder: config, global-local attention module, post-LN layer and encoder stack."""

from graphattn.nn.attention import GlobalLocalAttention
from graphattn.nn.config import EtcConfig
from graphattn.nn.encoder import EtcEmbeddings, EtcEncoder, EtcLayer

__all__ = ["EtcConfig", "GlobalLocalAttention", "EtcLayer", "EtcEmbeddings", "EtcEncoder"]
