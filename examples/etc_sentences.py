"""ETC pre-training layout on plain text: spaCy paragraphs and sentences, a global per sentence.

Compiles the bundled article alone, then packs it with two short notes into one instance
(schemas/etc-sentences.yaml allows 4 documents per instance; nothing attends across them).

Run: python examples/etc_sentences.py
"""

from __future__ import annotations

from _common import DATA, schema_path, summarize, tokenizer

from graphattn.compile import compile_instance
from graphattn.ingest.text import text_to_graph


def main() -> None:
    tok = tokenizer()
    article = text_to_graph(
        (DATA / "article.txt").read_text(encoding="utf-8"), doc_id="article", source=str(DATA / "article.txt")
    )
    summarize("etc-sentences: article.txt", compile_instance(article, schema_path("etc-sentences"), tok))
    notes = [
        text_to_graph(text, doc_id=f"note{i}")
        for i, text in enumerate(
            [
                "Neap tides have the smallest range. They happen at the quarter moons.",
                "A tide gauge records the water level. Long records reveal sea-level rise.",
            ]
        )
    ]
    summarize(
        "etc-sentences: article + 2 notes packed",
        compile_instance([article, *notes], schema_path("etc-sentences"), tok),
    )


if __name__ == "__main__":
    main()
