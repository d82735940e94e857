"""Pre-training inputs from compiled instances: whole-word MLM masking and CPC sentences.

ETC pre-trains with two objectives (ETC section 3.5, appendix C; docs/DESIGN.md §5):

* **MLM** on the long input, masked by whole words: 15% of the words, each of their tokens
  replaced by [MASK] (80%), a random token (10%) or left as is (10%); global tokens are never
  masked. The mask is *dynamic*: a fresh one per step from a seeded generator
  (`PretrainingDataset` derives it from (seed, epoch, index)), so epochs see different masks and
  reruns see the same ones.
* **CPC**: all tokens of ~10% of the sentences are replaced by [MASK]; each such sentence is
  also encoded *alone* (its own small instance: its tokens as the long input, its sentence
  global as the only global), and the model learns to match the full input's sentence global to
  that encoding (graphattn.train.pretrain).

Word rule (`word_starts`): long token i continues the word of token i-1 iff both are text tokens
(real character spans) of the same packed document, with the same owner at every hierarchy level
(a sentence boundary always ends a word), token i starts exactly where token i-1 ends (no
whitespace between), and, for tokenizers with a continuation prefix (WordPiece "##"), token i
carries that prefix. So "le ##vel ##s" is one word and "word ," two (BERT's whole-word rule); for
tokenizers without a prefix (byte-level BPE, word tokenizers) adjacency alone decides. Tokens the
compiler inserted ([CLS], [SEP]: span -1) are words of their own and never masked.

Tokens of CPC-masked sentences are left out of MLM: they are all [MASK], and predicting a whole
hidden sentence token by token is CPC's job, not MLM's.

Everything per token is numpy; the Python loops run per CPC sentence and per instance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from graphattn.compile.batching import collate
from graphattn.compile.side_inputs import side_inputs
from graphattn.contract import EtcBatch, EtcInstance, TruncationReport
from graphattn.errors import BatchError, CompileError
from graphattn.tokenize import Tokenizer

IGNORE_INDEX = -100  # torch's cross_entropy default ignore_index
MASK, RANDOM, KEEP = 0, 1, 2  # what happens to one chosen token


@dataclass(frozen=True)
class MaskingConfig:
    """ETC / BERT defaults: 15% of words, 80/10/10 [MASK]/random/keep, 10% of sentences for CPC."""

    mlm_probability: float = 0.15
    mask_fraction: float = 0.8
    random_fraction: float = 0.1
    cpc_probability: float = 0.1
    sentence_type: str = "sentence"  # the long_owners level whose globals CPC predicts

    def __post_init__(self) -> None:
        for name in ("mlm_probability", "mask_fraction", "random_fraction", "cpc_probability"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise CompileError(f"must be in [0, 1], got {value}", path=("MaskingConfig", name))
        if self.mask_fraction + self.random_fraction > 1.0:
            raise CompileError(
                "mask_fraction + random_fraction must be <= 1 (the rest is kept), "
                f"got {self.mask_fraction + self.random_fraction}",
                path=("MaskingConfig", "random_fraction"),
            )


@dataclass(frozen=True)
class TokenInfo:
    """What masking needs from the tokenizer: the [MASK] id, which ids are continuation pieces,
    and which ids a random replacement may draw (every id but the special ones)."""

    mask_id: int
    continuation: np.ndarray | None  # [vocab] bool, or None when the tokenizer has no prefix
    random_ids: np.ndarray  # [n] int32

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, continuation_prefix: str | None = "auto") -> TokenInfo:
        """`continuation_prefix`: "auto" (the tokenizer model's own, e.g. WordPiece "##"; none for
        BPE and word tokenizers), a string, or None to decide words by adjacency only."""
        if tokenizer.mask_id is None:
            raise CompileError(f"the tokenizer has no mask token ([MASK] or <mask>); MLM needs one: {tokenizer!r}")
        vocab = _vocabulary(tokenizer)
        if continuation_prefix == "auto":
            model = getattr(getattr(tokenizer, "tokenizer", None), "model", None)
            continuation_prefix = getattr(model, "continuing_subword_prefix", None)
        continuation = None
        if continuation_prefix:
            continuation = np.array([token.startswith(continuation_prefix) for token in vocab], dtype=bool)
        special = {tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id, tokenizer.unk_id} - {None}
        random_ids = np.setdiff1d(np.arange(len(vocab), dtype=np.int32), np.array(sorted(special), dtype=np.int32))
        return cls(int(tokenizer.mask_id), continuation, random_ids.astype(np.int32))


def _vocabulary(tokenizer: Tokenizer) -> list[str]:
    """Token strings in id order (once per tokenizer: a loop per vocabulary entry, not per token)."""
    raw = getattr(tokenizer, "tokenizer", None)
    if raw is not None and hasattr(raw, "get_vocab"):
        by_id = {i: t for t, i in raw.get_vocab(with_added_tokens=True).items()}
        return [by_id.get(i, "") for i in range(tokenizer.vocab_size)]
    return [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]


# -- words --------------------------------------------------------------------------------------
def word_starts(instance: EtcInstance, continuation: np.ndarray | None = None) -> np.ndarray:
    """[L] bool: True where a long token starts a new word (the rule in the module doc)."""
    spans = np.asarray(instance.long_char_spans)
    n = spans.shape[0]
    text = spans[:, 0] >= 0
    joined = np.zeros(n, dtype=bool)
    if n > 1:
        joined[1:] = text[1:] & text[:-1] & (spans[1:, 0] == spans[:-1, 1])
        joined[1:] &= instance.long_doc_index[1:] == instance.long_doc_index[:-1]
        for owners in instance.long_owners.values():
            joined[1:] &= owners[1:] == owners[:-1]
        if continuation is not None:
            ids = np.asarray(instance.long_token_ids)
            in_vocab = ids < continuation.shape[0]
            joined &= np.where(in_vocab, continuation[np.minimum(ids, continuation.shape[0] - 1)], False)
    return ~joined


def word_index(starts: np.ndarray, maskable: np.ndarray) -> np.ndarray:
    """[L] int: the word number (0, 1, ...) of each maskable token, -1 for the others.

    A word is a run from one start to the next; a word with any unmaskable token is dropped
    whole, so masking never cuts a word in two."""
    word = np.cumsum(starts) - 1
    bad_words = np.unique(word[~maskable])
    keep = maskable & ~np.isin(word, bad_words)
    _, dense = np.unique(word[keep], return_inverse=True)
    out = np.full(starts.shape[0], -1, dtype=np.int64)
    out[keep] = dense.reshape(-1)
    return out


def word_spans(words: np.ndarray) -> list[np.ndarray]:
    """Token positions of each word (for tests and inspection)."""
    order = np.argsort(words, kind="stable")
    order = order[words[order] >= 0]
    cuts = np.flatnonzero(np.diff(words[order])) + 1
    return np.split(order, cuts) if order.size else []


# -- MLM ------------------------------------------------------------------------------------------
def choose_words(num_words: int, probability: float, rng: np.random.Generator) -> np.ndarray:
    """round(probability * num_words) distinct word numbers (at least one when there are words
    and probability > 0), uniformly at random, sorted."""
    if num_words == 0 or probability <= 0:
        return np.zeros(0, dtype=np.int64)
    count = min(num_words, max(1, int(round(probability * num_words))))
    return np.sort(rng.choice(num_words, size=count, replace=False))


def draw_actions(num_tokens: int, config: MaskingConfig, rng: np.random.Generator) -> np.ndarray:
    """[n] int8 per chosen token: MASK, RANDOM or KEEP (drawn per token, as BERT's whole-word
    masking does, not once per word)."""
    u = rng.random(num_tokens)
    actions = np.full(num_tokens, KEEP, dtype=np.int8)
    actions[u < config.mask_fraction + config.random_fraction] = RANDOM
    actions[u < config.mask_fraction] = MASK
    return actions


def apply_mlm_mask(
    token_ids: np.ndarray,
    words: np.ndarray,
    chosen_words: np.ndarray,
    actions: np.ndarray,
    random_tokens: np.ndarray,
    mask_id: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Mask the tokens of `chosen_words`: (masked ids [L], labels [L]; IGNORE_INDEX elsewhere).

    `actions` and `random_tokens` have one entry per chosen token, in position order (the
    deterministic half of masking, so tests can spell out the expected result by hand)."""
    token_ids = np.asarray(token_ids)
    positions = np.flatnonzero(np.isin(words, chosen_words) & (words >= 0))
    if actions.shape[0] != positions.shape[0] or random_tokens.shape[0] != positions.shape[0]:
        raise CompileError(
            f"{positions.shape[0]} tokens chosen but {actions.shape[0]} actions and "
            f"{random_tokens.shape[0]} random tokens given"
        )
    masked = token_ids.copy()
    labels = np.full(token_ids.shape[0], IGNORE_INDEX, dtype=np.int64)
    labels[positions] = token_ids[positions]
    masked[positions[actions == MASK]] = mask_id
    masked[positions[actions == RANDOM]] = random_tokens[actions == RANDOM]
    return masked, labels


