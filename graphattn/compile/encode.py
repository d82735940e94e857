"""Tokenize documents for layout: many per tokenizer call, and only as far as anything can be kept.

Under `truncation.policy: tail` a document keeps at most its first ``max_long_length - prefix``
long tokens, so a 10 MB page with a 4,096-token schema needs only its first few pages of text
tokenized. `long_token_bound` says when such a bound exists (tail only: `drop_longest_first`
chooses what to drop from the sizes of all contexts, `windows` compiles every window and
`error` reports the full size), and `encode_documents` then tokenizes a prefix of the text that
holds more long tokens than the bound, growing it until it does or the text ends: the first
prefix allows `FIRST_CHARS_PER_TOKEN` characters per token (a text shorter than that is
tokenized whole, once), a prefix too short grows by the rate of tokens it showed. Every step
depends on the document alone, so the cut (and the report) is deterministic.

A prefix is cut right before a space that follows a non-space, and only for tokenizers whose
tokens there are provably those of the whole text (`Tokenizer.prefix_exact`: per-character
normalizers, pre-tokenizers that split at spaces, no added token holding a space); any other
tokenizer gets the whole text, as before. Selected ``per_token`` nodes, whose every wordpiece is
a global, are never cut: the prefix extends past their end.

A prefix grows by tokenizing only what it adds (``text[stop:new_stop]``, its offsets shifted)
when the tokenizer says that gives the whole text's tokens there (`Tokenizer.suffix_exact`),
else from the start again. The cuts do not depend on which, so neither do the instance and
its report. (A tighter first guess would tokenize less, but the layout's count of globals past
the cut, `layout._long_text_past`, counts non-space text that may yield no token, so the kept
globals could then differ from those of the whole text.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from graphattn.compile.ranges import coverage
from graphattn.schema import Schema
from graphattn.tokenize import (
    CHAR_ALONE,
    CHAR_REMOVED,
    CHAR_SPACE,
    CHAR_WORD,
    IS_WHITESPACE,
    Encoding,
    Tokenizer,
    spans_to_token_ranges,
)

FIRST_CHARS_PER_TOKEN = 6  # the first prefix: 6 characters per long token kept (English wordpieces take 3-5)
MIN_PREFIX_CHARS = 4096  # and never less (shorter texts are tokenized whole)
GROWTH_MARGIN = 1.2  # a prefix too short grows to the bound's tokens at the rate it showed, and a fifth more
_CUT = re.compile(r"(?<=\S) ")  # a space right after a non-space: where a prefix may end


def long_token_bound(schema: Schema) -> int | None:
    """The most long tokens of one document any instance of this schema can keep, or None when
    the truncation policy needs every token of the document."""
    if schema.truncation.policy != "tail":
        return None
    return max(schema.max_long_length - len(schema.long_prefix), 0)


@dataclass
class TextPlan:
    """What one document needs tokenized: its text, how many long tokens suffice (None: all),
    where its long text is (None: everywhere) and spans that must not be cut."""

    text: str
    bound: int | None = None
    long_spans: np.ndarray | None = None  # [k, 2] char spans of the long nodes
    whole_spans: np.ndarray | None = None  # [k, 2] char spans tokenized whole or not at all


def prefix_exact(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` may be given a prefix of a text (see the module docstring)."""
    return bool(getattr(tokenizer, "prefix_exact", False))


def suffix_exact(tokenizer: Tokenizer) -> bool:
    """Whether a prefix may grow by tokenizing only what it adds (see the module docstring)."""
    return prefix_exact(tokenizer) and bool(getattr(tokenizer, "suffix_exact", False))


def may_cut(tokenizer: Tokenizer) -> bool:
    """Whether a text may be tokenized only in part: the tokens of a prefix and of pieces between
    cuts are the whole text's, and the tokenizer's character classes say where tokens start
    (`long_text_past`; a tokenizer that keeps spaces in its tokens says nothing certain)."""
    classes = getattr(tokenizer, "char_classes", None)
    return suffix_exact(tokenizer) and callable(classes) and classes(_SPACE)[0] == CHAR_SPACE


_SPACE = np.array([0x20], dtype=np.uint32)


