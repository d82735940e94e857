"""Tokenizers: the protocol the compiler uses (ids + character offsets), its adapters,
`load_tokenizer` and WordPiece training (`core`); where tokenizers come from on disk (`files`);
the `graphattn tokenizer` command (`cli`)."""

from graphattn.errors import TokenizerError
from graphattn.tokenize.core import (
    CHAR_ALONE,
    CHAR_REMOVED,
    CHAR_SPACE,
    CHAR_UNKNOWN,
    CHAR_WORD,
    IS_WHITESPACE,
    WORDPIECE_SPECIAL_TOKENS,
    Encoding,
    HFTokenizer,
    SpacyWordTokenizer,
    Tokenizer,
    load_tokenizer,
    plain_text,
    spans_to_token_ranges,
    train_wordpiece,
)

__all__ = [
    "CHAR_ALONE",
    "CHAR_REMOVED",
    "CHAR_SPACE",
    "CHAR_UNKNOWN",
    "CHAR_WORD",
    "IS_WHITESPACE",
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