# -- CPC ------------------------------------------------------------------------------------------
def sentence_globals(instance: EtcInstance, sentence_type: str = "sentence") -> np.ndarray:
    """Global positions of the `sentence_type` globals that own at least one long token."""
    owners = instance.long_owners.get(sentence_type)
    if owners is None:
        levels = ", ".join(instance.long_owners) or "none"
        raise CompileError(
            f"the instance has no {sentence_type!r} level in long_owners (levels: {levels}); CPC needs one global "
            "per sentence (MaskingConfig(sentence_type=...) names the level; cpc_probability=0 masks for MLM only)"
        )
    return np.unique(owners[owners >= 0]).astype(np.int64)


def choose_sentences(candidates: np.ndarray, probability: float, rng: np.random.Generator) -> np.ndarray:
    """About `probability` of the candidate sentences, sorted: floor(p * n + u), u ~ U(0, 1),
    so the expected count is exactly p * n even for short documents; never all of them (the
    context must stay readable), so a one-sentence instance gets none."""
    n = candidates.shape[0]
    if n < 2 or probability <= 0:
        return np.zeros(0, dtype=np.int64)
    count = min(n - 1, int(np.floor(probability * n + rng.random())))
    return np.sort(rng.choice(candidates, size=count, replace=False)) if count else np.zeros(0, dtype=np.int64)


