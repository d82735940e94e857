"""Tokenizers: the protocol the compiler uses (ids + character offsets), its adapters,
and WordPiece training (`core`); the spaCy word tokenizer (`words`); `load_tokenizer` (`load`);
where tokenizers come from on disk (`files`); the `graphattn tokenizer` command (`cli`)."""

from graphattn.errors import TokenizerError
from graphattn.tokenize.core import (
    CHAR_ALONE,
    CHAR_REMOVED,
    CHAR_SPACE,
    CHAR_UNKNOWN,
    CHAR_WORD,
    IS_WHITESPACE,
    RESERVED_GLOBAL_TOKENS,
    WORDPIECE_SPECIAL_TOKENS,
    Encoding,
    HFTokenizer,
    Tokenizer,
    plain_text,
    spans_to_token_ranges,
    train_wordpiece,
)
from graphattn.tokenize.load import load_tokenizer
from graphattn.tokenize.words import SpacyWordTokenizer

__all__ = [
    "CHAR_ALONE",
    "CHAR_REMOVED",
    "CHAR_SPACE",
    "CHAR_UNKNOWN",
    "CHAR_WORD",
    "IS_WHITESPACE",
    "RESERVED_GLOBAL_TOKENS",
    "WORDPIECE_SPECIAL_TOKENS",
    "Encoding",
    "HFTokenizer",
    "SpacyWordTokenizer",
    "Tokenizer",
    "TokenizerError",
    "load_tokenizer",
    "plain_text",
    "spans_to_token_ranges",
    "train_wordpiece",
]
