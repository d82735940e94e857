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
from graphattn.tokenize import Encoding, Tokenizer, spans_to_token_ranges

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


def encode_documents(plans: list[TextPlan], tokenizer: Tokenizer) -> list[tuple[Encoding | Exception, int]]:
    """(encoding, characters tokenized) per plan, one `encode_batch` call per round of growth;
    a text the tokenizer refuses gets its exception instead of an encoding."""
    results: list[tuple[Encoding | Exception, int]] = [(Encoding.empty(), 0)] * len(plans)  # nothing yet
    resume = suffix_exact(tokenizer)
    cuttable = prefix_exact(tokenizer)
    wanted = {i: _first_guess(plan) if cuttable else len(plan.text) for i, plan in enumerate(plans)}
    while wanted:
        stops = {i: _cut_point(plans[i], chars) for i, chars in wanted.items()}
        order = list(stops)
        starts = [results[i][1] if resume else 0 for i in order]
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
                    wanted[i] = max(2 * stop, int(rate * (plan.bound + 1) * GROWTH_MARGIN))
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