def sentence_instance(instance: EtcInstance, global_position: int, sentence_type: str = "sentence") -> EtcInstance:
    """The instance CPC encodes one sentence with: the sentence's long tokens (original ids, not
    masked) as the long input, its own global token as the only global, owning them all.

    Same local radius, distance labels and label vocabulary as `instance`, so the sentence
    instances of a batch collate together and feed the same encoder."""
    owners = instance.long_owners[sentence_type]
    positions = np.flatnonzero(owners == global_position)
    if positions.size == 0:
        raise CompileError(
            f"global {global_position} ({instance.global_node_ids[global_position]!r}) owns no long token "
            f"at level {sentence_type!r}"
        )
    length = positions.size
    breakpoints = np.zeros(length, dtype=np.int32)
    breakpoints[-1] = 1
    side = side_inputs(
        breakpoints,
        np.ones(1, np.int32),
        np.zeros(length, np.int32),
        instance.side.local_radius,
        instance.label_vocab.max_distance,
    )
    doc = int(instance.long_doc_index[positions[0]])
    return EtcInstance(
        long_token_ids=np.asarray(instance.long_token_ids)[positions].astype(np.int32),
        long_type_ids=np.asarray(instance.long_type_ids)[positions].astype(np.int32),
        global_token_ids=np.asarray(instance.global_token_ids)[[global_position]].astype(np.int32),
        global_type_ids=np.asarray(instance.global_type_ids)[[global_position]].astype(np.int32),
        side=side,
        label_vocab=instance.label_vocab,
        global_node_ids=[instance.global_node_ids[global_position]],
        global_node_types=[instance.global_node_types[global_position]],
        long_char_spans=np.asarray(instance.long_char_spans)[positions],
        long_doc_index=np.zeros(length, dtype=np.int32),
        long_owners={sentence_type: np.zeros(length, dtype=np.int32)},
        doc_ids=[instance.doc_ids[doc]],
        texts=[instance.texts[doc]],
        truncation=TruncationReport(
            long_tokens_before=length, long_tokens_after=length, globals_before=1, globals_after=1
        ),
    )


