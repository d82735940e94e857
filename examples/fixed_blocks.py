"""Fixed blocks on plain text: no structure, one global per 27 long tokens.

Compiles the bundled article with schemas/fixed-blocks.yaml, then the much longer tokenizer
corpus, which does not fit 4096 tokens and shows the truncation report.

Run: python examples/fixed_blocks.py
"""

from __future__ import annotations

from _common import DATA, schema_path, summarize, tokenizer

from graphattn.compile import compile_instance
from graphattn.ingest.text import text_to_graph


def main() -> None:
    tok = tokenizer()
    for name in ("article.txt", "corpus.txt"):
        path = DATA / name
        graph = text_to_graph(path.read_text(encoding="utf-8"), doc_id=path.stem, source=str(path))
        summarize(f"fixed-blocks: {name}", compile_instance(graph, schema_path("fixed-blocks"), tok))


if __name__ == "__main__":
    main()
