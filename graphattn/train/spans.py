"""Whole-word answers from span scores: what `graphattn predict` writes and `graphattn evaluate` scores.

A span head scores start and end per long token, and tokens are sub-word pieces: "method" may be
"m", "##eth", "##od". Taking the best (start, end) pair as is can answer "eth". Here only tokens
whose first character starts a word of the original text may start an answer, and only tokens
whose last character ends one may end it (`word_edges`, from the tokens' character offsets in
the document), so every answer is a run of whole words of the document, at its own offsets:

    can_start, can_end, doc = word_edges(inst)                 # [L] each, numpy
    starts, ends, scores = best_spans(start_logits, end_logits, can_start, can_end, doc,
                                      max_answer_length=30, n_best=5)   # [B, k] torch
    answers = span_answers(inst, starts[b], ends[b], scores[b])         # [{"text", "char_start", ...}]

A word character is a letter, a digit, "_" (as in regular expressions' \\w) or a combining mark;
a CJK ideograph or kana is a word of its own. Punctuation is its own word ("London." ends at the
stop, and at "London"). Tokens the compiler inserted ([CLS], ...) have no characters and never
start or end an answer; an answer never spans two lines of the text (paragraphs, titles and
sentences are lines in the readers' texts) nor two packed documents. Keyphrase n-grams
(`best_ngrams`) follow the same rule.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch is imported where a tensor is made: `graphattn predict --help` loads no torch
    import torch

DEFAULT_MAX_ANSWER_LENGTH = 30  # long tokens per answer (the span head's own default)
DEFAULT_N_BEST = 5
MAX_N_BEST = 100
MAX_ANSWER_LENGTH_LIMIT = 4096

_ASCII_WORD = np.array([chr(c).isalnum() or chr(c) == "_" for c in range(128)], dtype=bool)
_OWN_WORD_RANGES = ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x3134F))


def _is_word_char(char: str) -> bool:
    """A letter, a digit, or a combining mark (an accent written after its letter belongs to the word)."""
    return char.isalnum() or unicodedata.category(char).startswith("M")


def _word_chars(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(word, own) per code point: a letter or digit; a character that is a word by itself (CJK)."""
    word = np.zeros(codes.shape, dtype=bool)
    ascii_ = codes < 128
    word[ascii_] = _ASCII_WORD[codes[ascii_]]
    other = ~ascii_
    if other.any():  # one isalnum per distinct character, not per position
        distinct, inverse = np.unique(codes[other], return_inverse=True)
        word[other] = np.array([_is_word_char(chr(c)) for c in distinct.tolist()], dtype=bool)[inverse]
    own = np.zeros(codes.shape, dtype=bool)
    for low, high in _OWN_WORD_RANGES:
        own |= (codes >= low) & (codes <= high)
    return word, own


def _codes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)


def word_boundaries(text: str) -> np.ndarray:
    """[len(text) + 1] bool: True at offsets where a word may start or end (no word character
    on both sides, unless one of them is a word by itself)."""
    word, own = _word_chars(_codes(text))
    joined = word[:-1] & word[1:] & ~own[:-1] & ~own[1:]
    return np.concatenate([[True], ~joined, [True]])


