"""One registry of document formats: a name, how its files are recognised, and its reader.

`graphattn compile` (through `graphattn.corpus.sources`), `graphattn viz` and `graphattn train`
read documents through this module only, so the three accept the same inputs and say the same
things about the ones they cannot read.

    FORMATS["hotpotqa"]               DocumentFormat: name, reader, suffixes or JSON keys
    per_file_format(path)             "html" / "text" from the suffix, else None
    sniff_format(records)             a JSON record format from the keys of the first records
    resolve_json_format(...)          --format, --mapping and the sniffed keys -> one name
    read_graph(name, raw)             one DocGraph from a path (per-file formats) or a RecordRef
    read_documents(path, format)      the DocGraphs of one file, read lazily (viz, tests)

Two kinds of format. Per-file formats (``html``, ``text``) read a whole file as one document and
are chosen by suffix. Record formats read JSON records: a JSON array, one object, or JSON lines
(``.json``, ``.jsonl``, ``.ndjson``, each optionally ``.gz``; `graphattn.ingest.records` tells
them apart); which record format a file holds is told by keys every record of it has
(`FORMATS[name].keys`), or given with ``--format`` / ``--mapping``. `register_format` adds one.
"""

from __future__ import annotations

import importlib
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphattn.errors import IngestError
from graphattn.ingest.records import JSON_LINES_SUFFIXES, iter_records

JSON_SUFFIXES = (".json", *JSON_LINES_SUFFIXES)
SNIFF_RECORDS = 20  # JSON records looked at to tell a file's format


@dataclass(frozen=True)
class DocumentFormat:
    """How one kind of document is recognised and read.

    `reader` names a function ``module:function``, imported on first use: per-file formats call
    it with the file path, record formats with the record (`graphattn.ingest.json.Record`, which
    names file, line and key path in its errors) and, when `needs_mapping`, the loaded mapping.
    `modules` lists what forked corpus workers import up front.
    """

    name: str
    description: str
    reader: str
    per_file: bool = False
    suffixes: tuple[str, ...] = ()  # per-file formats: the suffixes that select them under --format auto
    keys: tuple[str, ...] = ()  # record formats: keys every record has (empty: never sniffed)
    needs_mapping: bool = False
    modules: tuple[str, ...] = ()

    def read(self, raw: Any, mapping: Any = None, options: dict | None = None):
        """One DocGraph from a path (per-file formats, with reader `options` such as read_html's
        encoding= / errors=) or a `RecordRef` (record formats)."""
        module, function = self.reader.split(":")
        fn = getattr(importlib.import_module(module), function)
        if self.per_file:
            return fn(raw, **(options or {}))
        from graphattn.ingest.json import Record

        record = Record.of(raw)
        return fn(record, mapping) if self.needs_mapping else fn(record)


FORMATS: dict[str, DocumentFormat] = {}


def register_format(fmt: DocumentFormat) -> None:
    """Add (or replace) a format; record formats with keys take part in sniffing, in order."""
    if not fmt.per_file and fmt.suffixes:
        raise ValueError("record formats are recognised by their keys; suffixes select per-file formats only")
    FORMATS[fmt.name] = fmt


for _fmt in (
    DocumentFormat(
        "html",
        "an HTML page (visible text, DOM elements, OpenKP's VDOM features)",
        "graphattn.ingest.html:read_html",
        per_file=True,
        suffixes=(".html", ".htm", ".xhtml"),
        modules=("graphattn.ingest.html",),
    ),
    DocumentFormat(
        "text",
        "plain UTF-8 text (paragraphs and sentences by spaCy)",
        "graphattn.ingest.formats:read_text_file",
        per_file=True,
        suffixes=(".txt", ".text", ".md"),
        modules=("graphattn.ingest.text",),
    ),
    DocumentFormat(
        "docgraph",
        "DocGraph objects {text, nodes, edges} (DocGraph.to_dict)",
        "graphattn.ingest.formats:docgraph_record",
        keys=("text", "nodes"),
        modules=("graphattn.graph",),
    ),
    DocumentFormat(
        "hotpotqa",
        "HotpotQA records",
        "graphattn.ingest.json:hotpotqa_graph",
        keys=("question", "context"),
        modules=("graphattn.ingest.json",),
    ),
    DocumentFormat(
        "wikihop",
        "WikiHop records",
        "graphattn.ingest.json:wikihop_graph",
        keys=("query", "supports"),
        modules=("graphattn.ingest.json", "graphattn.ingest.text"),
    ),
    DocumentFormat(
        "nq",
        "Natural Questions records (simplified format)",
        "graphattn.ingest.json:nq_graph",
        keys=("question_text", "document_text"),
        modules=("graphattn.ingest.json",),
    ),
    DocumentFormat(
        "openkp",
        "OpenKP records (url, text, VDOM, KeyPhrases)",
        "graphattn.ingest.openkp:openkp_graph",
        keys=("text", "VDOM"),
        modules=("graphattn.ingest.openkp",),
    ),
    DocumentFormat(
        "json",
        "any other JSON layout, read with a --mapping file",
        "graphattn.ingest.mapping:json_graph",
        needs_mapping=True,
        modules=("graphattn.ingest.json", "graphattn.ingest.mapping"),
    ),
):
    register_format(_fmt)


def _suffix(path: str | os.PathLike) -> str:
    """The suffix that says what a file holds: ``a.jsonl.gz`` -> ``.jsonl``."""
    name = str(path)
    name = name[:-3] if name.lower().endswith(".gz") else name
    return os.path.splitext(name)[1].lower()


