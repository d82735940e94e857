"""Small documents, schemas and a transparent tokenizer for the compiler tests.

`WordTokenizer` makes one token per whitespace-separated word, so a test controls token counts
exactly: a sentence of n words is n tokens. Words are ``w<i>``; ids are assigned in first-seen
order after the special tokens, which keeps expected tensors easy to write by hand.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphattn.graph import DocGraph
from graphattn.tokenize import Encoding

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]", "[unused2]")


class WordTokenizer:
    """Whitespace tokenizer implementing graphattn's tokenizer protocol."""

    def __init__(self) -> None:
        self._ids = {t: i for i, t in enumerate(SPECIALS)}
        self._tokens = list(SPECIALS)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = 0, 1, 2, 3, 4

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def _id(self, word: str) -> int:
        if word not in self._ids:
            self._ids[word] = len(self._tokens)
            self._tokens.append(word)
        return self._ids[word]

    def encode(self, text: str) -> Encoding:
        matches = list(re.finditer(r"\S+", text))
        ids = np.array([self._id(m.group()) for m in matches], dtype=np.int32)
        offsets = np.array([[m.start(), m.end()] for m in matches], dtype=np.int32).reshape(-1, 2)
        return Encoding(ids, offsets, [m.group() for m in matches])

    def encode_batch(self, texts: Sequence[str]) -> list[Encoding]:
        return [self.encode(t) for t in texts]

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)

    def id_to_token(self, token_id: int) -> str:
        return self._tokens[token_id]

    def __repr__(self) -> str:
        return "WordTokenizer()"


def sentences_doc(
    paragraphs: Sequence[Sequence[int]], doc_id: str = "d", *, word: str = "w", paragraph_spans: bool = True
) -> DocGraph:
    """document > paragraphs > sentences; paragraph p sentence s has the given number of words.

    Node ids: ``doc``, ``p0``, ``p0.s1``. Words are ``<word><running index>``.
    """
    text_parts, spans, n = [], [], 0
    pos = 0
    for sentences in paragraphs:
        p_start = pos
        sent_spans = []
        for length in sentences:
            words = [f"{word}{n + i}" for i in range(length)]
            n += length
            sentence = " ".join(words)
            sent_spans.append((pos, pos + len(sentence)))
            text_parts.append(sentence + " ")
            pos += len(sentence) + 1
        spans.append(((p_start, pos - 1), sent_spans))
    text = "".join(text_parts)
    graph = DocGraph(text, doc_id=doc_id)
    graph.add_node("doc", "document", (0, len(text)))
    for p, (p_span, sent_spans) in enumerate(spans):
        graph.add_child("doc", f"p{p}", "paragraph", p_span if paragraph_spans else None)
        for s, span in enumerate(sent_spans):
            graph.add_child(f"p{p}", f"p{p}.s{s}", "sentence", span)
    return graph


def schema_dict(**overrides: Any) -> dict:
    """A small document > paragraph > sentence schema (k=2, r=3) to override per test."""
    base: dict[str, Any] = {
        "name": "test",
        "local_radius": 3,
        "relative_pos_max_distance": 2,
        "relative_vocab_size": 16,
        "max_long_length": 512,
        "max_global_length": 64,
        "special_tokens": {"global": "[unused0]"},
        "node_types": {
            "document": {},
            "paragraph": {},
            "sentence": {"global": "node", "long": True},
        },
        "relations": {"contains": {"hierarchy": True}},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict) and key != "node_types":
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base
