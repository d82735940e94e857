"""Resolve the schema's special and global tokens against a tokenizer, once per (schema, tokenizer).

A schema names a token by its text (``"[unused0]"``, ``"<s>"``, ``"[CLS]"``) or by an integer id;
this is the one place where names become ids. A name the tokenizer lacks, or that names its
padding token, is refused (`CompileError` naming the schema key). A token (named or by id) that
is the unk token, an id that is the padding token, or any token that is an ordinary word of the
vocabulary (``"!"``, ``"the"``), is allowed but warned about in one line
(`SpecialTokenWarning`): those globals would
share the unk (or that word's) embedding, which is what a schema numbered for BERT's vocabulary
gives with another tokenizer. The compiled instances (and so the shards) hold only the resolved
ids; `TokenTable.resolved` lists them per schema key, which a compile records in its settings
(`graphattn.compile.special_token_ids`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from graphattn.errors import CompileError, GraphattnWarning, Location
from graphattn.schema import DEFAULT_ROLE_TOKENS, Schema
from graphattn.tokenize import Tokenizer

# Token texts that read as reserved, not as words: "[CLS]", "[unused0]", "<s>", "<mask>", "<extra_id_0>"
_RESERVED_SHAPE = re.compile(r"^(\[[^\[\]\s]+\]|<[^<>\s]+>)$")


class SpecialTokenWarning(GraphattnWarning):
    """A schema's special or global token id that is the tokenizer's unk or padding token, or a
    token that is an ordinary word of its vocabulary (the message names the schema key)."""

    def __init__(self, message: str, location: Location):
        self.location, self.reason = location, message
        super().__init__(f"{location}: {message}" if str(location) else message)


@dataclass(frozen=True)
class TokenTable:
    long_prefix: np.ndarray  # [P] int32
    global_prefix: np.ndarray  # [GP] int32
    sep: int | None
    node_global: dict[str, int]  # node type (global: node) -> global token id
    block: int | None
    resolved: Mapping[str, int] = field(default_factory=dict)  # schema key path ("special_tokens.global") -> id


def _describe(tokenizer: Tokenizer) -> str:
    source = getattr(tokenizer, "source", None)
    return f"{type(tokenizer).__name__} {source}" if source else repr(tokenizer)


def _is_reserved(tokenizer: Tokenizer, token_id: int, text: str | None) -> bool:
    """Whether an id stands for a special or reserved token rather than a word of the text."""
    roles = {getattr(tokenizer, f"{r}_id", None) for r in ("cls", "sep", "mask")} - {None}
    if token_id in roles or (text is not None and _RESERVED_SHAPE.match(text)):
        return True
    raw = getattr(tokenizer, "tokenizer", None)  # HFTokenizer: the added special tokens
    added = getattr(raw, "get_added_tokens_decoder", None)
    if callable(added):
        token = added().get(token_id)
        return bool(token is not None and token.special)
    return False


def _resolve(value, tokenizer: Tokenizer, schema: Schema, role: str | None, key: str, *path) -> int:
    """A token string or id -> id; [CLS]/[SEP] defaults fall back to the tokenizer's own.

    Refuses a name the tokenizer lacks or that is its padding token; warns for unk (named or by
    id), a padding id and an ordinary word (see the module docstring)."""
    where = schema.where(*path)
    if isinstance(value, int):
        if not 0 <= value < tokenizer.vocab_size:
            raise CompileError(
                f"token id {value} is outside the tokenizer's vocabulary of {tokenizer.vocab_size} "
                f"({_describe(tokenizer)})",
                **where,
            )
        token_id = value
    else:
        token_id = tokenizer.token_to_id(value)
        if token_id is None and role in ("cls", "sep") and value == DEFAULT_ROLE_TOKENS[role]:
            token_id = getattr(tokenizer, f"{role}_id", None)
        if token_id is None:
            raise CompileError(
                f"token {value!r} is not in the tokenizer's vocabulary ({_describe(tokenizer)}); name a token it has "
                f"(e.g. --set {key}=<token>) or compile with a tokenizer that reserves it "
                "(graphattn tokenizer train reserves [unused0]..[unused4])",
                **where,
            )
        token_id = int(token_id)
    try:
        text = tokenizer.id_to_token(token_id)
    except Exception:  # noqa: BLE001 - an adapter without text for this id: judged by id alone
        text = None
    shown = f"token id {token_id} ({text!r})" if isinstance(value, int) else f"token {value!r} (id {token_id})"
    unk_or_pad = next(
        (name for name, special in (("unk", tokenizer.unk_id), ("padding", tokenizer.pad_id)) if token_id == special),
        None,
    )
    if unk_or_pad is not None:
        message = (
            f"{shown} is the {unk_or_pad} token of {_describe(tokenizer)}: every such global would read as "
            f"{unk_or_pad}; name a reserved token the tokenizer has (e.g. --set {key}=[unused0])"
        )
        if unk_or_pad == "padding" and not isinstance(value, int):  # unk by name is only odd; padding is a mistake
            raise CompileError(message, **where)
        warnings.warn(SpecialTokenWarning(message, Location(**where)), stacklevel=3)
    elif not _is_reserved(tokenizer, token_id, text):
        message = (
            f"{shown} is an ordinary word of {_describe(tokenizer)}: these globals share its embedding; "
            f"name a reserved token the tokenizer has (e.g. --set {key}=[unused0])"
        )
        warnings.warn(SpecialTokenWarning(message, Location(**where)), stacklevel=3)
    return token_id


def resolve_tokens(schema: Schema, tokenizer: Tokenizer) -> TokenTable:
    """Every special and global token of `schema` as an id of `tokenizer` (see the module docstring)."""
    special = schema.special_tokens
    resolved: dict[str, int] = {}

    def look_up(key: str, value, role: str | None, *path) -> int:
        if key not in resolved:
            resolved[key] = _resolve(value, tokenizer, schema, role, key, *path)
        return resolved[key]

    def named(name: str, *path) -> int:
        declared = ("special_tokens", name) in schema.lines or special[name] != DEFAULT_ROLE_TOKENS.get(name)
        where = ("special_tokens", name) if declared else path
        return look_up(f"special_tokens.{name}", special[name], name, *where)

    long_prefix = np.array([named(n, "long_prefix", i) for i, n in enumerate(schema.long_prefix)], dtype=np.int32)
    global_prefix = np.array([named(n, "global_prefix", i) for i, n in enumerate(schema.global_prefix)], dtype=np.int32)
    needs_sep = any(t.sep_after for t in schema.node_types.values())
    sep = named("sep", "special_tokens") if needs_sep else None
    node_global: dict[str, int] = {}
    for name, node_type in schema.node_types.items():
        if node_type.global_mode != "node":
            continue
        if node_type.global_token is not None:
            node_global[name] = look_up(
                f"node_types.{name}.global_token", node_type.global_token, None, "node_types", name, "global_token"
            )
        else:
            node_global[name] = named("global", "special_tokens")
    block = None
    if schema.fixed_blocks is not None:
        if schema.fixed_blocks.global_token is not None:
            block = look_up(
                "fixed_blocks.global_token", schema.fixed_blocks.global_token, None, "fixed_blocks", "global_token"
            )
        else:
            block = named("global", "special_tokens")
    return TokenTable(long_prefix, global_prefix, sep, node_global, block, resolved)
