"""OpenKP: read the bundled web page and compile it with schemas/openkp-dom.yaml.

One global per VDOM text element; the visual features (font-size bucket, block / inline /
heading / leaf / bold flags for the element and its parent) come along as per-global and
per-token arrays in `instance.features`.

Run: python examples/openkp.py
"""

from __future__ import annotations

from _common import DATA, schema_path, summarize, tokenizer

from graphattn.compile import compile_instance
from graphattn.ingest.html import read_html


def main() -> None:
    tok = tokenizer()
    graph = read_html(DATA / "openkp_page.html")
    instance = compile_instance(graph, schema_path("openkp-dom"), tok)
    summarize(f"openkp {graph.doc_id}: {graph.node('doc').attrs['title']}", instance)
    print(f"   {len(graph.nodes_of_type('element'))} elements, {len(graph.nodes_of_type('text'))} text runs "
          f"(script, style, hidden and noscript content left out)")
    fonts = instance.features["global:font_size_bucket"]
    headings = [graph.span_text(node) for node, is_heading in zip(instance.global_node_ids, instance.features["global:is_heading"]) if is_heading]
    print(f"   font-size buckets used: {sorted(set(fonts.tolist()))}; headings: {headings[:3]} ...")


if __name__ == "__main__":
    main()
