"""`load_tokenizer`: a tokenizer from whatever a user names it by (the adapters are in `core` and
`words`, what lies on disk in `files`)."""

from __future__ import annotations

import os
from typing import Any

from graphattn.errors import TokenizerError
from graphattn.tokenize.core import HFTokenizer, Tokenizer
from graphattn.tokenize.words import SpacyWordTokenizer


def load_tokenizer(spec: Any) -> Tokenizer:
    """A tokenizer from what a user names it by.

    Accepts an adapter (returned as is), a `tokenizers.Tokenizer`, a spaCy `Language`, the
    string ``"spacy:<lang>"`` (a growing word vocabulary on ``spacy.blank(lang)``), ``"default"``
    (the small WordPiece shipped for structure-only use and demos), or a path to a
    ``tokenizer.json`` or a Hugging Face model directory (``tokenizer.json``, BERT's
    ``vocab.txt``, RoBERTa's ``vocab.json`` + ``merges.txt``).
    """
    from tokenizers import Tokenizer as RawTokenizer

    if isinstance(spec, (HFTokenizer, SpacyWordTokenizer)):
        return spec

    if isinstance(spec, RawTokenizer):
        return HFTokenizer(spec)
    if isinstance(spec, str) and spec.startswith("spacy:"):
        return SpacyWordTokenizer(lang=spec.split(":", 1)[1] or "en")
    if isinstance(spec, (str, os.PathLike)):
        return HFTokenizer.from_file(spec)
    if hasattr(spec, "make_doc") and hasattr(spec, "tokenizer"):  # a spaCy Language
        return SpacyWordTokenizer(nlp=spec)
    if isinstance(spec, Tokenizer):
        return spec
    raise TokenizerError(
        f"cannot make a tokenizer from {type(spec).__name__}; give a tokenizer.json path, 'spacy:<lang>', "
        "a tokenizers.Tokenizer, a spaCy Language or an adapter"
    )
