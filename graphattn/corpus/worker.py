"""The unit of work: compile one shard's documents into Parquet bytes (both engines run this).

A shard is a fixed range of document numbers (`ShardTask`), so what it holds never depends on
which worker compiled it or when. Every document either yields its instances or one entry for
``rejected.jsonl``; a failure is caught per document (any exception) and the shard goes on.

Documents become instances the way the schema asks: one instance per document (every window
under the `windows` policy, as `compile_windows`; `compile_many` tokenizes them in batches), or,
when the schema packs several documents per instance (`packing.max_documents` > 1),
`graphattn.compile.pack_groups` (greedy packing in input order, restarted at each shard), which
reports a failing document and goes on: a pack that fails to assemble is compiled document by
document, so one bad document never takes good ones down.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphattn.compile.compiler import BATCH_SIZE, compile_many, load_schema_and_tokenizer, pack_groups
from graphattn.compile.targets import NO_TOKEN
from graphattn.corpus.sources import Document, ReadCache, Segment, iter_segment_graphs, strict_error
from graphattn.errors import GraphattnError, LabelWarning
from graphattn.schema import Schema
from graphattn.shards.format import (
    Provenance,
    ShardColumns,
    encode_shard,
    instance_row,
    rows_to_table,
    sha256,
    shard_metadata,
)

PROGRESS_EVERY = 16  # documents between progress reports from a worker


@dataclass(frozen=True)
class ShardTask:
    """Documents [first_document, first_document + documents) of the corpus, as file segments."""

    index: int
    first_document: int
    documents: int
    segments: tuple[Segment, ...]


@dataclass
class ShardResult:
    """A compiled shard: its Parquet bytes, its rejected documents, its label warnings and its counts."""

    index: int
    data: bytes
    sha256: str
    rejected: list[dict]
    stats: dict[str, int]
    warnings: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class ShardWritten:
    """What the driver learns of a shard once it is on disk: its counts, and where it was made."""

    index: int
    stats: dict[str, int]
    where: str = "local"  # the Ray node that wrote it, for a distributed run
    cpu_seconds: float | None = None  # CPU time of the process that compiled it (Ray actors report it)


@dataclass
class WorkerState:
    """What every worker loads once: schema, tokenizer, the run's row layout and settings."""

    schema: Schema
    tokenizer: Any
    schema_text: str
    settings: dict
    layout: ShardColumns
    mapping: Any = None
    html_options: dict = field(default_factory=dict)  # read_html options: encoding, errors
    cache: ReadCache = field(default_factory=ReadCache)
    strict: bool = False  # labels that match nothing reject their document (else: warnings.jsonl)

    def __post_init__(self) -> None:
        load_schema_and_tokenizer(
            self.schema, self.tokenizer
        )  # a special token the tokenizer lacks fails the run here, not per document

    @property
    def packs(self) -> bool:
        return self.schema.max_documents > 1


def rejected_entry(doc: Document, err: BaseException, graph: Any = None) -> dict[str, Any]:
    """One line of rejected.jsonl: which document, where it is, what went wrong."""
    doc_id = getattr(graph, "doc_id", None) or getattr(err, "doc_id", None)  # a --strict LabelError carries it
    entry = {**doc.where(), "doc_id": doc_id, "error": type(err).__name__, "message": str(err)}
    if not isinstance(err, GraphattnError):  # a bug rather than bad input: say where it happened
        frames = traceback.extract_tb(err.__traceback__)
        if frames:
            last = frames[-1]
            entry["at"] = f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno} in {last.name}"
    return entry


class _ShardBuilder:
    """Collects a shard's rows and rejections, in document order."""

    def __init__(self, state: WorkerState, progress: Callable[[int, int], None] | None):
        self.state = state
        self.rows: list[dict] = []
        self.rejected: list[dict] = []
        self.warnings: list[dict] = []
        self.stats = {
            "documents": 0,
            "instances": 0,
            "truncated": 0,
            "rejected": 0,
            "long_tokens": 0,
            "global_tokens": 0,
            "warnings": 0,
        }
        self._progress = progress
        self._pending_docs = self._pending_tokens = 0

    def reject(self, doc: Document, err: BaseException, graph: Any = None) -> None:
        self.rejected.append(rejected_entry(doc, err, graph))
        self.stats["rejected"] += 1
        self._advance(1, 0)

    def add(self, docs: list[Document], instances: list, rows: list[dict]) -> None:
        self.rows.extend(rows)
        for doc in docs:
            self.warnings.extend(doc.warnings)
            self.stats["warnings"] += len(doc.warnings)
        tokens = sum(inst.long_length for inst in instances)
        self.stats["instances"] += len(instances)
        self.stats["truncated"] += sum(inst.truncation.truncated for inst in instances)
        self.stats["long_tokens"] += tokens
        self.stats["global_tokens"] += sum(inst.global_length for inst in instances)
        self._advance(len(docs), tokens)

    def _advance(self, docs: int, tokens: int) -> None:
        self.stats["documents"] += docs
        self._pending_docs += docs
        self._pending_tokens += tokens
        if self._progress is not None and self._pending_docs >= PROGRESS_EVERY:
            self.flush_progress()

    def flush_progress(self) -> None:
        if self._progress is not None and self._pending_docs:
            self._progress(self._pending_docs, self._pending_tokens)
        self._pending_docs = self._pending_tokens = 0


def _rows(
    state: WorkerState, docs: list[Document], instances: list, window_of: Callable[[int], tuple[int, int]]
) -> list[dict]:
    def where(i):
        return Provenance(
            [d.number for d in docs],
            [d.source for d in docs],
            [d.line for d in docs],  # noqa: E731
            [d.record for d in docs],
            *window_of(i),
        )

    return [instance_row(inst, where(i), state.layout) for i, inst in enumerate(instances)]


