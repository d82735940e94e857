"""Task heads on top of EtcEncoder outputs, each with a loss and a decode step (ETC section 4).

    SpanExtractionHead      NQ: start/end logits over long tokens + answer type from the first global
    SupportingFactsHead     HotpotQA: one supporting-fact logit per sentence global
    GlobalLabelHead         a class per global (any number of classes: supporting facts, DOM element labels)
    CandidateScoringHead    WikiHop: one logit per candidate global, softmax over candidates
    KeyphraseHead           OpenKP: a score per n-gram (n = 1..max_ngram) of long tokens

Heads take hidden states and masks, not batches, so any encoder output fits. Which global
positions are sentences or candidates, and the answers, come from the batch's targets (the
schema's `targets:`); `graphattn.train.tasks.TaskModel` wires targets to heads.
Masked positions get the most negative finite logit (never -inf, so a row with nothing valid
gives a finite loss and no NaN gradients).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from graphattn.errors import GraphattnError

NQ_ANSWER_TYPES = ("null", "yes", "no", "short", "long")


def _masked(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Logits with positions where mask == 0 pushed to the most negative finite value."""
    return logits.masked_fill(~mask.bool(), torch.finfo(logits.dtype).min)


def _scorer(hidden_size: int, outputs: int = 1) -> nn.Sequential:
    """Dense + tanh + projection: BERT's pooler-then-classifier, per position."""
    return nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.Tanh(), nn.Linear(hidden_size, outputs))


def _check_positions(positions: torch.Tensor, mask: torch.Tensor, name: str) -> None:
    if positions.ndim != 1 or positions.shape[0] != mask.shape[0]:
        raise GraphattnError(
            f"{name} must have shape [B] = [{mask.shape[0]}], got {tuple(positions.shape)}", path=(name,)
        )
    picked = mask.bool().gather(1, positions.clamp(0, mask.shape[1] - 1)[:, None]).squeeze(1)
    if bool(((positions < 0) | (positions >= mask.shape[1]) | ~picked).any()):
        bad = int(torch.nonzero((positions < 0) | (positions >= mask.shape[1]) | ~picked)[0, 0])
        raise GraphattnError(
            f"{name}[{bad}] = {int(positions[bad])} is not an allowed position of example {bad}", path=(name,)
        )


# -- NQ: span extraction with answer type ---------------------------------------------------------


@dataclass
class SpanLogits:
    start: torch.Tensor  # [B, L]
    end: torch.Tensor  # [B, L]
    answer_type: torch.Tensor  # [B, T]


@dataclass
class SpanPrediction:
    start: torch.Tensor  # [B] long position of the first answer token
    end: torch.Tensor  # [B] long position of the last answer token (inclusive)
    score: torch.Tensor  # [B] start logit + end logit
    answer_type: torch.Tensor  # [B] index into the head's answer types


