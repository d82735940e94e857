"""The other attention patterns, built on the ETC layer's extension point (graphattn.nn).

An ETC layer projects and an attention pattern attends (`graphattn.nn.AttentionPattern`: the
`attend(global_q, global_k, global_v, long_q, long_k, long_v, ...)` of a prepared ETC attention);
extra key/value `memory` rows enter as key-only global slots. The patterns here use that instead
of copies of the layer:

    longformer.py, longformer_inputs.py   Longformer (Beltagy et al. 2020): dilated sliding windows
        sliding.py                        per layer and head plus task-chosen global positions with
                                          their own projections, on the ETC kernels; HF parity
    longnet.py, dilated.py,               LongNet (Ding et al. 2023): dilated attention over
        dilated_parallel.py,              (segment, dilation) pairs, single process or sequence-
        segment_attention.py              parallel; LongNetPattern runs it inside an ETC layer
    compressive.py, compression.py,       Compressive Transformer (Rae et al. 2019): FIFO and
        segments.py                       compressed memories as key-only slots of every layer
"""

from graphattn.patterns.compressive import CompressiveConfig, CompressiveEncoder
from graphattn.patterns.longformer import LongformerConfig, LongformerEncoder, LongformerPattern
from graphattn.patterns.longnet import LongNetAttention, LongNetPattern

__all__ = [
    "CompressiveConfig",
    "CompressiveEncoder",
    "LongformerConfig",
    "LongformerEncoder",
    "LongformerPattern",
    "LongNetAttention",
    "LongNetPattern",
]
