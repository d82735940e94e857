"""An encoder plus one head per task target of the schema: forward(batch) -> {"loss": ...}.

    schema = load_schema("hotpotqa")                  # or the schema a shard footer carries
    model = TaskModel(encoder, schema)                # a head for `supporting` and one for `answer`
    Trainer(model, TrainConfig(max_steps=100)).fit(shard_loader("shards/", batch_size=8))
    model.predict(batch)                              # {"supporting": ..., "answer": ...}

The heads read `EtcBatch.targets`, the arrays the compiler lowered from the schema's `targets:`
section (`graphattn.schema.targets`), so a new task needs a schema file, not a new model. Each
target kind has its head (`graphattn.nn.heads`):

    global_labels  GlobalLabelHead       a class per global, cross-entropy over the labelled globals
    choice         CandidateScoringHead  a logit per candidate global, softmax over the candidates;
                                         the loss is -log of the probability mass of the chosen ones
    span           SpanExtractionHead    start / end over long tokens, the answer type from global 0
    spans          KeyphraseHead         a score per n-gram of long tokens, listwise over the gold rows

Targets that are TARGET_IGNORE contribute nothing; a batch where a target has no label at all
adds 0 for it (never NaN). The total loss is the sum over targets; each one's share is logged as
``loss/<name>``, and for choice and global_labels targets ``accuracy/<name>`` (the best candidate
is a chosen one; the labelled globals' classes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from graphattn.contract import TARGET_IGNORE, EtcBatch
from graphattn.errors import GraphattnError
from graphattn.nn.encoder import EtcEncoder
from graphattn.nn.heads import CandidateScoringHead, GlobalLabelHead, KeyphraseHead, SpanExtractionHead
from graphattn.schema.targets import TargetSpec
from graphattn.train.spans import NgramScores, SpanScores

DEFAULT_MAX_NGRAM = 10  # wordpieces per keyphrase n-gram the spans head scores (OpenKP phrases are short words)


def task_targets(source: Any) -> dict[str, TargetSpec]:
    """The targets of a Schema, a schema file or shipped name, or a mapping of TargetSpecs."""
    if isinstance(source, Mapping) and all(isinstance(v, TargetSpec) for v in source.values()):
        return dict(source)
    if isinstance(source, (str, os.PathLike, Mapping)):
        from graphattn.schema import load_schema

        source = load_schema(source)
    targets = dict(getattr(source, "targets", {}))
    if not targets:
        raise GraphattnError(
            "the schema declares no targets: there is nothing to train a head on (add a targets: section)",
            path=("targets",),
        )
    return targets


def _masked_mean(losses: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over the valid entries; 0 (with a gradient path) when there are none."""
    count = valid.sum()
    return (losses * valid).sum() / count.clamp(min=1)


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over rows whose target is not TARGET_IGNORE; 0 when none is."""
    valid = target != TARGET_IGNORE
    losses = F.cross_entropy(logits, target.clamp(min=0), reduction="none")
    return _masked_mean(losses, valid.float())


def _mass_loss(scores: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """-log(softmax mass of the gold entries) per row [B, ...] flattened, averaged over rows with gold."""
    flat, gold = scores.flatten(1), gold.flatten(1)
    floor = torch.finfo(flat.dtype).min
    losses = torch.logsumexp(flat, 1) - torch.logsumexp(flat.masked_fill(~gold, floor), 1)
    has_gold = gold.any(1)
    return _masked_mean(torch.where(has_gold, losses, torch.zeros_like(losses)), has_gold.float())


@dataclass
class TargetHead:
    """How one target trains: its spec, its head module and the three steps."""

    spec: TargetSpec

    def logits(self, head: nn.Module, global_hidden: torch.Tensor, long_hidden: torch.Tensor, batch: EtcBatch) -> Any:
        kind, name = self.spec.kind, self.spec.name
        if kind == "global_labels":
            return head(global_hidden)
        if kind == "choice":
            return head(global_hidden, batch.targets[name] != TARGET_IGNORE)
        if kind == "span":
            return head(global_hidden, long_hidden, batch.long_input_mask)
        return head(long_hidden, batch.long_input_mask)

    def loss(self, head: nn.Module, logits: Any, batch: EtcBatch) -> torch.Tensor:
        kind, name, targets = self.spec.kind, self.spec.name, batch.targets
        if kind == "global_labels":
            return _cross_entropy(logits.flatten(0, 1), targets[name].flatten())
        if kind == "choice":
            return _mass_loss(logits, targets[name] == 1)
        if kind == "span":
            start, end, types = (targets[f"{name}_{part}"] for part in ("start", "end", "type"))
            return (_cross_entropy(logits.start, start) + _cross_entropy(logits.end, end)) / 2 + _cross_entropy(
                logits.answer_type, types
            )
        return _mass_loss(logits, ngram_labels(targets[name], head.max_ngram, logits.shape[-1]))

    def accuracy(self, logits: Any, batch: EtcBatch) -> torch.Tensor | None:
        """Share right in this batch (choice, global_labels), None for the span kinds."""
        target = batch.targets[self.spec.name] if self.spec.kind in ("choice", "global_labels") else None
        if target is None:
            return None
        if self.spec.kind == "choice":
            has_gold = (target == 1).any(1)
            right = target.gather(1, logits.argmax(1, keepdim=True)).squeeze(1) == 1
            return _masked_mean(right.float(), has_gold.float())
        labelled = target != TARGET_IGNORE
        return _masked_mean((logits.argmax(-1) == target).float(), labelled.float())

    def predict(self, head: nn.Module, logits: Any, batch: EtcBatch) -> Any:
        kind = self.spec.kind
        if kind == "global_labels":
            return logits.softmax(-1)  # [B, G, classes]
        if kind == "choice":
            return logits  # [B, G] scores, non-candidates at the floor
        if kind == "span":  # decoded into whole-word answers by graphattn.train.spans (it needs the instances)
            return SpanScores(
                logits.start,
                logits.end,
                logits.answer_type,
                logits.start[:, 0] + logits.end[:, 0],  # the null span ([CLS] at long position 0), to threshold on
                head.answer_types,
                head.max_answer_length,
            )
        return NgramScores(logits)


def ngram_labels(rows: torch.Tensor, max_ngram: int, long_length: int) -> torch.Tensor:
    """[B, N, L] bool from span rows [B, k, 2] (first, last): labels[b, last - first, first] for
    rows that are labelled and at most `max_ngram` tokens long (KeyphraseHead's layout)."""
    batch, k, _ = rows.shape
    first, last = rows[..., 0], rows[..., 1]
    valid = (first >= 0) & (last >= first) & (last - first < max_ngram) & (last < long_length)
    labels = torch.zeros(batch, max_ngram, long_length, dtype=torch.bool, device=rows.device)
    b = torch.arange(batch, device=rows.device)[:, None].expand(batch, k)
    labels[b[valid], (last - first)[valid], first[valid]] = True
    return labels


class TaskModel(nn.Module):
    """EtcEncoder + a head per target of `targets` (a Schema, schema file / name, or TargetSpecs)."""

    def __init__(
        self, encoder: EtcEncoder, targets: Any, *, max_ngram: int = DEFAULT_MAX_NGRAM, max_answer_length: int = 30
    ):
        super().__init__()
        self.encoder = encoder
        self.targets = {name: TargetHead(spec) for name, spec in task_targets(targets).items()}
        hidden = encoder.config.hidden_size
        heads = {}
        for name, target in self.targets.items():
            spec = target.spec
            if spec.kind == "global_labels":
                heads[name] = GlobalLabelHead(hidden, len(spec.classes))
            elif spec.kind == "choice":
                heads[name] = CandidateScoringHead(hidden)
            elif spec.kind == "span":
                heads[name] = SpanExtractionHead(hidden, answer_types=spec.types, max_answer_length=max_answer_length)
            else:
                heads[name] = KeyphraseHead(hidden, max_ngram=max_ngram)
        self.heads = nn.ModuleDict(heads)

    def _check(self, batch: EtcBatch) -> None:
        needed = [a.name for t in self.targets.values() for a in t.spec.arrays]
        missing = [name for name in needed if name not in batch.targets]
        if missing:
            raise GraphattnError(
                f"the batch has no target {missing[0]!r} (it carries {', '.join(batch.targets) or 'none'}): "
                "compile the data with the schema the model was built from",
                path=("targets", missing[0]),
            )

    def logits(self, batch: EtcBatch) -> dict[str, Any]:
        self._check(batch)
        global_hidden, long_hidden = self.encoder(batch)
        return {name: t.logits(self.heads[name], global_hidden, long_hidden, batch) for name, t in self.targets.items()}

    def forward(self, batch: EtcBatch) -> dict[str, torch.Tensor]:
        logits = self.logits(batch)
        losses = {name: t.loss(self.heads[name], logits[name], batch) for name, t in self.targets.items()}
        out = {"loss": sum(losses.values()), **{f"loss/{name}": value.detach() for name, value in losses.items()}}
        with torch.no_grad():
            for name, target in self.targets.items():
                share = target.accuracy(logits[name], batch)
                if share is not None:
                    out[f"accuracy/{name}"] = share
        return out

    @torch.no_grad()
    def predict(self, batch: EtcBatch) -> dict[str, Any]:
        """Per target: global_labels [B, G, classes] probabilities; choice [B, G] scores (non-candidates
        at the floor); span SpanScores (start / end / answer-type logits and the null span's score) and
        spans NgramScores (every n-gram's score): `graphattn.train.spans` decodes those two into
        whole-word answers of each instance's text (`instance_span`, `instance_keyphrases`)."""
        logits = self.logits(batch)
        return {name: t.predict(self.heads[name], logits[name], batch) for name, t in self.targets.items()}
