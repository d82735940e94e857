"""Reading a corpus: expand the inputs into files, count each file's documents, read them back.

Compiling a corpus happens in two places. The driver *plans*: it expands the command line into
files (each argument in the order given, directories and globs sorted), decides how each file is
read and counts its documents, so that every document gets a number in input order. Workers then
*read* ranges of documents (`Segment`) by those numbers. Shard boundaries follow the numbers,
never the timing of workers, which is what makes the output deterministic and resumable.

How a file is read (`--format auto`) is decided by the one registry of document formats,
`graphattn.ingest.formats` (shared with `graphattn viz` and `graphattn train`): HTML and text files
by suffix; ``.json``/``.jsonl``/``.ndjson`` (``.gz`` too) are JSON arrays, single objects or JSON
lines (read by `ingest.records`, whose rule tells them apart), whose record format (DocGraph dicts,
HotpotQA, WikiHop, NQ, OpenKP) is told by the keys of the first records; a ``--mapping`` file reads
any other JSON layout through `ingest.mapping`. Every line of a JSON-lines file is one document, a
line that is no JSON too.

A file that cannot be read at all (invalid JSON array, unreadable bytes) counts as one document
that fails, so that it is reported in ``rejected.jsonl`` instead of stopping the run. Labels a
reader could not match (`LabelWarning`s) are kept per document for ``warnings.jsonl``, or, with
``strict``, reject the document.
"""

from __future__ import annotations

import glob
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphattn.errors import GraphattnError, GraphError, IngestError, LabelError, LabelWarning
from graphattn.ingest.formats import FORMATS as DOCUMENT_FORMATS
from graphattn.ingest.formats import (
    SNIFF_RECORDS,
    import_readers,
    is_document_file,
    is_json_file,
    known_suffixes,
    per_file_format,
    read_graph,
    resolve_json_format,
    sniff_format,
    unknown_suffix_error,
)
from graphattn.ingest.records import RecordRef, is_json_lines, iter_records, scan_json_lines

FORMATS = ("auto", *DOCUMENT_FORMATS)
DEFAULT_SHARD_SIZE = 1000  # documents per shard
DEFAULT_MAX_REJECTED = 0.25  # share of rejected documents a run tolerates: a few bad records pass, a wrong schema fails

__all__ = [
    "DEFAULT_MAX_REJECTED",
    "DEFAULT_SHARD_SIZE",
    "FORMATS",
    "Document",
    "InputFile",
    "ReadCache",
    "Segment",
    "expand_inputs",
    "import_readers",
    "is_document_file",
    "iter_segment_graphs",
    "plan_file",
    "read_segment",
    "segment_of",
    "sniff_format",
    "to_graph",
]


# -- expanding the command line --------------------------------------------------------------
def expand_inputs(inputs: list[str]) -> tuple[list[str], list[str]]:
    """Files to compile, in a deterministic order, and files skipped inside directories.

    Each argument in the order given: a file as is, a directory recursively, a glob pattern
    (``**`` allowed); directory and glob matches sorted by path. Directories contribute only
    files with a known suffix (hidden files and folders are left out); a file named explicitly is
    always read. A file named twice is read once. An argument that matches nothing is an error.
    """
    files: list[str] = []
    skipped: list[str] = []
    seen: set[str] = set()

    def add(path: str) -> None:
        key = os.path.normpath(os.path.abspath(path))
        if key not in seen:
            seen.add(key)
            files.append(path)

    for arg in inputs:
        if os.path.isdir(arg):
            found = _walk(arg)
            for path in found:
                (add if is_document_file(path) else skipped.append)(path)
        elif os.path.isfile(arg):
            add(arg)
        elif glob.has_magic(arg):
            matches = sorted(p for p in glob.glob(arg, recursive=True) if os.path.isfile(p))
            if not matches:
                raise GraphattnError(f"the pattern {arg!r} matches no file")
            for path in matches:
                add(path)
        else:
            raise GraphattnError("no such file or directory", file=arg)
    if not files:
        raise GraphattnError(
            f"no document files found in {', '.join(inputs)} (known suffixes: "
            f"{', '.join(known_suffixes())}, optionally .gz)"
        )
    return files, skipped


def _walk(directory: str) -> list[str]:
    out = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        out.extend(os.path.join(root, n) for n in names if not n.startswith("."))
    return sorted(out)


# -- planning: what each file holds ----------------------------------------------------------
@dataclass
class InputFile:
    """One input file as planned: how it is read and where its documents are.

    `reader` is ``html`` | ``text`` | ``lines`` (JSON lines, read by byte range) |
    ``lines-gz`` | ``records`` (a JSON array or object) | ``broken`` (counts as one document
    that fails with `problem`). For JSON lines, `offsets[i]` / `lines[i]` are the byte offset and
    1-based line number of record i.
    """

    path: str
    reader: str
    format: str
    documents: int
    size: int
    mtime_ns: int
    problem: tuple[str, str] | None = None  # (error type, message)
    offsets: np.ndarray | None = None
    lines: np.ndarray | None = None

    def fingerprint(self) -> dict[str, Any]:
        """What resume compares to notice an input that changed since the run started."""
        return {"path": self.path, "size": self.size, "mtime_ns": self.mtime_ns, "documents": self.documents}


