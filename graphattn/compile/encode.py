"""Tokenize documents for layout: many per tokenizer call, and only as far as anything can be kept.

Under `truncation.policy: tail` a document keeps at most its first ``max_long_length - prefix``
long tokens, so a 10 MB page with a 4,096-token schema needs only its first few pages of text
tokenized. `long_token_bound` says when such a bound exists (tail only: `drop_longest_first`
chooses what to drop from the sizes of all contexts, `windows` compiles every window and
`error` reports the full size), and `encode_documents` then tokenizes a prefix of the text that
holds more long tokens than the bound, growing it until it does or the text ends: the first
prefix allows `FIRST_CHARS_PER_TOKEN` characters per token (a text shorter than
`MIN_PREFIX_CHARS` is tokenized whole, once; documentation pages take 1.9-2.9 characters per
wordpiece, so 3 is one round for them), a prefix too short grows by tokenizing only what it adds,
to the bound at the rate of tokens it showed and `GROWTH_MARGIN` more. Every step depends on the
document alone, so the cut (and the report) is deterministic.

A prefix is cut right before a space that follows a non-space, and only for tokenizers whose
tokens there are provably those of the whole text, and those of a piece between two such cuts
too (`Tokenizer.prefix_exact`, `Tokenizer.suffix_exact`: per-character normalizers,
pre-tokenizers that split at spaces, no added token holding a space), and that say where their
tokens start (`char_classes`, below); any other tokenizer gets the whole text, as before.
Selected ``per_token`` nodes, whose every wordpiece is a global, are never cut: the prefix
extends past their end.

Past the cut nothing is kept, but which nodes there hold long tokens still decides the instance
(a global without long tokens is kept, one whose text was cut away is dropped) and the report.
`long_text_past` finds them as the whole text's tokens would: the tokenizer's own normalizer and
pre-tokenizer classify each character (`HFTokenizer.char_classes`: a space, a character the
normalizer removes such as U+200B, one that starts a pre-token, punctuation alone), so a node
holding a pre-token's first character holds a token and one of spaces and removed characters
holds none; a node left unsure (one inside a word, whose token may start before it) is decided
by tokenizing the text between the cuts around it. The cut changes the work, never the
instance or its report (but for the sizes before truncation, which then count up to the cut).
A tokenizer that keeps spaces in its tokens (byte-level BPE, Metaspace) says nothing certain
and is not cut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from graphattn.compile.ranges import coverage, expand_ranges
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

FIRST_CHARS_PER_TOKEN = 3  # the first prefix: 3 characters per long token kept (module docstring)
MIN_PREFIX_CHARS = 4096  # and never less (shorter texts are tokenized whole)
GROWTH_MARGIN = 1.1  # a prefix too short grows to the bound's tokens at the rate it showed, and a tenth more
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
        # one starting past the last token holds none (np.compress: a boolean index is 5x slower)
        spans = np.compress(spans[:, 0] <= encoding.offsets[-1, 0], spans, axis=0)
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
    removed = np.flatnonzero(classes == CHAR_REMOVED)  # rare: mend `before` after each run of them
    if removed.size:
        run_start = np.maximum.accumulate(np.where(np.diff(removed, prepend=-2) != 1, removed, 0))
        after = removed + 1 < points.size
        before[removed[after] + 1] = np.where(run_start > 0, classes[np.maximum(run_start - 1, 0)], CHAR_REMOVED)[after]
    starts = (classes == CHAR_ALONE) | ((classes == CHAR_WORD) & ((before == CHAR_SPACE) | (before == CHAR_ALONE)))
    maybe = classes > CHAR_REMOVED  # word, alone or unknown: may start a token
    long = None if long_spans is None else _long_chars(long_spans, stop, classes)
    if long is not None:
        starts &= long
        maybe &= long
    rows = np.flatnonzero(reach)
    reaching = np.take(spans, rows, axis=0)  # np.take: a fancy index of rows is 5x slower
    first, end = np.maximum(reaching[:, 0], stop) - stop, reaching[:, 1] - stop
    out[rows] = certain = _any_in(starts, first, end)
    rows, first, end = rows[~certain], first[~certain], end[~certain]  # few: a page's nodes mostly start words
    unsure = _any_in(maybe, first, end)
    if unsure.any():
        token_starts = _token_starts(text, stop, points, first[unsure], end[unsure], tokenizer)
        if long is not None:
            token_starts = token_starts[long[token_starts]]
        out[rows[unsure]] = np.searchsorted(token_starts, end[unsure]) > np.searchsorted(token_starts, first[unsure])
    return out


def _long_chars(long_spans: np.ndarray, stop: int, classes: np.ndarray) -> np.ndarray | None:
    """bool per character past `stop`: inside a long node; None when every character that may
    start a token is (long text nodes that tile the text but for spaces: looks at the gaps only)."""
    n = classes.size
    here = np.compress(long_spans[:, 1] > stop, long_spans, axis=0)  # a boolean index is 5x slower
    first, end = np.maximum(here[:, 0], stop) - stop, here[:, 1] - stop
    if first.size and np.all(first[1:] >= end[:-1]):  # disjoint and in order, as text nodes are
        gap_first, gap_end = np.append(0, end), np.append(first, n)
        width = gap_end - gap_first
        if int(width.sum()) <= n // 8:
            wide = width > 1  # most gaps are one separator or none
            at, _ = expand_ranges(gap_first[wide], gap_end[wide])
            if not (classes[gap_first[width == 1]] > CHAR_REMOVED).any() and not (classes[at] > CHAR_REMOVED).any():
                return None
    return coverage(n, first, end)


def _any_in(flags: np.ndarray, first: np.ndarray, end: np.ndarray) -> np.ndarray:
    """bool per [first, end): a flag is set there.

    Looks at each range's first flag, then the next 8, 64, ... for the ranges still without
    one (a page's nodes mostly have one at once), and searches the positions of all flags only
    when looking further would cost a pass over them."""
    out = (end > first) & flags[np.minimum(first, flags.size - 1)]
    left = np.flatnonzero(~out & (first + 1 < end))
    seen, width = 1, 8
    while left.size:
        if left.size * width > flags.size // 4 + 1:
            flagged = np.append(np.flatnonzero(flags), flags.size)
            out[left] = flagged[np.searchsorted(flagged, first[left] + seen)] < end[left]
            break
        at = first[left, None] + (seen + np.arange(width))
        out[left] = (flags[np.minimum(at, flags.size - 1)] & (at < end[left, None])).any(axis=1)
        seen += width
        left = left[~out[left] & (first[left] + seen < end[left])]
        width *= 8
    return out


def _token_starts(
    text: str, stop: int, points: np.ndarray, first: np.ndarray, end: np.ndarray, tokenizer: Tokenizer
) -> np.ndarray:
    """Sorted starts (relative to `stop`) of the whole text's tokens in the pieces between the
    cuts around each [first, end), which tokenize as in the whole text (`Tokenizer.suffix_exact`).
    Pieces the tokenizer refuses count as starting a token at each of their characters."""
    piece_first, piece_end = _cut_around(points, first, end)
    order = np.argsort(piece_first, kind="stable")
    piece_first, piece_end = piece_first[order], np.maximum.accumulate(piece_end[order])
    fresh = np.ones(piece_first.size, dtype=bool)
    fresh[1:] = piece_first[1:] >= piece_end[:-1]  # a piece overlapping the one before joins it
    group = np.cumsum(fresh) - 1
    lo = piece_first[fresh]
    hi = np.zeros(lo.size, dtype=np.int64)
    np.maximum.at(hi, group, piece_end)
    # Each distinct piece once (a page repeats its boilerplate), all in one text: each starts
    # with a cut's space and ends before one (or at the text's end: that piece is unique and
    # last), so where they meet is a cut too and each tokenizes as on its own.
    pieces = [text[stop + a : stop + b] for a, b in zip(lo.tolist(), hi.tolist())]
    distinct: dict[str, int] = {}
    which = np.array([distinct.setdefault(piece, len(distinct)) for piece in pieces], dtype=np.int64)
    ordered = list(distinct)  # in first use (dicts keep it): only the last piece may end in a space, once
    lengths = np.array([len(piece) for piece in ordered], dtype=np.int64)
    joined_start = np.concatenate([[0], np.cumsum(lengths)])
    (encoding,) = _encode_batch(["".join(ordered)], tokenizer)
    if isinstance(encoding, Exception):  # no piece decided: each character may start a token
        return np.flatnonzero(coverage(points.size, lo, hi))
    at = encoding.offsets[:, 0].astype(np.int64)
    owner = np.searchsorted(joined_start, at, side="right") - 1  # the distinct piece each token is in
    at -= joined_start[owner]
    first_token = np.searchsorted(owner, np.arange(len(ordered) + 1))  # each distinct piece's tokens
    token, piece = expand_ranges(first_token[which], first_token[which + 1])
    return at[token] + lo[piece]


def _cut_around(points: np.ndarray, first: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The last cut at or before each `first` and the first at or after each `end` (the text's
    end is one; so is position 0, where tokenizing stopped), as `_CUT` finds them."""
    return _nearest_cut(points, first, -1), _nearest_cut(points, end, 1)


def _nearest_cut(points: np.ndarray, at: np.ndarray, step: int) -> np.ndarray:
    """The nearest cut from each of `at` in direction `step`: looked for within 16 characters
    (a cut is mostly a word away), then 256, then over the whole text (at once when the windows
    would take more memory than the text)."""
    n = points.size

    def is_cut(where: np.ndarray) -> np.ndarray:
        here, before = points[np.minimum(where, n - 1)], points[np.maximum(where - 1, 0)]
        return (where == 0) | (where >= n) | ((here == 0x20) & ~np.take(IS_WHITESPACE, before, mode="clip"))

    out = np.empty(at.size, dtype=np.int64)
    left = np.arange(at.size)
    for window in (16, 256):
        if left.size * window > 4 * n + 4096:  # windows would outgrow a pass over the whole text
            break
        near = np.clip(at[left, None] + step * np.arange(window), 0, n)
        cut = is_cut(near)
        found = cut.any(axis=1)
        out[left[found]] = near[found, cut[found].argmax(axis=1)]
        left = left[~found]
        if not left.size:
            return out
    spaces = np.flatnonzero(points == 0x20)
    cuts = np.append(spaces[is_cut(spaces)], n)  # the first is 0: tokenizing stopped before a space
    out[left] = cuts[np.searchsorted(cuts, at[left], side="right") - 1 if step < 0 else np.searchsorted(cuts, at[left])]
    return out
