"""A small generated corpus of valid and broken documents, and what compiling it must give.

`make_corpus(root)` writes files whose sorted order is the order documents are numbered in, and
returns one `Expected` per document in that order: the DocGraph a reader must build (None for a
broken document) or the error it must be rejected with. The schema is etc-sentences made small
(short sequences, packing three documents per instance), so packing and truncation both happen.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from graphattn.compile import pack
from graphattn.graph import DocGraph
from graphattn.ingest.text import text_to_graph
from graphattn.schema import SCHEMA_DIR

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = str(REPO / "examples" / "data" / "tokenizer.json")
WORDS = (
    "the river runs past old mills and quiet towns where people trade grain wool and stories "
    "about storms ships bridges harvest markets music lanterns winter"
).split()


@dataclass
class Expected:
    number: int
    source: str
    line: int | None
    record: int | None
    graph: DocGraph | None  # None: the document must be rejected
    error: str | None = None  # error type name
    reason: str | None = None  # substring of the rejection message


def small_schema(path: Path, **overrides) -> str:
    """etc-sentences with short sequences (truncation happens) and packing of 3 documents."""
    data = yaml.safe_load((SCHEMA_DIR / "etc-sentences.yaml").read_text())
    data.update(
        {
            "name": "etc-sentences-small",
            "local_radius": 4,
            "max_long_length": 48,
            "max_global_length": 12,
            "packing": {"max_documents": 3},
        },
        **overrides,
    )
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def docgraph_dict(rng: random.Random, doc_id: str, paragraphs: list[int]) -> dict:
    """document > paragraphs > sentences, as DocGraph.to_dict lays it out."""
    text, nodes, edges = "", [], []
    paragraph_spans = []
    for p, n_sentences in enumerate(paragraphs):
        start = len(text)
        for s in range(n_sentences):
            sentence = _sentence(rng, rng.randint(3, 9))
            if text and not text.endswith("\n"):
                text += " "
            nodes.append({"id": f"p{p}.s{s}", "type": "sentence", "span": [len(text), len(text) + len(sentence)]})
            edges.append({"src": f"p{p}", "relation": "contains", "dst": f"p{p}.s{s}"})
            text += sentence
        paragraph_spans.append([start, len(text)])
        text += "\n"
    nodes = (
        [{"id": "doc", "type": "document", "span": [0, len(text)]}]
        + [{"id": f"p{p}", "type": "paragraph", "span": span} for p, span in enumerate(paragraph_spans)]
        + nodes
    )
    edges = [{"src": "doc", "relation": "contains", "dst": f"p{p}"} for p in range(len(paragraphs))] + edges
    return {"doc_id": doc_id, "text": text, "nodes": nodes, "edges": edges}


def make_corpus(root: Path, seed: int = 0) -> list[Expected]:
    """Write the corpus under `root`; the expected documents in input (numbering) order."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    expected: list[Expected] = []

    def add(source: Path, line, record, graph, error=None, reason=None) -> None:
        expected.append(Expected(len(expected), str(source), line, record, graph, error, reason))

    # a_docs.jsonl: DocGraph records, one per line, a blank line and four broken ones among them.
    lines_file = root / "a_docs.jsonl"
    lines, line_no, record = [], 0, 0
    for i in range(26):
        line_no += 1
        if i == 4:
            lines.append('{"doc_id": "x", "text": ')  # cut off mid-record
            add(lines_file, line_no, record, None, "IngestError", "not valid JSON")
        elif i == 9:
            bad = docgraph_dict(rng, f"j{i}", [1])
            bad["nodes"].append({"id": "t0", "type": "table", "span": [0, 3]})
            lines.append(json.dumps(bad))
            add(lines_file, line_no, record, None, "CompileError", "table")
        elif i == 13:
            bad = docgraph_dict(rng, f"j{i}", [2])
            bad["edges"].append({"src": "doc", "relation": "contains", "dst": "nowhere"})
            lines.append(json.dumps(bad))
            add(lines_file, line_no, record, None, "GraphError", "nowhere")
        elif i == 17:
            bad = docgraph_dict(rng, f"j{i}", [1])
            bad["nodes"][-1]["span"] = [0, 10_000]
            lines.append(json.dumps(bad))
            add(lines_file, line_no, record, None, "GraphError", "outside the document text")
        else:
            data = docgraph_dict(rng, f"j{i}", [rng.randint(1, 3) for _ in range(rng.randint(1, 3))])
            lines.append(json.dumps(data))
            add(lines_file, line_no, record, DocGraph.from_dict(data, source=str(lines_file)))
        record += 1
        if i == 11:
            lines.append("")  # blank lines are not records, but they count as lines
            line_no += 1
    lines_file.write_text("\n".join(lines) + "\n")

    # b_array.json: a JSON array of DocGraph records, one missing its text.
    array_file = root / "b_array.json"
    records = []
    for i in range(5):
        data = docgraph_dict(rng, f"a{i}", [rng.randint(1, 2)])
        if i == 2:
            del data["text"]
            add(array_file, None, i, None, "GraphError", "text")
        else:
            add(array_file, None, i, DocGraph.from_dict(data, source=str(array_file)))
        records.append(data)
    array_file.write_text(json.dumps(records, indent=1))

    # c_broken.json: not JSON at all: the whole file is one rejected document.
    broken_file = root / "c_broken.json"
    broken_file.write_text('[{"text": "unterminated"')
    add(broken_file, None, None, None, "IngestError", "not valid JSON")

    # d_notes/: plain text files (paragraphs and sentences by spaCy), one of them empty.
    notes = root / "d_notes"
    notes.mkdir(exist_ok=True)
    for name in ("n0", "n1", "n2"):
        path = notes / f"{name}.txt"
        if name == "n1":
            path.write_text("   \n")
            add(path, None, None, None, "IngestError", "empty document")
            continue
        text = "\n\n".join(" ".join(_sentence(rng, rng.randint(3, 8)) for _ in range(2)) for _ in range(2))
        path.write_text(text)
        add(path, None, None, text_to_graph(text, doc_id=name, source=str(path)))
    (notes / "README.rst").write_text("not a document: skipped inside a directory")
    return expected


