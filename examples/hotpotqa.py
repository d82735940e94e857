"""HotpotQA: read the bundled records and compile them with schemas/hotpotqa.yaml.

Run: python examples/hotpotqa.py
"""

from __future__ import annotations

from _common import DATA, schema_path, summarize, tokenizer

from graphattn.compile import compile_instance
from graphattn.ingest.json import read_json


def main() -> None:
    tok = tokenizer()
    for graph in read_json(DATA / "hotpotqa_sample.json", "hotpotqa"):
        instance = compile_instance(graph, schema_path("hotpotqa"), tok)
        summarize(f"hotpotqa {graph.doc_id}: {graph.span_text('q')}", instance)
        supporting = [graph.span_text(n.id) for n in graph.nodes_of_type("sentence") if n.attrs["supporting"]]
        print(f"   supporting sentences ({len(supporting)}): {supporting[0][:60]}...")


if __name__ == "__main__":
    main()
