"""Pre-training heads: BERT's masked-LM head and ETC's CPC projection.

Names follow HF BERT's `BertLMPredictionHead` (dense, LayerNorm, decoder bias) so that weight
lifting can copy a checkpoint's `cls.predictions.*` into `MlmHead` as a rename.
"""

from __future__ import annotations

import torch
from torch import nn

from graphattn.errors import GraphattnError
from graphattn.nn.config import EtcConfig
from graphattn.nn.encoder import _ACTIVATIONS


class MlmHead(nn.Module):
    """hidden -> dense -> activation -> LayerNorm -> vocabulary logits, the output matrix tied to
    the encoder's word embeddings (as BERT's), plus its own bias. With an `embedding_size`
    narrower than hidden_size (ALBERT-style) `dense` maps to the embedding width, which the tied
    matrix needs."""

    def __init__(self, config: EtcConfig, word_embeddings: nn.Embedding):
        super().__init__()
        width = word_embeddings.embedding_dim
        self.dense = nn.Linear(config.hidden_size, width)
        self.activation = _ACTIVATIONS[config.hidden_act]()
        self.layer_norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.word_embeddings = word_embeddings  # shared, not a copy: the decoder is tied
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        nn.init.normal_(self.dense.weight, std=config.initializer_range)
        nn.init.zeros_(self.dense.bias)

    def load_lifted(self, tensors: dict[str, torch.Tensor]) -> list[str]:
        """Copy a BERT (`cls.predictions.*`) or RoBERTa (`lm_head.*`) MLM head, as handed back
        in `LiftReport.unused`; returns the HF names copied (none when the checkpoint has no head).
        The decoder matrix is the tied word embedding and is not copied."""
        names = {
            "dense.weight": ("cls.predictions.transform.dense.weight", "lm_head.dense.weight"),
            "dense.bias": ("cls.predictions.transform.dense.bias", "lm_head.dense.bias"),
            "layer_norm.weight": ("cls.predictions.transform.LayerNorm.weight", "lm_head.layer_norm.weight"),
            "layer_norm.bias": ("cls.predictions.transform.LayerNorm.bias", "lm_head.layer_norm.bias"),
            "bias": ("cls.predictions.bias", "lm_head.bias"),
        }
        own = dict(self.named_parameters())
        copied = []
        for mine, theirs in names.items():
            found = next((name for name in theirs if name in tensors), None)
            if found is None:
                continue
            if tuple(tensors[found].shape) != tuple(own[mine].shape):
                raise GraphattnError(
                    f"{found} has shape {list(tensors[found].shape)}, the MLM head's {mine} {list(own[mine].shape)}",
                    path=(found,),
                )
            with torch.no_grad():
                own[mine].copy_(tensors[found])
            copied.append(found)
        return copied

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., D] -> [..., vocab] logits."""
        x = self.layer_norm(self.activation(self.dense(hidden)))
        return x @ self.word_embeddings.weight.t() + self.bias


class CpcHead(nn.Module):
    """The learned projection W of CPC's bilinear score z^T W c: it maps the full input's sentence
    global (the context's prediction) into the space of the sentence encoded alone."""

    def __init__(self, config: EtcConfig):
        super().__init__()
        self.projection = nn.Linear(config.hidden_size, config.hidden_size)
        nn.init.normal_(self.projection.weight, std=config.initializer_range)
        nn.init.zeros_(self.projection.bias)

    def load_lifted(self, tensors: dict[str, torch.Tensor]) -> list[str]:
        """Copy a CPC projection handed back by `load_etc_checkpoint` (`cls.cpc.projection.*`,
        torch layout); returns the names copied (none when the checkpoint has no CPC head)."""
        copied = []
        for mine, param in self.projection.named_parameters():
            name = f"cls.cpc.projection.{mine}"
            if name not in tensors:
                continue
            if tuple(tensors[name].shape) != tuple(param.shape):
                raise GraphattnError(
                    f"{name} has shape {list(tensors[name].shape)}, the CPC head's {mine} {list(param.shape)}",
                    path=(name,),
                )
            with torch.no_grad():
                param.copy_(tensors[name])
            copied.append(name)
        return copied

    def forward(self, global_hidden: torch.Tensor) -> torch.Tensor:
        return self.projection(global_hidden)


__all__ = ["CpcHead", "MlmHead"]
