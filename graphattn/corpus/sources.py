"""Reading a corpus: expand the inputs into files, count each file's documents, read them back.

Compiling a corpus happens in two places. The driver *plans*: it expands the command line into
files (each argument in the order given, directories and globs sorted), decides how each file is
read and counts its documents, so that every document gets a number in input order. Workers then
*read* ranges of documents (`Segment`) by those numbers. Shard boundaries follow the numbers,
never the timing of workers, which is what makes the output deterministic and resumable.

How a file is read (`--format auto`): ``.html``/``.htm``/``.xhtml`` -> `ingest.html`;
``.txt``/``.text``/``.md`` -> `ingest.text`; ``.json``/``.jsonl``/``.ndjson`` (``.gz`` too) are
JSON arrays, single objects or JSON lines (read by `ingest.records`, whose rule tells them
apart), whose records are DocGraph dicts (`DocGraph.from_dict`) or HotpotQA / WikiHop / NQ
records, told apart by their keys; a ``--mapping`` file reads any other JSON layout through
`ingest.mapping`. Every line of a JSON-lines file is one document, a line that is no JSON too.

A file that cannot be read at all (invalid JSON array, unreadable bytes) counts as one document
that fails, so that it is reported in ``rejected.jsonl`` instead of stopping the run.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from graphattn.errors import GraphattnError, GraphError, IngestError
from graphattn.ingest.records import JSON_LINES_SUFFIXES, RecordRef, is_json_lines, iter_records, scan_json_lines

HTML_SUFFIXES = (".html", ".htm", ".xhtml")
TEXT_SUFFIXES = (".txt", ".text", ".md")
JSON_SUFFIXES = (".json", *JSON_LINES_SUFFIXES)
FORMATS = ("auto", "docgraph", "html", "text", "hotpotqa", "wikihop", "nq", "json")
JSON_FORMATS = ("docgraph", "hotpotqa", "wikihop", "nq", "json")
DEFAULT_SHARD_SIZE = 1000  # documents per shard
DEFAULT_MAX_REJECTED = 0.25  # share of rejected documents a run tolerates: a few bad records pass, a wrong schema fails
SNIFF_RECORDS = 20  # JSON records looked at to tell a file's format

# Keys that tell the record formats apart (all of them must be present).
FORMAT_KEYS = (
    ("docgraph", ("text", "nodes")),
    ("hotpotqa", ("question", "context")),
    ("wikihop", ("query", "supports")),
    ("nq", ("question_text", "document_text")),
)


# -- expanding the command line --------------------------------------------------------------
def _suffix(path: str) -> str:
    """The suffix that says what a file holds: ``a.jsonl.gz`` -> ``.jsonl``."""
    name = path[:-3] if path.lower().endswith(".gz") else path
    return os.path.splitext(name)[1].lower()


def is_document_file(path: str) -> bool:
    return _suffix(path) in HTML_SUFFIXES + TEXT_SUFFIXES + JSON_SUFFIXES


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
        raise GraphattnError(f"no document files found in {', '.join(inputs)} (known suffixes: "
                             f"{', '.join(HTML_SUFFIXES + TEXT_SUFFIXES + JSON_SUFFIXES)}, optionally .gz)")
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
    suffix = _suffix(path)
    if format in ("html", "text") or (format == "auto" and suffix in HTML_SUFFIXES + TEXT_SUFFIXES):
        kind = format if format != "auto" else ("html" if suffix in HTML_SUFFIXES else "text")
        return InputFile(reader=kind, format=kind, documents=1, **base)
    if format == "auto" and suffix not in JSON_SUFFIXES:
        return _broken(base, IngestError(
            f"cannot tell how to read a {suffix or 'suffix-less'} file; pass --format ({', '.join(FORMATS[1:])})", file=path))
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
        found = _resolve_format(format, mapping, samples)
        return InputFile(reader=reader, format=found, documents=len(offsets), offsets=offsets, lines=lines, **base)
    records = _load_records(path)
    samples = [ref.data for ref in records[:SNIFF_RECORDS]]
    return InputFile(reader="records", format=_resolve_format(format, mapping, samples), documents=len(records), **base)


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


def sniff_format(records: list) -> str | None:
    """The record format the keys of the first object records point to, or None."""
    for record in records:
        if isinstance(record, dict):
            for name, keys in FORMAT_KEYS:
                if all(key in record for key in keys):
                    return name
    return None


def _resolve_format(format: str, mapping: str | None, samples: list) -> str:
    if format != "auto":
        if format not in JSON_FORMATS:
            raise IngestError(f"--format {format} does not read JSON files")
        return format
    if mapping is not None:
        return "json"
    found = sniff_format(samples)
    if found is None:
        keys = sorted({k for r in samples if isinstance(r, dict) for k in r})[:12]
        raise IngestError(
            f"cannot tell the JSON record format from its keys ({', '.join(keys) or 'no objects'}); pass --format "
            "docgraph|hotpotqa|wikihop|nq, or --mapping FILE for another layout")
    return found


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

    `raw` is the file path (HTML, text) or the record's `RecordRef` (JSON).
    """

    number: int
    source: str
    line: int | None
    record: int | None
    raw: Any = None
    error: Exception | None = None

    def where(self) -> dict[str, Any]:
        return {"document": self.number, "source": self.source, "line": self.line, "record": self.record}


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
    records: list[int | None] = list(range(segment.start, segment.stop)) if segment.reader not in ("html", "text", "broken") else [None] * n
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
            lines = list(scan_json_lines(path, start=start, stop=end, first_line=segment.lines[0] if segment.lines else 1))
        else:  # a gzip stream cannot seek cheaply: its lines are scanned once per worker, parsed per segment
            lines = cache.records_of(path, lambda p: list(scan_json_lines(p)))[segment.start : segment.stop]
        if [line.line for line in lines] != list(segment.lines):
            raise IngestError(f"the file changed since the run was planned: expected {n} records on lines "
                              f"{segment.lines[0]}-{segment.lines[-1]}, found {len(lines)} that do not match", file=path)
        return [line.parse(path, segment.start + k, errors="yield") for k, line in enumerate(lines)]
    raws = cache.records_of(path, _load_records)[segment.start : segment.stop]
    if len(raws) != n:
        raise IngestError(f"the file changed since the run was planned: expected {n} records here, found {len(raws)}", file=path)
    return raws