def reference_instances(expected: list[Expected], schema, tokenizer, shard_size: int) -> list[list]:
    """Per shard, what compiling its valid documents in memory gives (packing restarts per shard)."""
    shards = []
    for start in range(0, len(expected), shard_size):
        graphs = [e.graph for e in expected[start : start + shard_size] if e.graph is not None]
        shards.append(list(pack(graphs, schema, tokenizer)) if graphs else [])
    return shards


def assert_same_instance(got, want) -> None:
    """Every field of two EtcInstances equal, arrays with their dtypes."""
    for name in (
        "long_token_ids",
        "long_type_ids",
        "global_token_ids",
        "global_type_ids",
        "long_char_spans",
        "long_doc_index",
        "global_doc_index",
    ):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    for name, value in want.side.as_dict().items():
        a = getattr(got.side, name)
        assert a.dtype == value.dtype, name
        np.testing.assert_array_equal(a, value, err_msg=name)
    assert got.label_vocab.names == want.label_vocab.names
    assert list(got.long_owners) == list(want.long_owners)
    for level, owners in want.long_owners.items():
        np.testing.assert_array_equal(got.long_owners[level], owners, err_msg=level)
        assert got.long_owners[level].dtype == owners.dtype
    assert sorted(got.features) == sorted(want.features)
    for key, value in want.features.items():
        assert got.features[key].dtype == value.dtype, key
        np.testing.assert_array_equal(got.features[key], value, err_msg=key)
    assert (got.global_node_ids, got.global_node_types, got.doc_ids, got.texts) == (
        want.global_node_ids,
        want.global_node_types,
        want.doc_ids,
        want.texts,
    )
    assert got.truncation == want.truncation


def directory_bytes(path: Path) -> dict[str, bytes]:
    """The output's files by name; verified stamps (graphattn.shards.stamp) are a cache of hashes
    that a resume or a read leaves beside a shard, not output, and are left out."""
    return {
        p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file() and not p.name.endswith(".verified.json")
    }
