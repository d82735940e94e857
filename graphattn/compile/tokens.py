"""Resolve the schema's special and global tokens against a tokenizer, once per (schema, tokenizer)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphattn.errors import CompileError
from graphattn.schema import DEFAULT_ROLE_TOKENS, Schema
from graphattn.tokenize import Tokenizer


@dataclass(frozen=True)
class TokenTable:
    long_prefix: np.ndarray  # [P] int32
    global_prefix: np.ndarray  # [GP] int32
    sep: int | None
    node_global: dict[str, int]  # node type (global: node) -> global token id
    block: int | None


def _resolve(value, tokenizer: Tokenizer, schema: Schema, role: str | None, *path) -> int:
    """A token string or id -> id; [CLS]/[SEP] defaults fall back to the tokenizer's own."""
    if isinstance(value, int):
        if not 0 <= value < tokenizer.vocab_size:
            raise CompileError(
                f"token id {value} is outside the tokenizer's vocabulary of {tokenizer.vocab_size}",
                **schema.where(*path),
            )
        return value
    token_id = tokenizer.token_to_id(value)
    if token_id is None and role in ("cls", "sep") and value == DEFAULT_ROLE_TOKENS[role]:
        token_id = getattr(tokenizer, f"{role}_id", None)
    if token_id is None:
        raise CompileError(
            f"token {value!r} is not in the tokenizer's vocabulary ({tokenizer!r}); "
            "name a token it has or give an integer id",
            **schema.where(*path),
        )
    return int(token_id)


def resolve_tokens(schema: Schema, tokenizer: Tokenizer) -> TokenTable:
    special = schema.special_tokens

    def named(name: str, *path) -> int:
        declared = ("special_tokens", name) in schema.lines or special[name] != DEFAULT_ROLE_TOKENS.get(name)
        where = ("special_tokens", name) if declared else path
        return _resolve(special[name], tokenizer, schema, name, *where)

    long_prefix = np.array([named(n, "long_prefix", i) for i, n in enumerate(schema.long_prefix)], dtype=np.int32)
    global_prefix = np.array([named(n, "global_prefix", i) for i, n in enumerate(schema.global_prefix)], dtype=np.int32)
    needs_sep = any(t.sep_after for t in schema.node_types.values())
    sep = named("sep", "special_tokens") if needs_sep else None
    node_global: dict[str, int] = {}
    default_global: int | None = None
    for name, node_type in schema.node_types.items():
        if node_type.global_mode != "node":
            continue
        if node_type.global_token is not None:
            node_global[name] = _resolve(
                node_type.global_token, tokenizer, schema, None, "node_types", name, "global_token"
            )
        else:
            default_global = named("global", "special_tokens") if default_global is None else default_global
            node_global[name] = default_global
    block = None
    if schema.fixed_blocks is not None:
        if schema.fixed_blocks.global_token is not None:
            block = _resolve(schema.fixed_blocks.global_token, tokenizer, schema, None, "fixed_blocks", "global_token")
        else:
            block = named("global", "special_tokens")
    return TokenTable(long_prefix, global_prefix, sep, node_global, block)
