"""The graph compiler's entry points: graph(s) + schema + tokenizer -> EtcInstance(s).

    compile_instance(graph, schema, tokenizer)   one instance (a list of graphs packs them)
    compile_windows(graph, schema, tokenizer)    every window of a strided layout (NQ)
    compile_many(graphs, schema, tokenizer)      compile_windows of many documents, tokenized in batches
    pack(graphs, schema, tokenizer)              greedy packing of many small documents
    pack_groups(graphs, schema, tokenizer)       the same, saying which inputs each instance holds
    load_schema_and_tokenizer(schema, tokenizer) load both and resolve special tokens, up front
    special_token_ids(schema, tokenizer)         the id each named special / global token resolves to

Three passes, each in its own module: `layout` (check the graph, map nodes to tokens),
`truncate` (choose tokens), `assemble` (sequences, owners, labels -> compact side inputs, and
the eight dense tensors unless `compact=True`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphattn.compile.assemble import assemble
from graphattn.compile.assemble_batch import assemble_many
from graphattn.compile.layout import DocLayout, build_layout, build_layouts
from graphattn.compile.tokens import TokenTable, resolve_tokens
from graphattn.compile.truncate import Selection, select, whole_sizes, window_selections
from graphattn.contract import EtcInstance
from graphattn.errors import CompileError
from graphattn.graph import DocGraph
from graphattn.schema import Schema, load_schema
from graphattn.tokenize import Tokenizer, load_tokenizer

_TABLES: dict[tuple[int, int], tuple[Schema, Any, TokenTable]] = {}
_LOADED: dict[tuple[str, str, float], Any] = {}


def _load_cached(kind: str, spec: Any, loader):
    """Schemas and tokenizers named by path are loaded once per file version, not per document."""
    if not isinstance(spec, (str, os.PathLike)):
        return loader(spec)
    path = Path(spec)
    key = (kind, str(spec), path.stat().st_mtime if path.is_file() else 0.0)
    if key not in _LOADED:
        if len(_LOADED) > 32:
            _LOADED.clear()
        _LOADED[key] = loader(spec)
    return _LOADED[key]


def _prepare(schema: Any, tokenizer: Any) -> tuple[Schema, Tokenizer, TokenTable]:
    """Load schema and tokenizer from whatever names them; resolve special tokens once per pair."""
    schema = _load_cached("schema", schema, load_schema)
    tokenizer = _load_cached("tokenizer", tokenizer, load_tokenizer)
    key = (id(schema), id(tokenizer))
    cached = _TABLES.get(key)
    if cached is None or cached[0] is not schema or cached[1] is not tokenizer:
        if len(_TABLES) > 64:
            _TABLES.clear()
        cached = _TABLES[key] = (schema, tokenizer, resolve_tokens(schema, tokenizer))
    return schema, tokenizer, cached[2]


def _as_list(graphs: DocGraph | Sequence[DocGraph], schema: Schema) -> list[DocGraph]:
    if isinstance(graphs, DocGraph):
        return [graphs]
    if isinstance(graphs, (dict, str, bytes)) or not hasattr(graphs, "__iter__"):
        hint = "; DocGraph.from_dict(data) reads the JSON form" if isinstance(graphs, dict) else ""
        raise CompileError(f"expected a DocGraph or a list of DocGraphs, got {type(graphs).__name__}{hint}")
    graphs = list(graphs)
    if not graphs:
        raise CompileError("no documents to compile")
    if len(graphs) > schema.max_documents:
        raise CompileError(
            f"{len(graphs)} documents given, but the schema packs at most {schema.max_documents} per instance "
            "(packing.max_documents); use graphattn.compile.pack to spread them over instances",
            **schema.where("packing", "max_documents"),
        )
    return graphs


def compile_instance(
    graphs: DocGraph | Sequence[DocGraph],
    schema: Schema | str | Any,
    tokenizer: Tokenizer | str | Any,
    *,
    compact: bool = False,
) -> EtcInstance:
    """Compile one document (or a list, packed into one instance) into ETC inputs.

    `schema` is a Schema, a file path or a shipped schema name; `tokenizer` anything
    `load_tokenizer` accepts. With `compact=True` the instance holds `CompactSideInputs`
    (memory O(L + G + E)); otherwise the eight dense tensors. Too-long input is truncated
    per the schema and reported in `instance.truncation`.
    """
    schema, tokenizer, table = _prepare(schema, tokenizer)
    layouts = [build_layout(g, schema, tokenizer) for g in _as_list(graphs, schema)]
    return assemble(layouts, select(layouts, schema), schema, table, compact=compact)


def compile_windows(
    graph: DocGraph, schema: Schema | str | Any, tokenizer: Tokenizer | str | Any, *, compact: bool = False
) -> list[EtcInstance]:
    """Every instance a document yields: all windows under the `windows` policy, else one."""
    schema, tokenizer, table = _prepare(schema, tokenizer)
    if not isinstance(graph, DocGraph):
        raise CompileError(f"compile_windows takes one DocGraph, got {type(graph).__name__}")
    return _instances(build_layout(graph, schema, tokenizer), schema, table, compact)


def _instances(layout: DocLayout, schema: Schema, table: TokenTable, compact: bool) -> list[EtcInstance]:
    if schema.truncation.policy != "windows":
        return [assemble([layout], select([layout], schema), schema, table, compact=compact)]
    return [assemble([layout], [sel], schema, table, compact=compact) for sel in window_selections(layout, schema)]


def _instances_many(
    layouts: list[DocLayout | Exception], schema: Schema, table: TokenTable, compact: bool
) -> list[list[EtcInstance] | Exception]:
    """`_instances` of each layout (or its exception, passed on), assembled in one batch
    (`assemble_many`): each document gets its instances, or the first exception it met."""
    out: list[list[EtcInstance] | Exception] = []
    items, owner = [], []  # one item per instance, and the document it belongs to
    for d, layout in enumerate(layouts):
        try:
            if isinstance(layout, Exception):
                raise layout
            if schema.truncation.policy != "windows":
                selections = [select([layout], schema)]
            else:
                selections = [[sel] for sel in window_selections(layout, schema)]
        except Exception as err:  # noqa: BLE001 - per document
            out.append(err)
            continue
        out.append([])
        items.extend(([layout], sels) for sels in selections)
        owner.extend([d] * len(selections))
    for d, result in zip(owner, assemble_many(items, schema, table, compact=compact)):
        done = out[d]
        if isinstance(done, list):  # a document's first failing instance stands for it
            if isinstance(result, Exception):
                out[d] = result
            else:
                done.append(result)
    return out


OnError = Callable[[int, DocGraph, Exception], None]
"""`on_error(index, graph, error)`: the input at `index` failed and was left out."""

BATCH_SIZE = 32  # documents tokenized per tokenizer call by `compile_many` and `pack_groups`


def compile_many(
    graphs: Sequence[DocGraph],
    schema: Schema | str | Any,
    tokenizer: Tokenizer | str | Any,
    *,
    compact: bool = False,
    on_error: OnError | None = None,
) -> list[list[EtcInstance]]:
    """`compile_windows` of many documents in one call: the instances of each, in input order.

    The texts are tokenized together (`Tokenizer.encode_batch`, one call per `BATCH_SIZE`
    documents, and under `tail` only as far as anything can be kept); the result is the same as
    compiling them one by one. Without `on_error` the first document that fails raises; with
    it, ``on_error(index, graph, error)`` is called and that document gets no instances.
    """
    schema, tokenizer, table = _prepare(schema, tokenizer)
    graphs = list(graphs)
    out: list[list[EtcInstance]] = []
    for first in range(0, len(graphs), BATCH_SIZE):
        batch = graphs[first : first + BATCH_SIZE]
        layouts = build_layouts(batch, schema, tokenizer)
        results = _instances_many(layouts, schema, table, compact)
        for index, graph, result in zip(range(first, first + len(batch)), batch, results):
            if isinstance(result, Exception):
                if on_error is None:
                    raise result
                on_error(index, graph, result)
                result = []
            out.append(result)
    return out


@dataclass(frozen=True)
class Packed:
    """One packed instance and the input positions of the documents it holds, in order."""

    instance: EtcInstance
    members: tuple[int, ...]


def load_schema_and_tokenizer(schema: Schema | str | Any, tokenizer: Tokenizer | str | Any) -> tuple[Schema, Tokenizer]:
    """Load schema and tokenizer and resolve the schema's special tokens in the tokenizer.

    Compiling does this itself (once per pair); call it first to fail before any document
    does, e.g. before a corpus run starts, with a CompileError naming the schema key.
    """
    schema, tokenizer, _ = _prepare(schema, tokenizer)
    return schema, tokenizer


def special_token_ids(schema: Schema | str | Any, tokenizer: Tokenizer | str | Any) -> dict[str, int]:
    """The id each special and global token of the schema resolves to in the tokenizer, by schema
    key (``{"special_tokens.global": 1, "node_types.paragraph.global_token": 5}``): what a
    compile run records, since the schema may name tokens whose ids only the tokenizer knows."""
    return dict(_prepare(schema, tokenizer)[2].resolved)


def pack(
    graphs: Iterable[DocGraph],
    schema: Schema | str | Any,
    tokenizer: Tokenizer | str | Any,
    *,
    compact: bool = False,
    on_error: OnError | None = None,
) -> Iterator[EtcInstance]:
    """Pack documents in order, greedily, into instances of at most `max_documents` each.

    A document joins the current instance while the lengths of all its documents together
    fit max_long_length and max_global_length; one that does not fit alone is compiled (and
    truncated) on its own. Without `on_error` the first bad document raises; with it, see
    `pack_groups`.
    """
    return (packed.instance for packed in pack_groups(graphs, schema, tokenizer, compact=compact, on_error=on_error))


def pack_groups(
    graphs: Iterable[DocGraph],
    schema: Schema | str | Any,
    tokenizer: Tokenizer | str | Any,
    *,
    compact: bool = False,
    on_error: OnError | None = None,
) -> Iterator[Packed]:
    """`pack`, yielding each instance with the input positions of its documents.

    With `on_error`, a document that fails (any exception: its layout, or its compile) is
    reported as ``on_error(index, graph, error)`` and left out, and packing goes on: a pack
    that fails to assemble is compiled document by document, so only the document at fault is
    lost. This is what corpus runs need (one bad record must not stop a shard). Documents are
    tokenized `BATCH_SIZE` at a time, so `graphs` is read that far ahead.
    """
    schema, tokenizer, table = _prepare(schema, tokenizer)
    current: list[tuple[int, DocLayout]] = []
    used_long = used_global = 0
    for index, graph, layout in _layouts_in_batches(graphs, schema, tokenizer):
        try:
            if isinstance(layout, Exception):
                raise layout
            long_len, n_globals = whole_sizes(layout, schema)
        except Exception as err:  # noqa: BLE001 - reported per document when asked to
            if on_error is None:
                raise
            on_error(index, graph, err)
            continue
        full = len(current) >= schema.max_documents
        over = used_long + long_len > schema.max_long_length or used_global + n_globals > schema.max_global_length
        if current and (full or over):
            yield from _assemble_group(current, schema, table, compact, on_error)
            current, used_long, used_global = [], 0, 0
        current.append((index, layout))
        used_long += long_len
        used_global += n_globals
    if current:
        yield from _assemble_group(current, schema, table, compact, on_error)


def _layouts_in_batches(
    graphs: Iterable[DocGraph], schema: Schema, tokenizer: Tokenizer
) -> Iterator[tuple[int, Any, Any]]:
    """(index, graph, layout or its exception), reading `BATCH_SIZE` graphs ahead for each tokenizer batch."""
    batch: list[tuple[int, Any]] = []
    for item in enumerate(graphs):
        batch.append(item)
        if len(batch) == BATCH_SIZE:
            yield from _layout_batch(batch, schema, tokenizer)
            batch = []
    yield from _layout_batch(batch, schema, tokenizer)


def _layout_batch(batch: list[tuple[int, Any]], schema: Schema, tokenizer: Tokenizer) -> Iterator[tuple[int, Any, Any]]:
    layouts = build_layouts([graph for _, graph in batch], schema, tokenizer) if batch else []
    for (index, graph), layout in zip(batch, layouts):
        yield index, graph, layout


def _assemble_group(
    group: list[tuple[int, DocLayout]], schema: Schema, table: TokenTable, compact: bool, on_error: OnError | None
) -> Iterator[Packed]:
    layouts = [lay for _, lay in group]
    try:
        instance = _assemble_packed(layouts, schema, table, compact)
    except Exception as err:  # noqa: BLE001
        if on_error is None:
            raise
        if len(group) == 1:
            on_error(group[0][0], layouts[0].graph, err)
        else:  # find the document at fault: each one alone
            for member in group:
                yield from _assemble_group([member], schema, table, compact, on_error)
        return
    yield Packed(instance, tuple(index for index, _ in group))


def _assemble_packed(layouts: list[DocLayout], schema: Schema, table: TokenTable, compact: bool) -> EtcInstance:
    selections: list[Selection] = (
        select(layouts, schema) if len(layouts) == 1 else [Selection(lay.is_long.copy()) for lay in layouts]
    )
    return assemble(layouts, selections, schema, table, compact=compact)


__all__ = [
    "OnError",
    "Packed",
    "compile_instance",
    "compile_many",
    "compile_windows",
    "load_schema_and_tokenizer",
    "pack",
    "pack_groups",
    "special_token_ids",
]
