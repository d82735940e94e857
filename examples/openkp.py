"""OpenKP: read the bundled web page and compile it with schemas/openkp-dom.yaml.

One global per VDOM text element; the visual features (font-size bucket, block / inline /
heading / leaf / bold flags for the element and its parent) come along as per-global and
per-token arrays in `instance.features`. Keyphrases added to the page graph (OpenKP's own records,
examples/data/openkp_sample.jsonl, carry them) become the schema's `keyphrases` target: the
long-token spans of every occurrence.

Run: python examples/openkp.py
"""

from __future__ import annotations

from _common import DATA, schema_path, summarize, tokenizer

from graphattn.compile import compile_instance
from graphattn.ingest.html import read_html
from graphattn.ingest.openkp import add_keyphrases


def main() -> None:
    tok = tokenizer()
    graph = add_keyphrases(read_html(DATA / "openkp_page.html"), ["storm surge barriers", "Thames Barrier"])
    instance = compile_instance(graph, schema_path("openkp-dom"), tok)
    summarize(f"openkp {graph.doc_id}: {graph.node('doc').attrs['title']}", instance)
    print(
        f"   {len(graph.nodes_of_type('element'))} elements, {len(graph.nodes_of_type('text'))} text runs "
        f"(script, style, hidden and noscript content left out)"
    )
    fonts = instance.features["global:font_size_bucket"]
    headings = [
        graph.span_text(node)
        for node, is_heading in zip(instance.global_node_ids, instance.features["global:is_heading"])
        if is_heading
    ]
    print(f"   font-size buckets used: {sorted(set(fonts.tolist()))}; headings: {headings[:3]} ...")
    rows = instance.targets["keyphrases"]
    spans = [instance.long_char_spans[[a, b]] for a, b in rows if a >= 0]
    print(
        f"   keyphrase target: {len(spans)} occurrence(s), e.g. "
        f"{[graph.text[s[0, 0] : s[1, 1]] for s in spans[:3]]} at long tokens {rows[:3].tolist()}"
    )


if __name__ == "__main__":
    main()