class SpanExtractionHead(nn.Module):
    """Start and end logits per long token; the answer type (null / yes / no / short / long for
    NQ) from the global token at `type_position` (the [CLS] global). A question without an
    answer points start and end at long position 0 ([CLS]), as in BERT-joint."""

    def __init__(
        self,
        hidden_size: int,
        answer_types: tuple[str, ...] = NQ_ANSWER_TYPES,
        max_answer_length: int = 30,
        type_position: int = 0,
    ):
        super().__init__()
        self.answer_types, self.max_answer_length, self.type_position = (
            tuple(answer_types),
            max_answer_length,
            type_position,
        )
        self.span = nn.Linear(hidden_size, 2)
        self.type_classifier = _scorer(hidden_size, len(self.answer_types))

    def forward(self, global_hidden: torch.Tensor, long_hidden: torch.Tensor, long_mask: torch.Tensor) -> SpanLogits:
        if global_hidden.shape[1] <= self.type_position:
            raise GraphattnError(
                f"the answer type is read from global position {self.type_position}, "
                f"but there are {global_hidden.shape[1]} globals"
            )
        start, end = self.span(long_hidden).float().unbind(-1)
        answer_type = self.type_classifier(global_hidden[:, self.type_position]).float()
        return SpanLogits(_masked(start, long_mask), _masked(end, long_mask), answer_type)

    def loss(
        self, logits: SpanLogits, start_positions: torch.Tensor, end_positions: torch.Tensor, answer_types: torch.Tensor
    ) -> torch.Tensor:
        """Mean of start and end cross-entropy over long positions, plus answer-type cross-entropy."""
        span = (F.cross_entropy(logits.start, start_positions) + F.cross_entropy(logits.end, end_positions)) / 2
        return span + F.cross_entropy(logits.answer_type, answer_types)

    @torch.no_grad()
    def decode(self, logits: SpanLogits, allowed: torch.Tensor, max_answer_length: int | None = None) -> SpanPrediction:
        """Best span with start <= end < start + max_answer_length, both inside `allowed` [B, L]
        (e.g. document tokens only). Vectorized over a band of width max_answer_length."""
        width = min(max_answer_length or self.max_answer_length, logits.start.shape[1])
        floor = torch.finfo(logits.start.dtype).min
        start = logits.start.masked_fill(~allowed.bool(), floor)
        end = logits.end.masked_fill(~allowed.bool(), floor)
        band = F.pad(end, (0, width - 1), value=floor).unfold(1, width, 1)  # [B, L, width]: end logit at start + offset
        scores = start[:, :, None] / 2 + band / 2  # halves: two floors must not overflow to -inf
        flat = scores.flatten(1).argmax(1)
        best_start, offset = flat // width, flat % width
        score = scores.flatten(1).gather(1, flat[:, None]).squeeze(1) * 2
        return SpanPrediction(best_start, best_start + offset, score, logits.answer_type.argmax(-1))


# -- HotpotQA: supporting facts ------------------------------------------------------------------