def plan_file(path: str, format: str = "auto", mapping: str | None = None) -> InputFile:
    """Decide how `path` is read and count its documents (never raises for the file's content)."""
    try:
        stat = os.stat(path)
    except OSError as err:
        raise GraphattnError(f"cannot read: {err.strerror}", file=path) from None
    base = {"path": path, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    kind = format if format != "auto" else per_file_format(path)
    if kind in DOCUMENT_FORMATS and DOCUMENT_FORMATS[kind].per_file:
        return InputFile(reader=kind, format=kind, documents=1, **base)
    if format == "auto" and not is_json_file(path):
        return _broken(base, unknown_suffix_error(path))
    try:
        return _plan_json(path, base, format, mapping)
    except GraphattnError as err:
        return _broken(base, err)
    except (OSError, EOFError, UnicodeDecodeError) as err:
        return _broken(base, IngestError(f"cannot read: {err}", file=path))


def _broken(base: dict, err: Exception) -> InputFile:
    return InputFile(reader="broken", format="", documents=1, problem=(type(err).__name__, str(err)), **base)


def _plan_json(path: str, base: dict, format: str, mapping: str | None) -> InputFile:
    gz = path.lower().endswith(".gz")
    if is_json_lines(path):
        offsets, lines, samples = _scan_lines(path)
        reader = "lines-gz" if gz else "lines"
        found = resolve_json_format(format, mapping, samples, path)
        return InputFile(reader=reader, format=found, documents=len(offsets), offsets=offsets, lines=lines, **base)
    records = _load_records(path)
    samples = [ref.data for ref in records[:SNIFF_RECORDS]]
    found = resolve_json_format(format, mapping, samples, path)
    return InputFile(reader="records", format=found, documents=len(records), **base)


def _scan_lines(path: str) -> tuple[np.ndarray, np.ndarray, list]:
    """Byte offset and line number of every record line, and the first records that parse."""
    offsets, numbers, samples = [], [], []
    for line in scan_json_lines(path):
        offsets.append(line.offset)
        numbers.append(line.line)
        if len(samples) < SNIFF_RECORDS:
            ref = line.parse(path, len(offsets) - 1, errors="yield")
            if ref.error is None:
                samples.append(ref.data)
    return np.asarray(offsets, np.int64), np.asarray(numbers, np.int64), samples


def _load_records(path: str) -> list[RecordRef]:
    """The records of a JSON array (or the one record of a JSON object file)."""
    return list(iter_records(path))


# -- reading: documents of a planned range ---------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """Records [start, stop) of one planned file, carried to a worker with what it needs to read them."""

    path: str
    reader: str
    format: str
    start: int
    stop: int
    first_number: int  # corpus-wide number of record `start`
    problem: tuple[str, str] | None = None
    byte_range: tuple[int, int] | None = None  # plain JSON lines
    lines: tuple[int, ...] = ()  # JSON lines: line number of each record in [start, stop)


def segment_of(file: InputFile, start: int, stop: int, first_number: int) -> Segment:
    byte_range = None
    lines: tuple[int, ...] = ()
    if file.reader in ("lines", "lines-gz"):
        lines = tuple(int(n) for n in file.lines[start:stop])
        end = int(file.offsets[stop]) if stop < file.documents else file.size
        byte_range = (int(file.offsets[start]), end)
    return Segment(file.path, file.reader, file.format, start, stop, first_number, file.problem, byte_range, lines)


@dataclass
class Document:
    """One document to compile: where it came from, and its raw form (or why it has none).

    `raw` is the file path (HTML, text) or the record's `RecordRef` (JSON). `warnings` are the
    lines of ``warnings.jsonl`` its reader gave (labels that match nothing).
    """

    number: int
    source: str
    line: int | None
    record: int | None
    raw: Any = None
    error: Exception | None = None
    warnings: list[dict] = field(default_factory=list)

    def where(self) -> dict[str, Any]:
        return {"document": self.number, "source": self.source, "line": self.line, "record": self.record}

    def warning_entry(self, warning: LabelWarning, doc_id: str | None) -> dict[str, Any]:
        """One line of warnings.jsonl: the shape of rejected.jsonl, plus which label."""
        return {
            **self.where(),
            "doc_id": doc_id,
            "error": type(warning).__name__,
            "label": warning.label,
            "message": str(warning),
        }


@dataclass
class ReadCache:
    """The last whole JSON file a worker parsed (a large file spans several shards in a row)."""

    path: str | None = None
    records: list = field(default_factory=list)

    def records_of(self, path: str, loader: Callable[[str], list]) -> list:
        if self.path != path:
            self.path, self.records = None, []  # a failed load leaves nothing stale behind
            self.records = loader(path)
            self.path = path
        return self.records


def read_segment(segment: Segment, cache: ReadCache) -> list[Document]:
    """The documents of a segment, exactly stop - start of them, each with its raw input or error."""
    n = segment.stop - segment.start
    numbers = range(segment.first_number, segment.first_number + n)
    lines: list[int | None] = list(segment.lines) if segment.lines else [None] * n
    records: list[int | None] = (
        list(range(segment.start, segment.stop)) if segment.reader not in ("html", "text", "broken") else [None] * n
    )
    docs = [Document(num, segment.path, line, rec) for num, line, rec in zip(numbers, lines, records)]
    try:
        raws = _raw_records(segment, cache)
    except Exception as err:  # the file went away or changed since planning: each document says so
        for doc in docs:
            doc.error = err
        return docs
    for doc, raw in zip(docs, raws):
        doc.raw = raw
        if isinstance(raw, RecordRef) and raw.error is not None:
            doc.error = raw.error  # a line that is no JSON: this document fails, the others go on
    return docs


def _raw_records(segment: Segment, cache: ReadCache) -> list:
    path, n = segment.path, segment.stop - segment.start
    if segment.reader == "broken":
        kind, message = segment.problem  # the message already names the file (and line)
        raise (GraphError if kind == "GraphError" else IngestError)(message)
    if segment.reader in ("html", "text"):
        return [path]
    if segment.reader in ("lines", "lines-gz"):
        if segment.reader == "lines":
            start, end = segment.byte_range
            lines = list(
                scan_json_lines(path, start=start, stop=end, first_line=segment.lines[0] if segment.lines else 1)
            )
        else:  # a gzip stream cannot seek cheaply: its lines are scanned once per worker, parsed per segment
            lines = cache.records_of(path, lambda p: list(scan_json_lines(p)))[segment.start : segment.stop]
        if [line.line for line in lines] != list(segment.lines):
            raise IngestError(
                f"the file changed since the run was planned: expected {n} records on lines "
                f"{segment.lines[0]}-{segment.lines[-1]}, found {len(lines)} that do not match",
                file=path,
            )
        return [line.parse(path, segment.start + k, errors="yield") for k, line in enumerate(lines)]
    raws = cache.records_of(path, _load_records)[segment.start : segment.stop]
    if len(raws) != n:
        raise IngestError(
            f"the file changed since the run was planned: expected {n} records here, found {len(raws)}", file=path
        )
    return raws


# -- raw input -> DocGraph -------------------------------------------------------------------
def to_graph(doc: Document, format: str, mapping: Any = None, html_options: dict | None = None):
    """Build the DocGraph of one document; raises the reader's GraphattnError on bad input.
    `html_options` go to `read_html` (encoding=, errors=)."""
    if doc.error is not None:
        raise doc.error
    return read_graph(format, doc.raw, mapping, html_options if format == "html" else None)


def read_with_label_warnings(read: Callable[[], Any]) -> tuple[Any, list[LabelWarning]]:
    """`read()`'s result and the LabelWarnings it issued; other warnings go on as usual."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LabelWarning)
        result = read()
    labels = [w.message for w in caught if isinstance(w.message, LabelWarning)]
    for w in caught:
        if not isinstance(w.message, LabelWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return result, labels


def strict_error(found: list[LabelWarning], doc_id: str | None) -> LabelError:
    """The rejection --strict gives a document with labels that match nothing."""
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    what = "1 label matches" if len(found) == 1 else f"{len(found)} labels match"
    error = LabelError(f"--strict: {what} nothing: {found[0]}{more}")
    error.doc_id = doc_id
    return error


def iter_segment_graphs(
    segment: Segment,
    cache: ReadCache,
    mapping: Any = None,
    html_options: dict | None = None,
    strict: bool = False,
) -> Iterator[tuple[Document, Any]]:
    """(document, DocGraph or the exception that stopped it) for each document of a segment.

    LabelWarnings of a document land in `doc.warnings`; with `strict` they reject it instead."""
    for doc in read_segment(segment, cache):
        try:
            graph, found = read_with_label_warnings(lambda: to_graph(doc, segment.format, mapping, html_options))
        except Exception as err:  # noqa: BLE001 - every failure is reported per document
            yield doc, err
            continue
        if found and strict:
            yield doc, strict_error(found, getattr(graph, "doc_id", None))
            continue
        doc.warnings = [doc.warning_entry(w, getattr(graph, "doc_id", None)) for w in found]
        yield doc, graph