def encode_documents(plans: list[TextPlan], tokenizer: Tokenizer) -> list[tuple[Encoding | Exception, int]]:
    """(encoding, characters tokenized) per plan, one `encode_batch` call per round of growth;
    a text the tokenizer refuses gets its exception instead of an encoding."""
    results: list[tuple[Encoding | Exception, int]] = [(Encoding.empty(), 0)] * len(plans)  # nothing yet
    cuttable = may_cut(tokenizer)
    wanted = {i: _first_guess(plan) if cuttable else len(plan.text) for i, plan in enumerate(plans)}
    while wanted:
        stops = {i: _cut_point(plans[i], chars) for i, chars in wanted.items()}
        order = list(stops)
        starts = [results[i][1] for i in order]  # grown from where the last prefix stopped
        encodings = _encode_batch([plans[i].text[start : stops[i]] for i, start in zip(order, starts)], tokenizer)
        wanted = {}
        for i, start, encoding in zip(order, starts, encodings):
            plan, stop = plans[i], stops[i]
            if start and isinstance(encoding, Exception):  # the whole prefix again, for the error's positions
                encoding = _encode_batch([plan.text[:stop]], tokenizer)[0]
            elif start:
                encoding = Encoding.concatenate([results[i][0], encoding.shifted(start)])  # type: ignore[list-item]
            results[i] = (encoding, stop)
            if stop < len(plan.text) and not isinstance(encoding, Exception):
                found = _long_tokens(encoding, plan)
                if found <= plan.bound:  # not enough yet: grow the prefix by what the rate so far says
                    rate = stop / max(found, 1)
                    wanted[i] = max(stop + MIN_PREFIX_CHARS, int(rate * (plan.bound + 1) * GROWTH_MARGIN))
    return results


def _first_guess(plan: TextPlan) -> int:
    if plan.bound is None:
        return len(plan.text)
    return max(MIN_PREFIX_CHARS, (plan.bound + 1) * FIRST_CHARS_PER_TOKEN)


def _cut_point(plan: TextPlan, chars: int) -> int:
    """The first allowed cut at or after `chars` that splits no whole span; the text's end if none."""
    text = plan.text
    stop = chars
    while stop < len(text):
        match = _CUT.search(text, stop)
        if match is None:
            return len(text)
        stop = match.start()
        spans = plan.whole_spans
        if spans is None or not spans.size:
            return stop
        inside = (spans[:, 0] < stop) & (spans[:, 1] > stop)
        if not inside.any():
            return stop
        stop = int(spans[inside, 1].max())
    return len(text)


def _long_tokens(encoding: Encoding, plan: TextPlan) -> int:
    if plan.long_spans is None:
        return len(encoding)
    spans = plan.long_spans
    if len(encoding):
        spans = spans[spans[:, 0] <= encoding.offsets[-1, 0]]  # one starting past the last token holds none
    ranges = spans_to_token_ranges(encoding.offsets, spans)
    return int(np.count_nonzero(coverage(len(encoding), ranges[:, 0], ranges[:, 1])))


def _encode_batch(texts: list[str], tokenizer: Tokenizer) -> list[Encoding | Exception]:
    """One batch call; when it fails, text by text, so that only the texts at fault fail."""
    if len(texts) > 1:
        try:
            return list(tokenizer.encode_batch(texts))
        except Exception:  # noqa: BLE001 - found below, text by text
            pass
    out: list[Encoding | Exception] = []
    for text in texts:
        try:
            out.append(tokenizer.encode(text))
        except Exception as err:  # noqa: BLE001 - belongs to this document
            out.append(err)
    return out