# -- raw input -> DocGraph -------------------------------------------------------------------
def to_graph(doc: Document, format: str, mapping: Any = None, html_options: dict | None = None):
    """Build the DocGraph of one document; raises the reader's GraphattnError on bad input.
    `html_options` go to `read_html` (encoding=, errors=)."""
    if doc.error is not None:
        raise doc.error
    if format == "html":
        from graphattn.ingest.html import read_html

        return read_html(doc.raw, **(html_options or {}))
    if format == "text":
        from graphattn.ingest.text import text_to_graph

        try:
            text = Path(doc.raw).read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise IngestError(f"not UTF-8 text ({err.reason} at byte {err.start})", file=doc.source) from None
        return text_to_graph(text, doc_id=Path(doc.raw).stem, source=doc.source)
    ref: RecordRef = doc.raw
    if format == "docgraph":
        from graphattn.graph import DocGraph

        return DocGraph.from_dict(ref.data, source=doc.source)
    from graphattn.ingest.json import Record

    record = Record.of(ref)
    if format == "json":
        from graphattn.ingest.mapping import json_graph

        return json_graph(record, mapping)
    from graphattn.ingest.json import ADAPTERS

    return ADAPTERS[format](record)


READER_MODULES = {
    "html": ("graphattn.ingest.html",),
    "text": ("graphattn.ingest.text",),
    "docgraph": ("graphattn.graph",),
    "hotpotqa": ("graphattn.ingest.json",),
    "wikihop": ("graphattn.ingest.json", "graphattn.ingest.text"),
    "nq": ("graphattn.ingest.json",),
    "json": ("graphattn.ingest.json", "graphattn.ingest.mapping"),
}


def import_readers(formats: set[str]) -> None:
    """Import the readers these formats need now, so that forked workers start with them loaded."""
    import importlib

    for name in sorted({m for f in formats for m in READER_MODULES.get(f, ())}):
        importlib.import_module(name)


def iter_segment_graphs(segment: Segment, cache: ReadCache, mapping: Any = None,
                        html_options: dict | None = None) -> Iterator[tuple[Document, Any]]:
    """(document, DocGraph or the exception that stopped it) for each document of a segment."""
    for doc in read_segment(segment, cache):
        try:
            yield doc, to_graph(doc, segment.format, mapping, html_options)
        except Exception as err:  # noqa: BLE001 - every failure is reported per document
            yield doc, err