# -- one example, many examples -----------------------------------------------------------------
@dataclass
class PretrainingExample:
    """One masked instance: MLM labels, the CPC sentence globals and their own instances."""

    instance: EtcInstance  # long_token_ids masked; everything else shared with the source
    mlm_labels: np.ndarray  # [L] int64, IGNORE_INDEX where nothing is predicted
    cpc_globals: np.ndarray  # [S] global positions of the CPC-masked sentences
    cpc_sentences: list[EtcInstance] = field(default_factory=list)  # one per cpc_globals entry


def mask_instance(
    instance: EtcInstance, tokens: TokenInfo, rng: np.random.Generator, config: MaskingConfig = MaskingConfig()
) -> PretrainingExample:
    """Draw one dynamic mask for `instance`: CPC sentences first, then MLM words outside them."""
    ids = np.asarray(instance.long_token_ids)
    cpc_globals = np.zeros(0, dtype=np.int64)
    in_cpc = np.zeros(ids.shape[0], dtype=bool)
    if config.cpc_probability > 0:
        cpc_globals = choose_sentences(sentence_globals(instance, config.sentence_type), config.cpc_probability, rng)
        in_cpc = np.isin(instance.long_owners[config.sentence_type], cpc_globals)
    maskable = (np.asarray(instance.long_char_spans)[:, 0] >= 0) & ~in_cpc
    words = word_index(word_starts(instance, tokens.continuation), maskable)
    chosen = choose_words(int(words.max(initial=-1)) + 1, config.mlm_probability, rng)
    n_chosen = int(np.isin(words, chosen).sum()) if chosen.size else 0
    actions = draw_actions(n_chosen, config, rng)
    random_tokens = rng.choice(tokens.random_ids, size=n_chosen) if n_chosen else np.zeros(0, np.int32)
    masked, labels = apply_mlm_mask(ids, words, chosen, actions, random_tokens, tokens.mask_id)
    masked[in_cpc] = tokens.mask_id
    sentences = [sentence_instance(instance, int(g), config.sentence_type) for g in cpc_globals]
    masked_instance = replace(instance, long_token_ids=masked.astype(np.int32))
    return PretrainingExample(masked_instance, labels, cpc_globals, sentences)


class PretrainingDataset(torch.utils.data.Dataset):
    """Dynamic masking over compiled instances (a list or any map-style dataset of EtcInstance).

    Item i of epoch e is masked with ``np.random.default_rng([seed, e, i])``: a fresh mask each
    epoch, the same one in every rerun, DataLoader worker and DDP rank. Call `set_epoch(e)`
    (like DistributedSampler's) at the start of each epoch."""

    def __init__(self, instances: Any, tokens: TokenInfo, config: MaskingConfig = MaskingConfig(), seed: int = 0):
        self.instances, self.tokens, self.config, self.seed = instances, tokens, config, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.instances)

    def __getitem__(self, index: int) -> PretrainingExample:
        rng = np.random.default_rng([self.seed, self.epoch, int(index)])
        return mask_instance(self.instances[index], self.tokens, rng, self.config)


