"""Natural Questions (simplified): compile the bundled records with schemas/nq.yaml, in windows.

The sample page is short, so it fits one 4096-token window; the second part shrinks the window
(max_long_length 128, stride 64) to show how a long page becomes several instances, each with
the question pinned at its start and only the candidates of that window as globals.

Run: python examples/nq.py
"""

from __future__ import annotations

import yaml
from _common import DATA, schema_path, summarize, tokenizer

from graphattn.compile import compile_windows
from graphattn.ingest.json import read_json
from graphattn.schema import load_schema


def main() -> None:
    tok = tokenizer()
    graphs = list(read_json(DATA / "nq_sample.jsonl", "nq"))
    for graph in graphs:
        (instance,) = compile_windows(graph, schema_path("nq"), tok)
        summarize(f"nq {graph.doc_id}: {graph.span_text('q')}", instance)
        answers = [graph.text[s:e] for s, e in graph.node("q").attrs["short_answers"]]
        print(f"   short answers: {answers or 'none'}")

    with open(schema_path("nq"), encoding="utf-8") as handle:
        small = yaml.safe_load(handle)
    small.update(name="nq-small-windows", max_long_length=128, max_global_length=64)
    small["truncation"]["stride"] = 64
    windows = compile_windows(graphs[0], load_schema(small), tok)
    print(f"== nq with 128-token windows, stride 64: {len(windows)} windows")
    for i, window in enumerate(windows):
        candidates = [g for g, t in zip(window.global_node_ids, window.global_node_types) if t == "candidate"]
        print(f"   window {i}: long {window.long_length}, candidates {candidates}")


if __name__ == "__main__":
    main()
