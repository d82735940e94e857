"""An encoder plus one task head as a trainable model: forward((batch, targets)) -> {"loss": ...}.

    model = TaskModel(encoder, "wikihop")
    Trainer(model, TrainConfig(max_steps=100)).fit(InstanceLoader(examples, 8, collate_examples))
    model.predict(batch)          # task-specific decoded output

The targets come from `graphattn.train.targets`; which ones each task needs is in TASK_TARGETS.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from graphattn.contract import EtcBatch
from graphattn.errors import GraphattnError
from graphattn.nn.encoder import EtcEncoder
from graphattn.nn.heads import CandidateScoringHead, KeyphraseHead, SpanExtractionHead, SupportingFactsHead

TASK_TARGETS = {
    "wikihop": ("candidate_mask", "answer_position"),
    "hotpotqa": ("sentence_mask", "supporting"),
    "nq": ("start_position", "end_position", "answer_type"),
    "openkp": ("ngram_labels",),
}


class TaskModel(nn.Module):
    """EtcEncoder + the head of `task` (wikihop | hotpotqa | nq | openkp)."""

    def __init__(self, encoder: EtcEncoder, task: str, **head_options: Any):
        super().__init__()
        if task not in TASK_TARGETS:
            raise GraphattnError(f"unknown task {task!r}; expected one of {', '.join(TASK_TARGETS)}", path=("task",))
        self.task, self.encoder = task, encoder
        hidden = encoder.config.hidden_size
        self.head = {"wikihop": CandidateScoringHead, "hotpotqa": SupportingFactsHead, "nq": SpanExtractionHead,
                     "openkp": KeyphraseHead}[task](hidden, **head_options)

    def logits(self, batch: EtcBatch, targets: dict[str, torch.Tensor] | None = None) -> Any:
        global_hidden, long_hidden = self.encoder(batch)
        targets = targets or {}
        if self.task == "wikihop":
            return self.head(global_hidden, self._need(targets, "candidate_mask"))
        if self.task == "hotpotqa":
            return self.head(global_hidden)
        if self.task == "nq":
            return self.head(global_hidden, long_hidden, batch.long_input_mask)
        return self.head(long_hidden, batch.long_input_mask, targets.get("ngram_mask"))

    def _need(self, targets: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        if name not in targets:
            raise GraphattnError(f"task {self.task!r} needs target {name!r} (see graphattn.train.targets)", path=(name,))
        return targets[name]

    def forward(self, example: tuple[EtcBatch, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        batch, targets = example
        for name in TASK_TARGETS[self.task]:
            self._need(targets, name)
        logits = self.logits(batch, targets)
        if self.task == "wikihop":
            loss = self.head.loss(logits, targets["answer_position"], targets["candidate_mask"])
            return {"loss": loss, "accuracy": (self.head.predict(logits) == targets["answer_position"]).float().mean()}
        if self.task == "hotpotqa":
            return {"loss": self.head.loss(logits, targets["supporting"], targets["sentence_mask"])}
        if self.task == "nq":
            return {"loss": self.head.loss(logits, targets["start_position"], targets["end_position"], targets["answer_type"])}
        return {"loss": self.head.loss(logits, targets["ngram_labels"])}

    @torch.no_grad()
    def predict(self, batch: EtcBatch, targets: dict[str, torch.Tensor] | None = None) -> Any:
        """wikihop: [B] candidate global position; hotpotqa: [B, G] supporting flags (needs
        sentence_mask); nq: SpanPrediction (spans inside the real long tokens); openkp: Keyphrases."""
        logits = self.logits(batch, targets)
        if self.task == "wikihop":
            return self.head.predict(logits)
        if self.task == "hotpotqa":
            return self.head.predict(logits, self._need(targets or {}, "sentence_mask"))
        if self.task == "nq":
            return self.head.decode(logits, batch.long_input_mask)
        return self.head.predict(logits)
