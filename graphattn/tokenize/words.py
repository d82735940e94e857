"""A word-level tokenizer on spaCy's rule-based tokenizer (`SpacyWordTokenizer`): for plain text
without a trained subword vocabulary, and for pipelines a user already has (``spacy.blank`` or
their own ``nlp``). It speaks the compiler's protocol (`graphattn.tokenize.core.Tokenizer`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from graphattn.errors import TokenizerError
from graphattn.tokenize.core import (
    CHAR_SPACE,
    CHAR_UNKNOWN,
    CHAR_WORD,
    IS_WHITESPACE,
    RESERVED_GLOBAL_TOKENS,
    WORDPIECE_SPECIAL_TOKENS,
    Encoding,
    find_special_ids,
    plain_text,
    read_vocab_file,
    special_id_array,
    without_special_ids,
)


class SpacyWordTokenizer:
    """Word-level tokenizer on spaCy's rule-based tokenizer; whitespace tokens are skipped.

    The vocabulary is either *fixed* (given as a list of words or a file with one word per line:
    unknown words map to the unk id) or *growing* (each new word gets the next id; the default
    when no vocabulary is given, so ids depend on the order texts are seen; `save_vocab` keeps
    them). Special tokens come first in a new vocabulary and are added to a given one if missing;
    they include the global tokens schemas name ([unused0]..[unused4], `RESERVED_GLOBAL_TOKENS`).
    Only the tokenizer runs (``nlp.make_doc``), not the pipeline, so a user's ``nlp`` with heavy
    components costs nothing extra.
    """

    def __init__(
        self,
        vocab: Sequence[str] | str | os.PathLike | None = None,
        *,
        lang: str = "en",
        nlp: Any = None,
        grow: bool | None = None,
        lowercase: bool = False,
        special_tokens: Sequence[str] = (*WORDPIECE_SPECIAL_TOKENS, *RESERVED_GLOBAL_TOKENS),
    ):
        if nlp is None:
            import spacy

            try:
                nlp = spacy.blank(lang)
            except Exception as exc:
                raise TokenizerError(f"spaCy has no language {lang!r}: {str(exc).splitlines()[0]}") from None
        self.nlp = nlp
        self.lowercase = lowercase
        self.source = str(vocab) if isinstance(vocab, (str, os.PathLike)) else None
        words = read_vocab_file(Path(vocab)) if isinstance(vocab, (str, os.PathLike)) else list(vocab or [])
        self.grow = vocab is None if grow is None else grow
        self._id_of: dict[str, int] = {}
        self._tokens: list[str] = []
        for token in [*special_tokens, *words]:
            self._add(token)
        special = find_special_ids(self._id_of.get, {})
        self.cls_id, self.sep_id, self.pad_id = special["cls"], special["sep"], special["pad"]
        self.mask_id, self.unk_id = special["mask"], special["unk"]
        if not self.grow and self.unk_id is None:
            raise TokenizerError(
                "a fixed vocabulary needs an unk token ([UNK] or <unk>) for unknown words", file=self.source
            )
        self._special_ids = special_id_array((self._id_of[t] for t in special_tokens), self.unk_id)

    def _add(self, token: str) -> int:
        token_id = self._id_of.get(token)
        if token_id is None:
            token_id = self._id_of[token] = len(self._tokens)
            self._tokens.append(token)
        return token_id

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def _lookup(self, word: str) -> int:
        token_id = self._id_of.get(word)
        if token_id is not None:
            return token_id
        return self._add(word) if self.grow else self.unk_id  # type: ignore[return-value]

    def _encode_doc(self, doc: Any) -> Encoding:
        """Columns of the spaCy doc as arrays; the vocabulary is consulted once per distinct word."""
        from spacy.attrs import IDX, IS_SPACE, LENGTH, LOWER, ORTH

        columns = doc.to_array([IDX, LENGTH, IS_SPACE, LOWER if self.lowercase else ORTH]).reshape(-1, 4)
        columns = columns[columns[:, 2] == 0]
        distinct, first_seen, inverse = np.unique(columns[:, 3], return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        strings = doc.vocab.strings
        distinct_ids = np.empty(len(distinct), dtype=np.int32)
        for k in np.argsort(first_seen, kind="stable"):  # a growing vocabulary numbers words by first use
            distinct_ids[k] = self._lookup(strings[int(distinct[k])])
        starts = columns[:, 0].astype(np.int32)
        offsets = np.stack([starts, starts + columns[:, 1].astype(np.int32)], axis=1).reshape(-1, 2)
        first = offsets[first_seen]  # the offsets of each distinct word's first use, for errors
        distinct_ids = without_special_ids(distinct_ids, self._special_ids, self.unk_id, doc.text, first, self.source)
        ids = distinct_ids[inverse]
        token_strings = np.asarray([self._tokens[i] for i in distinct_ids], dtype=object)
        tokens = token_strings[inverse].tolist()
        return Encoding(ids.astype(np.int32, copy=False), offsets, tokens)

    def encode(self, text: str) -> Encoding:
        return self._encode_doc(self.nlp.make_doc(plain_text(text, "text")))

    def encode_batch(self, texts: Sequence[str]) -> list[Encoding]:
        texts = [plain_text(t, "texts", i) for i, t in enumerate(texts)]
        return [self._encode_doc(doc) for doc in self.nlp.tokenizer.pipe(texts)]

    def token_to_id(self, token: str) -> int | None:
        return self._id_of.get(token)

    def id_to_token(self, token_id: int) -> str:
        if not 0 <= int(token_id) < len(self._tokens):
            raise TokenizerError(
                f"token id {token_id} is outside the vocabulary of {self.vocab_size}", file=self.source
            )
        return self._tokens[int(token_id)]

    @property
    def prefix_exact(self) -> bool:
        """spaCy splits at spaces first, so a prefix ending before a space tokenizes like the
        whole text there; a growing vocabulary would still number words differently."""
        return not self.grow

    @property
    def suffix_exact(self) -> bool:
        """spaCy tokenizes the chunks between spaces one by one, so a piece between two cuts
        tokenizes like the whole text there."""
        return self.prefix_exact

    def char_classes(self, points: np.ndarray) -> np.ndarray:
        """``CHAR_*`` per code point: a space separates chunks, each chunk's first character
        starts a token; other whitespace may make a (skipped) whitespace token of its own."""
        classes = np.where(np.take(IS_WHITESPACE, points, mode="clip"), CHAR_UNKNOWN, CHAR_WORD).astype(np.uint8)
        classes[points == 0x20] = CHAR_SPACE
        return classes

    def save_vocab(self, path: str | os.PathLike) -> None:
        """Write one token per line, in id order (readable back as a fixed vocabulary)."""
        Path(path).write_text("".join(f"{t}\n" for t in self._tokens), encoding="utf-8")

    def __repr__(self) -> str:
        mode = "growing" if self.grow else "fixed"
        return f"SpacyWordTokenizer(lang={self.nlp.lang!r}, vocab_size={self.vocab_size}, {mode})"


# tokenizers' components that work per character (normalizers) or split at spaces (pre-tokenizers).
