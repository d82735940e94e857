"""ETC pre-training: whole-word MLM on long tokens plus CPC on sentence globals.

    from graphattn.compile.masking import PretrainingDataset, TokenInfo, collate_pretraining
    data = DataLoader(PretrainingDataset(instances, TokenInfo.from_tokenizer(tok), seed=0),
                      batch_size=8, shuffle=True, collate_fn=collate_pretraining)
    model = PretrainingModel(EtcEncoder(config))
    train(model, data, max_steps=1000)          # graphattn.train's loop; or any loop: model(batch)["loss"]

CPC (ETC section 3.5; Oord et al. 2018): for each CPC-masked sentence s, the full (masked) input's
final hidden state of s's sentence global, projected by W, is the prediction z_s; the same encoder
reading s alone gives c_s (the final state of that instance's only global). With every CPC
sentence of the batch as a candidate, the loss is InfoNCE with bilinear scores:

    L_CPC = mean_s  -log softmax_t( z_s . c_t / temperature )[t = s]

Positives are matched by identity: row s of the sentence batch IS sentence s, whatever its text.
Two sentences with identical tokens encode identically, so each would be a negative of the other
that no model can tell apart; by default such duplicates leave the denominator
(`exclude_duplicate_negatives`). Gradients flow into both sides (one shared encoder, as ETC).

Total loss = mlm_weight * L_MLM + cpc_weight * L_CPC (0.8 / 0.2 as in ETC appendix C).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from graphattn.compile.masking import IGNORE_INDEX, PretrainingBatch
from graphattn.errors import GraphattnError
from graphattn.nn.encoder import EtcEncoder
from graphattn.nn.pretraining_heads import CpcHead, MlmHead


@dataclass(frozen=True)
class PretrainingConfig:
    """Loss weights and the CPC temperature (1.0: CPC's plain bilinear score)."""

    mlm_weight: float = 0.8
    cpc_weight: float = 0.2
    cpc_temperature: float = 1.0
    exclude_duplicate_negatives: bool = True

    def __post_init__(self) -> None:
        if self.mlm_weight < 0 or self.cpc_weight < 0 or self.mlm_weight + self.cpc_weight == 0:
            raise GraphattnError(
                f"loss weights must be >= 0 and not both 0, got mlm {self.mlm_weight}, cpc {self.cpc_weight}",
                path=("PretrainingConfig", "mlm_weight"),
            )
        if self.cpc_temperature <= 0:
            raise GraphattnError(
                f"must be > 0, got {self.cpc_temperature}", path=("PretrainingConfig", "cpc_temperature")
            )


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy, accuracy) over the predicted positions; logits [n, V], labels [n].
    With no predicted position both are 0 (a batch can lack masks when every word is CPC'd)."""
    if labels.numel() == 0:
        zero = logits.sum() * 0.0
        return zero, zero.detach()
    loss = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)
    accuracy = (logits.argmax(-1) == labels).float().mean()
    return loss, accuracy.detach()


def info_nce_loss(
    predictions: torch.Tensor,
    targets: torch.Tensor,
    exclude: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """In-batch InfoNCE: row s of `predictions` [S, D] should pick row s of `targets` [S, D]
    among all S rows. `exclude` [S, S] bool drops negatives (never the diagonal). Returns
    (mean loss, accuracy of picking the right row)."""
    if predictions.shape != targets.shape or predictions.ndim != 2:
        raise GraphattnError(
            f"predictions {tuple(predictions.shape)} and targets {tuple(targets.shape)} must both be [S, D]"
        )
    scores = (predictions.float() @ targets.float().t()) / temperature
    if exclude is not None:
        eye = torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)
        scores = scores.masked_fill(exclude.bool() & ~eye, float("-inf"))
    positives = torch.arange(scores.shape[0], device=scores.device)
    loss = F.cross_entropy(scores, positives)
    accuracy = (scores.argmax(-1) == positives).float().mean()
    return loss, accuracy.detach()


class PretrainingModel(nn.Module):
    """An EtcEncoder with the MLM head (tied to its word embeddings) and the CPC projection.

    `forward(batch)` returns a dict of scalar tensors: loss (the weighted total), mlm_loss,
    cpc_loss, mlm_accuracy, cpc_accuracy, cpc_sentences: what graphattn.train's loop logs."""

    def __init__(self, encoder: EtcEncoder, config: PretrainingConfig = PretrainingConfig()):
        super().__init__()
        self.encoder = encoder
        self.config = config
        self.mlm = MlmHead(encoder.config, encoder.embeddings.word_embeddings)
        self.cpc = CpcHead(encoder.config)

    def load_heads(self, tensors: dict[str, torch.Tensor]) -> list[str]:
        """Start the MLM and CPC heads from a checkpoint's (`LiftReport.unused` of
        `lift_pretrained` or `load_etc_checkpoint`); returns the names copied."""
        return self.mlm.load_lifted(tensors) + self.cpc.load_lifted(tensors)

    def mlm_logits(self, long_hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Vocabulary logits at predicted positions only ([n, V], labels [n]): the [B, L, V]
        tensor is never built."""
        chosen = labels != IGNORE_INDEX
        return self.mlm(long_hidden[chosen]), labels[chosen]

    def cpc_vectors(self, global_hidden: torch.Tensor, batch: PretrainingBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(predictions [S, D] from the full input, targets [S, D] from each sentence alone)."""
        rows, cols = batch.cpc_index[:, 0], batch.cpc_index[:, 1]
        predictions = self.cpc(global_hidden[rows, cols])
        sentence_global, _ = self.encoder(batch.sentences)
        return predictions, sentence_global[:, 0]

    def forward(self, batch: PretrainingBatch) -> dict[str, torch.Tensor]:
        cfg = self.config
        global_hidden, long_hidden = self.encoder(batch.batch)
        mlm, mlm_acc = mlm_loss(*self.mlm_logits(long_hidden, batch.mlm_labels))
        if batch.num_cpc > 0 and batch.sentences is not None:
            predictions, targets = self.cpc_vectors(global_hidden, batch)
            exclude = batch.cpc_duplicates if cfg.exclude_duplicate_negatives else None
            cpc, cpc_acc = info_nce_loss(predictions, targets, exclude, cfg.cpc_temperature)
        else:
            # No CPC sentence in this batch: a zero that still touches the CPC head, so that DDP
            # sees the same parameters take part in every step.
            cpc = sum(p.sum() for p in self.cpc.parameters()) * 0.0
            cpc_acc = cpc.detach()
        loss = cfg.mlm_weight * mlm + cfg.cpc_weight * cpc
        return {
            "loss": loss,
            "mlm_loss": mlm.detach(),
            "cpc_loss": cpc.detach(),
            "mlm_accuracy": mlm_acc,
            "cpc_accuracy": cpc_acc,
            "cpc_sentences": torch.tensor(float(batch.num_cpc), device=loss.device),
        }


__all__ = ["PretrainingConfig", "PretrainingModel", "info_nce_loss", "mlm_loss"]