def known_suffixes() -> tuple[str, ...]:
    return tuple(s for fmt in FORMATS.values() for s in fmt.suffixes) + JSON_SUFFIXES


def is_document_file(path: str | os.PathLike) -> bool:
    """Whether a directory walk picks this file up (a known suffix, optionally .gz)."""
    return _suffix(path) in known_suffixes()


def is_json_file(path: str | os.PathLike) -> bool:
    return _suffix(path) in JSON_SUFFIXES


def per_file_format(path: str | os.PathLike) -> str | None:
    """The per-file format a suffix selects under --format auto (None: JSON or unknown)."""
    suffix = _suffix(path)
    return next((fmt.name for fmt in FORMATS.values() if fmt.per_file and suffix in fmt.suffixes), None)


def unknown_suffix_error(path: str | os.PathLike) -> IngestError:
    suffix = _suffix(path)
    return IngestError(
        f"cannot tell how to read a {suffix or 'suffix-less'} file; pass --format ({', '.join(FORMATS)})",
        file=str(path),
    )


def sniff_format(records: list) -> str | None:
    """The record format the keys of the first object records point to, or None."""
    for record in records:
        if isinstance(record, dict):
            for fmt in FORMATS.values():
                if fmt.keys and all(key in record for key in fmt.keys):
                    return fmt.name
    return None


def resolve_json_format(format: str, mapping: Any, samples: list, path: str | os.PathLike | None = None) -> str:
    """The record format of a JSON file: --format if given, "json" with a --mapping, else sniffed."""
    if format != "auto":
        if format not in FORMATS or FORMATS[format].per_file:
            record_formats = ", ".join(n for n, f in FORMATS.items() if not f.per_file)
            raise IngestError(
                f"--format {format} does not read JSON records (record formats: {record_formats})",
                file=None if path is None else str(path),
            )
        return format
    if mapping is not None:
        return "json"
    found = sniff_format(samples)
    if found is None:
        keys = sorted({k for r in samples if isinstance(r, dict) for k in r})[:12]
        sniffed = "|".join(n for n, f in FORMATS.items() if f.keys)
        raise IngestError(
            f"cannot tell the JSON record format from its keys ({', '.join(keys) or 'no objects'}); pass --format "
            f"{sniffed}, or --mapping FILE for another layout",
            file=None if path is None else str(path),
        )
    return found


def import_readers(formats: set[str]) -> None:
    """Import the readers these formats need now, so that forked workers start with them loaded."""
    for name in sorted({m for f in formats if f in FORMATS for m in FORMATS[f].modules}):
        importlib.import_module(name)


def read_graph(format: str, raw: Any, mapping: Any = None, options: dict | None = None):
    """One DocGraph: `raw` is the file path (per-file formats; `options` go to their reader) or
    the record's `RecordRef`."""
    if format not in FORMATS:
        raise IngestError(f"unknown format {format!r}; known: {', '.join(FORMATS)}", file=getattr(raw, "file", None))
    fmt = FORMATS[format]
    if fmt.needs_mapping and mapping is None:
        raise IngestError(
            f"the {format} format reads records through a mapping: pass --mapping FILE", file=getattr(raw, "file", None)
        )
    return fmt.read(raw, mapping, options)


def read_documents(
    path: str | os.PathLike, format: str = "auto", mapping: Any = None, options: dict | None = None
) -> Iterator:
    """The DocGraphs of one file, in order, read lazily; the same rules as `graphattn compile`.

    `mapping` is a loaded mapping or a mapping file path (for the ``json`` format); `options` go
    to a per-file reader (read_html's encoding= and errors=). Errors are `IngestError`s /
    `GraphError`s naming the file, and the line or record.
    """
    path = Path(path)
    if not path.is_file():
        raise IngestError("no such file", file=str(path))
    if isinstance(mapping, (str, os.PathLike)):
        from graphattn.ingest.mapping import load_mapping

        mapping = load_mapping(mapping)
    name = format if format != "auto" else per_file_format(path)
    if name is not None and FORMATS.get(name) is not None and FORMATS[name].per_file:
        yield read_graph(name, str(path), mapping, options)
        return
    if format == "auto" and not is_json_file(path) and mapping is None:
        raise unknown_suffix_error(path)
    records = iter_records(path)
    first = list(itertools.islice(records, SNIFF_RECORDS))
    name = resolve_json_format(format, mapping, [ref.data for ref in first], path)
    for ref in itertools.chain(first, records):
        yield read_graph(name, ref, mapping)


# -- readers of their own ---------------------------------------------------------------------
def read_text_file(path: str | os.PathLike):
    """A plain-text file as a DocGraph (`graphattn.ingest.text.text_to_graph`); UTF-8 or an error."""
    from graphattn.ingest.text import text_to_graph

    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise IngestError(f"not UTF-8 text ({err.reason} at byte {err.start})", file=str(path)) from None
    except OSError as err:
        raise IngestError(f"cannot read: {err.strerror}", file=str(path)) from None
    return text_to_graph(text, doc_id=Path(path).stem, source=str(path))


def docgraph_record(record):
    """A DocGraph from a `DocGraph.to_dict` record."""
    from graphattn.errors import GraphError
    from graphattn.graph import DocGraph

    if not isinstance(record.data, dict):
        raise GraphError(
            "expected a DocGraph object {text, nodes, edges}", file=record.file, line=record.line, path=record.base_path
        )
    return DocGraph.from_dict(record.data, source=record.file)
