"""Ingestion: documents -> DocGraphs that the dataset schemas in ``schemas/`` compile.

    read_html(path) / parse_html(data)      HTML -> document / element / text nodes, VDOM features
    read_json(path, "hotpotqa" | "wikihop" | "nq" | callable)   one DocGraph per JSON record
    iter_records(path, errors="raise" | "yield")   the records of a JSON / JSON-lines file
    json_graph(record, mapping)             any JSON, driven by a mapping (see `mapping`)
    text_to_graph(text, candidates=...)     plain text -> paragraphs, sentences, mentions (spaCy)
    openkp_graph(record) / add_keyphrases   OpenKP records; keyphrase nodes on any page graph
    read_documents(path, format="auto")     any known format, told by suffix and JSON keys (`formats`)

Each module's docstring fixes the node types, ids, attrs and edges it produces. Names load
lazily, so reading HTML does not import spaCy.
"""

from __future__ import annotations

from graphattn.lazy import lazy_exports

_EXPORTS = {
    "parse_html": "html",
    "read_html": "html",
    "decode_html": "encoding",
    "read_json": "json",
    "iter_records": "records",
    "RecordRef": "records",
    "JsonLine": "records",
    "scan_json_lines": "records",
    "is_json_lines": "records",
    "Record": "json",
    "hotpotqa_graph": "json",
    "wikihop_graph": "json",
    "nq_graph": "json",
    "ADAPTERS": "json",
    "json_graph": "mapping",
    "load_mapping": "mapping",
    "text_to_graph": "text",
    "add_sentences": "text",
    "link_mentions": "text",
    "default_nlp": "text",
    "openkp_graph": "openkp",
    "add_keyphrases": "openkp",
    "FORMATS": "formats",
    "read_documents": "formats",
    "register_format": "formats",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, {name: f"{__name__}.{module}" for name, module in _EXPORTS.items()})