def _compile_each(state: WorkerState, builder: _ShardBuilder, items) -> None:
    """Each document on its own (all its windows), `BATCH_SIZE` per `compile_many` call."""
    batch: list[tuple[Document, Any]] = []
    for doc, graph in items:
        batch.append((doc, graph))
        if len(batch) == BATCH_SIZE:
            _compile_batch(state, builder, batch)
            batch = []
    _compile_batch(state, builder, batch)


def _compile_batch(state: WorkerState, builder: _ShardBuilder, batch: list[tuple[Document, Any]]) -> None:
    readable = [(doc, graph) for doc, graph in batch if not isinstance(graph, BaseException)]
    failed: dict[int, Exception] = {}
    compiled = compile_many(
        [graph for _, graph in readable],
        state.schema,
        state.tokenizer,
        compact=True,
        on_error=lambda index, graph, err: failed.__setitem__(index, err),
    )
    results = iter(zip(range(len(readable)), compiled))
    for doc, graph in batch:  # in document order: read failures, compile failures and instances
        if isinstance(graph, BaseException):
            builder.reject(doc, graph)
            continue
        index, instances = next(results)
        if index in failed:
            builder.reject(doc, failed[index], graph)
            continue
        unmatched = _no_token_labels(instances, graph)
        if unmatched and state.strict:
            builder.reject(doc, strict_error(unmatched, getattr(graph, "doc_id", None)), graph)
            continue
        doc.warnings += [doc.warning_entry(w, getattr(graph, "doc_id", None)) for w in unmatched]
        try:
            rows = _rows(state, [doc], instances, lambda i: (i, len(instances)))
        except Exception as err:  # noqa: BLE001 - reported per document
            builder.reject(doc, err, graph)
            continue
        builder.add([doc], instances, rows)


def _no_token_labels(instances: list, graph: Any) -> list[LabelWarning]:
    """LabelWarnings for the span answers whose characters hold no whole token (the lowering
    made them IGNORE and said so, `compile.targets.NO_TOKEN`), once per document, not per window."""
    found = dict.fromkeys(m for inst in instances for m in inst.truncation.messages if NO_TOKEN in m)
    return [LabelWarning(m, m.split()[1].rstrip(":"), file=getattr(graph, "source", None)) for m in found]


def _pack(state: WorkerState, builder: _ShardBuilder, items) -> None:
    """Greedy packing in input order (`pack_groups`); every document ends up in a row or rejected."""
    seen: list[tuple[Document, Any] | None] = []  # pack_groups' input positions -> (document, graph)

    def graphs():
        for doc, graph in items:
            if isinstance(graph, BaseException):
                builder.reject(doc, graph)
            else:
                seen.append((doc, graph))
                yield graph

    def take(index: int) -> tuple[Document, Any]:
        item, seen[index] = seen[index], None
        return item

    def failed(index: int, graph: Any, err: Exception) -> None:
        builder.reject(take(index)[0], err, graph)

    for packed in pack_groups(graphs(), state.schema, state.tokenizer, compact=True, on_error=failed):
        members = [take(i) for i in packed.members]
        docs = [doc for doc, _ in members]
        try:
            rows = _rows(state, docs, [packed.instance], lambda i: (0, 1))
        except Exception as err:  # noqa: BLE001
            if len(members) == 1:
                builder.reject(docs[0], err, members[0][1])
            else:  # find the document at fault: each one alone
                for member in members:
                    _pack(state, builder, [member])
            continue
        builder.add(docs, [packed.instance], rows)


def _documents(task: ShardTask, state: WorkerState):
    for segment in task.segments:
        yield from iter_segment_graphs(segment, state.cache, state.mapping, state.html_options, state.strict)


def compile_shard(
    task: ShardTask, state: WorkerState, progress: Callable[[int, int], None] | None = None
) -> ShardResult:
    """Compile every document of `task` and encode the shard (bytes; the driver writes them)."""
    builder = _ShardBuilder(state, progress)
    if state.packs:
        _pack(state, builder, _documents(task, state))
    else:
        _compile_each(state, builder, _documents(task, state))
    builder.flush_progress()
    builder.rejected.sort(key=lambda entry: entry["document"])  # document order, however far reading ran ahead
    if builder.stats["documents"] != task.documents:
        raise RuntimeError(f"shard {task.index}: read {builder.stats['documents']} documents, planned {task.documents}")
    info = {
        "index": task.index,
        "first_document": task.first_document,
        "documents": task.documents,
        "instances": builder.stats["instances"],
        "rejected": builder.stats["rejected"],
        "warnings": builder.stats["warnings"],
    }
    metadata = shard_metadata(state.settings, state.schema_text, state.schema.label_vocab(), state.layout, info)
    data = encode_shard(rows_to_table(builder.rows, state.layout), metadata)
    return ShardResult(task.index, data, sha256(data), builder.rejected, builder.stats, builder.warnings)


def compile_and_write_shard(
    task: ShardTask,
    state: WorkerState,
    out: Any,
    where: str = "local",
    progress: Callable[[int, int], None] | None = None,
) -> ShardWritten:
    """Compile a shard and write it into `out` (an `OutputDir`): shard file, then its done-marker,
    each by atomic rename, exactly as the driver of the local engine writes them."""
    cpu = time.process_time()
    result = compile_shard(task, state, progress)
    out.write_shard(result.index, result.data, result.sha256, result.rejected, result.stats, result.warnings)
    return ShardWritten(result.index, result.stats, where, time.process_time() - cpu)