class SupportingFactsHead(nn.Module):
    """A binary logit per sentence global: is this sentence a supporting fact?"""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.scorer = _scorer(hidden_size)

    def forward(self, global_hidden: torch.Tensor) -> torch.Tensor:
        return self.scorer(global_hidden).squeeze(-1).float()  # [B, G]

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, sentence_mask: torch.Tensor) -> torch.Tensor:
        """Binary cross-entropy averaged over the sentence globals of the batch."""
        mask = sentence_mask.float()
        if not bool(mask.any()):
            raise GraphattnError("the batch has no sentence globals to score", path=("sentence_mask",))
        losses = F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="none")
        return (losses * mask).sum() / mask.sum()

    @torch.no_grad()
    def predict(self, logits: torch.Tensor, sentence_mask: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
        """[B, G] bool: sentences whose supporting probability exceeds `threshold`."""
        return (torch.sigmoid(logits) > threshold) & sentence_mask.bool()


class GlobalLabelHead(nn.Module):
    """`classes` logits per global token (a per-global classification target)."""

    def __init__(self, hidden_size: int, classes: int):
        super().__init__()
        if classes < 2:
            raise GraphattnError(f"a classification needs at least 2 classes, got {classes}", path=("classes",))
        self.scorer = _scorer(hidden_size, classes)

    def forward(self, global_hidden: torch.Tensor) -> torch.Tensor:
        return self.scorer(global_hidden).float()  # [B, G, classes]


# -- WikiHop: candidate scoring ---------------------------------------------------------------------


class CandidateScoringHead(nn.Module):
    """A logit per candidate global; the answer is the softmax over the example's candidates."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.scorer = _scorer(hidden_size)

    def forward(self, global_hidden: torch.Tensor, candidate_mask: torch.Tensor) -> torch.Tensor:
        return _masked(self.scorer(global_hidden).squeeze(-1).float(), candidate_mask)  # [B, G]

    def loss(self, logits: torch.Tensor, answer_positions: torch.Tensor, candidate_mask: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the right candidate's global position (answer_positions [B])."""
        _check_positions(answer_positions, candidate_mask, "answer_positions")
        return F.cross_entropy(logits, answer_positions)

    @torch.no_grad()
    def predict(self, logits: torch.Tensor) -> torch.Tensor:
        """[B] global position of the best candidate."""
        return logits.argmax(-1)


# -- OpenKP: n-gram keyphrases ------------------------------------------------------------------------


@dataclass
class Keyphrases:
    start: torch.Tensor  # [B, k] long position of the first token
    length: torch.Tensor  # [B, k] number of tokens
    score: torch.Tensor  # [B, k]


class KeyphraseHead(nn.Module):
    """Scores every n-gram of long tokens, n = 1..max_ngram, with one convolution of width n per
    n (as ETC's OpenKP model does over words). scores[b, n-1, i] scores tokens i .. i+n-1.
    Training is listwise: maximise the softmax mass of the gold n-grams among all valid ones."""

    def __init__(self, hidden_size: int, max_ngram: int = 5):
        super().__init__()
        if max_ngram < 1:
            raise GraphattnError(f"max_ngram must be >= 1, got {max_ngram}", path=("max_ngram",))
        self.max_ngram = max_ngram
        self.convs = nn.ModuleList(nn.Conv1d(hidden_size, hidden_size, n) for n in range(1, max_ngram + 1))
        self.activation = nn.GELU()
        self.score = nn.Linear(hidden_size, 1)

    def valid_ngrams(self, long_mask: torch.Tensor) -> torch.Tensor:
        """[B, N, L] bool: n-grams whose tokens are all real (inside the sequence, not padding)."""
        real = long_mask.float()[:, None]  # [B, 1, L]
        length = real.shape[-1]
        rows = [
            F.pad(F.avg_pool1d(real, n, stride=1), (0, n - 1)) > 1 - 1e-6
            if n <= length
            else torch.zeros_like(real, dtype=torch.bool)
            for n in range(1, self.max_ngram + 1)
        ]
        return torch.cat(rows, dim=1)

    def forward(
        self, long_hidden: torch.Tensor, long_mask: torch.Tensor, ngram_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[B, N, L] n-gram scores; invalid n-grams (padding, or outside `ngram_mask`) masked."""
        x = long_hidden.transpose(1, 2)  # [B, D, L]
        rows = []
        for n, conv in enumerate(self.convs, start=1):
            if n > x.shape[-1]:  # a sequence shorter than n has no n-grams
                rows.append(long_hidden.new_zeros(long_hidden.shape[:2], dtype=torch.float32))
                continue
            grams = self.activation(conv(x)).transpose(1, 2)  # [B, L-n+1, D]
            score = self.score(grams).squeeze(-1).float()
            rows.append(F.pad(score, (0, n - 1)))
        scores = torch.stack(rows, dim=1)
        valid = self.valid_ngrams(long_mask)
        if ngram_mask is not None:
            valid = valid & ngram_mask.bool()
        return _masked(scores, valid)

    def loss(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """-log(sum of softmax probability over the gold n-grams), averaged over examples that
        have at least one gold n-gram. labels: [B, N, L] 0/1."""
        gold = labels.bool()
        has_gold = gold.flatten(1).any(1)
        if not bool(has_gold.any()):
            raise GraphattnError("no example in the batch has a gold keyphrase", path=("ngram_labels",))
        flat = scores.flatten(1)
        gold_mass = torch.logsumexp(flat.masked_fill(~gold.flatten(1), torch.finfo(flat.dtype).min), dim=1)
        losses = torch.logsumexp(flat, dim=1) - gold_mass
        return losses[has_gold].mean()

    @torch.no_grad()
    def predict(self, scores: torch.Tensor, top_k: int = 5) -> Keyphrases:
        """The k best n-grams per example, best first."""
        flat = scores.flatten(1)
        score, index = flat.topk(min(top_k, flat.shape[1]), dim=1)
        length = index // scores.shape[2] + 1
        return Keyphrases(index % scores.shape[2], length, score)