@dataclass
class PretrainingBatch:
    """A collated pre-training batch.

    `cpc_index[s] = (b, g)`: CPC sentence s is global g of example b; row s of `sentences` is that
    sentence encoded alone, so the CPC positive of s is s (matched by position, never by text).
    `cpc_duplicates[s, t]` is True when t != s has exactly the same tokens as s: a false negative
    that the loss may leave out."""

    batch: EtcBatch
    mlm_labels: torch.Tensor  # [B, L] int64
    cpc_index: torch.Tensor  # [S, 2] int64
    sentences: EtcBatch | None  # S sentence instances, None when S == 0
    cpc_duplicates: torch.Tensor  # [S, S] bool

    @property
    def num_cpc(self) -> int:
        return int(self.cpc_index.shape[0])

    def to(self, device: torch.device | str) -> PretrainingBatch:
        return PretrainingBatch(
            self.batch.to(device),
            self.mlm_labels.to(device),
            self.cpc_index.to(device),
            None if self.sentences is None else self.sentences.to(device),
            self.cpc_duplicates.to(device),
        )


def _duplicates(sentences: list[EtcInstance]) -> np.ndarray:
    keys = [s.long_token_ids.tobytes() + b"|" + s.global_token_ids.tobytes() for s in sentences]
    _, code = np.unique(np.array(keys, dtype=object), return_inverse=True) if keys else (None, np.zeros(0, np.int64))
    code = np.asarray(code).reshape(-1)
    same = code[:, None] == code[None, :]
    np.fill_diagonal(same, False)
    return same


def collate_pretraining(
    examples: Sequence[PretrainingExample], pad_to_long: int | None = None, pad_to_global: int | None = None
) -> PretrainingBatch:
    """Collate masked examples (a DataLoader collate_fn): the main batch, MLM labels padded with
    IGNORE_INDEX, and every CPC sentence of the batch in one sentence batch."""
    examples = list(examples)
    if not examples:
        raise BatchError("collate_pretraining needs at least one example")
    batch = collate([e.instance for e in examples], pad_to_long, pad_to_global)
    labels = np.full((len(examples), batch.long_token_ids.shape[1]), IGNORE_INDEX, dtype=np.int64)
    for b, example in enumerate(examples):
        labels[b, : example.mlm_labels.shape[0]] = example.mlm_labels
    index = [np.stack([np.full(e.cpc_globals.shape[0], b), e.cpc_globals], axis=1) for b, e in enumerate(examples)]
    cpc_index = np.concatenate(index).astype(np.int64) if index else np.zeros((0, 2), np.int64)
    sentences = [s for e in examples for s in e.cpc_sentences]
    if len(sentences) != cpc_index.shape[0]:
        raise BatchError(f"{cpc_index.shape[0]} CPC globals but {len(sentences)} sentence instances")
    return PretrainingBatch(
        batch=batch,
        mlm_labels=torch.from_numpy(labels),
        cpc_index=torch.from_numpy(cpc_index.reshape(-1, 2)),
        sentences=collate(sentences) if sentences else None,
        cpc_duplicates=torch.from_numpy(_duplicates(sentences)),
    )


__all__ = [
    "IGNORE_INDEX",
    "KEEP",
    "MASK",
    "RANDOM",
    "MaskingConfig",
    "PretrainingBatch",
    "PretrainingDataset",
    "PretrainingExample",
    "TokenInfo",
    "apply_mlm_mask",
    "choose_sentences",
    "choose_words",
    "collate_pretraining",
    "draw_actions",
    "mask_instance",
    "sentence_globals",
    "sentence_instance",
    "word_index",
    "word_spans",
    "word_starts",
]