def word_edges(inst: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(can_start, can_end, line) per long token of an EtcInstance: does the token's first
    character start a word of its document, does its last character end one; which line of
    which document it is on (an answer stays on one line: titles, sentences and paragraphs are
    lines of the readers' texts, and an answer that runs into the next paragraph is no answer)."""
    spans = np.asarray(inst.long_char_spans, dtype=np.int64).reshape(-1, 2)
    doc = np.asarray(inst.long_doc_index, dtype=np.int64).reshape(-1)
    can_start = np.zeros(len(spans), dtype=bool)
    can_end = np.zeros(len(spans), dtype=bool)
    line = np.full(len(spans), -1, dtype=np.int64)
    real = (spans[:, 0] >= 0) & (spans[:, 1] > spans[:, 0])
    offset = 0
    for d in np.unique(doc[real]).tolist():  # per document of the instance, not per token
        text = inst.texts[d]
        here = real & (doc == d) & (spans[:, 1] <= len(text))
        edges = word_boundaries(text)
        can_start[here] = edges[spans[here, 0]]
        can_end[here] = edges[spans[here, 1]]
        breaks = np.concatenate([[0], np.cumsum(_codes(text) == 10)])  # newlines before each offset
        line[here] = offset + breaks[spans[here, 0]]
        offset += int(breaks[-1]) + 1
    return can_start, can_end, line


def best_spans(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    can_start: torch.Tensor,
    can_end: torch.Tensor,
    doc: torch.Tensor,
    *,
    max_answer_length: int = DEFAULT_MAX_ANSWER_LENGTH,
    n_best: int = DEFAULT_N_BEST,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The n best whole-word spans per row: (starts, ends, scores), each [B, k] with k = n_best
    (fewer when L * width is smaller), best first; score = start logit + end logit, -inf where a
    row has fewer valid spans. A span is start <= end < start + max_answer_length, starting at a
    `can_start` token and ending at a `can_end` token of the same `doc` (line). Vectorized over a band of
    width max_answer_length ([B, L, width])."""
    import torch

    if max_answer_length < 1 or n_best < 1:
        raise ValueError(f"max_answer_length and n_best must be at least 1, got {max_answer_length}, {n_best}")
    batch, length = start_logits.shape
    device = start_logits.device
    can_start, can_end, doc = (t.to(device) for t in (can_start, can_end, doc))
    width = max(1, min(max_answer_length, length))
    start = start_logits.double().masked_fill(~can_start, -np.inf)
    end = end_logits.double().masked_fill(~can_end, -np.inf)
    band_end = torch.nn.functional.pad(end, (0, width - 1), value=-np.inf).unfold(1, width, 1)  # [B, L, width]
    band_doc = torch.nn.functional.pad(doc, (0, width - 1), value=-2).unfold(1, width, 1)
    scores = start[:, :, None] + band_end
    scores = scores.masked_fill(band_doc != doc[:, :, None], -np.inf)
    k = min(n_best, length * width)
    best, flat = scores.flatten(1).topk(k, dim=1)
    starts = torch.div(flat, width, rounding_mode="floor")
    return starts, starts + flat % width, best


def best_ngrams(
    scores: torch.Tensor, can_start: torch.Tensor, can_end: torch.Tensor, doc: torch.Tensor, *, top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The top_k whole-word n-grams of KeyphraseHead scores [B, N, L] (scores[b, n-1, i] for tokens
    i .. i+n-1): (starts, lengths, scores) [B, k], best first, -inf where there are fewer."""
    import torch

    batch, grams, length = scores.shape
    device = scores.device
    can_start, can_end, doc = (t.to(device) for t in (can_start, can_end, doc))
    n = torch.arange(grams, device=device)[:, None]
    last = torch.arange(length, device=device)[None, :] + n  # [N, L]
    inside = last < length
    last = last.clamp(max=length - 1)
    ok = can_start[:, None, :] & can_end[:, last] & inside & (doc[:, last] == doc[:, None, :])
    masked = scores.double().masked_fill(~ok, -np.inf)
    best, flat = masked.flatten(1).topk(min(top_k, grams * length), dim=1)
    return flat % length, torch.div(flat, length, rounding_mode="floor") + 1, best


def span_text(inst: Any, first: int, last: int) -> tuple[int, int, str]:
    """Characters (start, end) and text of long tokens first..last (inserted tokens add nothing);
    (-1, -1, "") when none of them has characters."""
    spans = np.asarray(inst.long_char_spans[first : last + 1]).reshape(-1, 2)
    real = spans[:, 0] >= 0
    if not real.any():
        return -1, -1, ""
    doc = int(inst.long_doc_index[first])
    start, end = int(spans[real, 0].min()), int(spans[real, 1].max())
    return start, end, inst.texts[doc][start:end]


def span_answers(inst: Any, starts: Any, ends: Any, scores: Any) -> list[dict[str, Any]]:
    """The spans (long token positions, best first) as answers of the instance's document:
    text, char_start, char_end, score; spans with no score (-inf) are left out."""
    out = []
    for first, last, score in zip(np.asarray(starts).tolist(), np.asarray(ends).tolist(), np.asarray(scores).tolist()):
        if not np.isfinite(score):
            break
        start, end, text = span_text(inst, int(first), int(last))
        out.append({"text": text, "char_start": start, "char_end": end, "score": float(score)})
    return out


# -- what TaskModel.predict returns for the span kinds, and its decoding per instance ----------------
@dataclass
class SpanScores:
    """A span target's scores for a batch: start / end logits [B, L], answer-type logits [B, T],
    the null span's score [B] ([CLS] at long position 0) and the head's types and length limit."""

    start: torch.Tensor
    end: torch.Tensor
    answer_type: torch.Tensor
    null_score: torch.Tensor
    types: tuple[str, ...]
    max_answer_length: int = DEFAULT_MAX_ANSWER_LENGTH


@dataclass
class NgramScores:
    """A spans (keyphrase) target's n-gram scores for a batch, [B, N, L] (KeyphraseHead's layout)."""

    scores: torch.Tensor


NO_ANSWER_TYPES = ("null", "yes", "no")  # answer types whose answer is not a span's text


def instance_span(
    prediction: SpanScores, b: int, inst: Any, *, n_best: int = DEFAULT_N_BEST, max_answer_length: int | None = None
) -> dict[str, Any]:
    """Instance b's answer: type (the head's answer type), text ("yes" / "no" for those types, ""
    for null), char_start / char_end (-1 unless a span), score (the best whole-word span's start +
    end logit), margin (that score minus the null span's) and n_best (whole-word spans, best first)."""
    import torch

    length = inst.long_length
    can_start, can_end, doc = (torch.from_numpy(a)[None] for a in word_edges(inst))
    starts, ends, scores = best_spans(
        prediction.start[b : b + 1, :length],
        prediction.end[b : b + 1, :length],
        can_start,
        can_end,
        doc,
        max_answer_length=max_answer_length or prediction.max_answer_length,
        n_best=n_best,
    )
    answers = span_answers(inst, starts[0].cpu().numpy(), ends[0].cpu().numpy(), scores[0].cpu().numpy())
    kind = prediction.types[int(prediction.answer_type[b].argmax())]
    best = answers[0] if answers else {"text": "", "char_start": -1, "char_end": -1, "score": float("-inf")}
    spanned = kind not in NO_ANSWER_TYPES
    return {
        "type": kind,
        "text": best["text"] if spanned else ("" if kind == "null" else kind),
        "char_start": best["char_start"] if spanned else -1,
        "char_end": best["char_end"] if spanned else -1,
        "score": best["score"],
        "margin": best["score"] - float(prediction.null_score[b]),
        "n_best": answers,
    }


def instance_keyphrases(prediction: NgramScores, b: int, inst: Any, *, top_k: int = 32) -> list[dict[str, Any]]:
    """Instance b's best whole-word n-grams, best first: text, char_start, char_end, score."""
    import torch

    length = inst.long_length
    can_start, can_end, doc = (torch.from_numpy(a)[None] for a in word_edges(inst))
    starts, lengths, scores = best_ngrams(
        prediction.scores[b : b + 1, :, :length], can_start, can_end, doc, top_k=top_k
    )
    return span_answers(
        inst, starts[0].cpu().numpy(), (starts[0] + lengths[0] - 1).cpu().numpy(), scores[0].cpu().numpy()
    )