def long_text_past(
    text: str, stop: int, spans: np.ndarray, long_spans: np.ndarray | None, tokenizer: Tokenizer
) -> np.ndarray:
    """bool [N]: the node's span (-1: none) holds, past character `stop` (where tokenizing
    stopped), a long token of the whole text's tokens, found without tokenizing all of it.

    The tokenizer's `char_classes` mark where tokens certainly start (the first character of
    each pre-token) and where none can (spaces, characters its normalizer removes); a node with
    long text but no certain start (its span begins inside a word, say) is decided by tokenizing
    the text between the cuts around it, which gives the whole text's tokens there.
    """
    out = np.zeros(len(spans), dtype=bool)
    reach = (spans[:, 0] >= 0) & (spans[:, 1] > stop)
    if stop >= len(text) or not reach.any():
        return out
    points = np.frombuffer(text[stop:].encode("utf-32-le"), dtype="<u4")
    classes = tokenizer.char_classes(points)
    before = np.empty_like(classes)  # the class of the character before, removed ones skipped
    before[0], before[1:] = CHAR_REMOVED, classes[:-1]  # text[stop] is a space after text: a cut
    if (classes == CHAR_REMOVED).any():
        last = np.where(classes != CHAR_REMOVED, np.arange(points.size), -1)
        last = np.maximum.accumulate(last)[:-1]
        before[1:] = np.where(last >= 0, classes[np.maximum(last, 0)], CHAR_REMOVED)
    starts = (classes == CHAR_ALONE) | ((classes == CHAR_WORD) & ((before == CHAR_SPACE) | (before == CHAR_ALONE)))
    maybe = classes > CHAR_REMOVED  # word, alone or unknown: may start a token
    long = None
    if long_spans is not None:
        here = long_spans[long_spans[:, 1] > stop]
        long = coverage(points.size, np.maximum(here[:, 0], stop) - stop, here[:, 1] - stop)
        starts &= long
        maybe &= long
    rows = np.flatnonzero(reach)
    first, end = np.maximum(spans[rows, 0], stop) - stop, spans[rows, 1] - stop
    certain, possible = _any_in(starts, first, end), _any_in(maybe, first, end)
    out[rows] = certain
    unsure = ~certain & possible
    if unsure.any():
        token_starts = _token_starts(text, stop, points, first[unsure], end[unsure], tokenizer)
        if long is not None:
            token_starts = token_starts[long[token_starts]]
        out[rows[unsure]] = np.searchsorted(token_starts, end[unsure]) > np.searchsorted(token_starts, first[unsure])
    return out


def _any_in(flags: np.ndarray, first: np.ndarray, end: np.ndarray) -> np.ndarray:
    cum = np.zeros(flags.size + 1, dtype=np.int32 if flags.size < 2**31 else np.int64)  # int32: half the pass
    np.cumsum(flags, out=cum[1:])
    return cum[end] > cum[first]


def _token_starts(
    text: str, stop: int, points: np.ndarray, first: np.ndarray, end: np.ndarray, tokenizer: Tokenizer
) -> np.ndarray:
    """Sorted starts (relative to `stop`) of the whole text's tokens in the pieces between the
    cuts around each [first, end), each piece tokenized on its own (`Tokenizer.suffix_exact`).
    A piece the tokenizer refuses counts as starting a token at each of its characters."""
    spaces = np.flatnonzero(points == 0x20)
    cuts = spaces[(spaces == 0) | ~np.take(IS_WHITESPACE, points[spaces - 1], mode="clip")]  # as `_CUT` finds them
    cuts = np.append(cuts, points.size)
    piece_first = cuts[np.searchsorted(cuts, first, side="right") - 1]
    piece_end = cuts[np.searchsorted(cuts, end, side="left")]
    order = np.argsort(piece_first, kind="stable")
    piece_first, piece_end = piece_first[order], np.maximum.accumulate(piece_end[order])
    fresh = np.ones(piece_first.size, dtype=bool)
    fresh[1:] = piece_first[1:] >= piece_end[:-1]  # a piece overlapping the one before joins it
    group = np.cumsum(fresh) - 1
    lo = piece_first[fresh]
    hi = np.zeros(lo.size, dtype=np.int64)
    np.maximum.at(hi, group, piece_end)
    encodings = _encode_batch([text[stop + a : stop + b] for a, b in zip(lo.tolist(), hi.tolist())], tokenizer)
    found = [
        np.arange(a, b) if isinstance(e, Exception) else e.offsets[:, 0].astype(np.int64) + a
        for a, b, e in zip(lo.tolist(), hi.tolist(), encodings)
    ]
    return np.concatenate(found) if found else np.zeros(0, np.int64)
