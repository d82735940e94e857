"""WikiHop: read the bundled records, link candidate mentions, compile with schemas/wikihop.yaml.

Run: python examples/wikihop.py
"""

from __future__ import annotations

from collections import Counter

from _common import DATA, schema_path, summarize, tokenizer

from graphattn.compile import compile_instance
from graphattn.ingest.json import read_json


def main() -> None:
    tok = tokenizer()
    for graph in read_json(DATA / "wikihop_sample.json", "wikihop"):
        instance = compile_instance(graph, schema_path("wikihop"), tok)
        summarize(f"wikihop {graph.doc_id}: {graph.span_text('q')}", instance)
        mentions = Counter(graph.node(m.attrs["candidate"]).attrs["text"] for m in graph.nodes_of_type("mention"))
        print("   mentions per candidate: " + ", ".join(f"{c} {n}" for c, n in mentions.most_common()))


if __name__ == "__main__":
    main()
