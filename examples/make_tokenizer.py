"""Build examples/data/tokenizer.json: a small BERT-style WordPiece trained on the project's own
English text (examples/data/corpus.txt), so examples and tests need no download.

    python examples/make_tokenizer.py [--vocab-size 3000] [--corpus PATH] [--out PATH]

The shipped tokenizer.json is the artifact tests rely on: re-running this script gives an
equivalent vocabulary but not byte-identical ids, because the tokenizers WordPiece trainer
breaks count ties in hash-map order (huggingface/tokenizers issue #1794).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from graphattn.tokenize import train_wordpiece

DATA = Path(__file__).resolve().parent / "data"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DATA / "corpus.txt", help="plain text, one passage per line")
    parser.add_argument("--out", type=Path, default=DATA / "tokenizer.json")
    parser.add_argument("--vocab-size", type=int, default=3000)
    args = parser.parse_args(argv)

    lines = [line for line in args.corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    tokenizer = train_wordpiece(lines, vocab_size=args.vocab_size)
    tokenizer.save(args.out)
    print(f"{args.out}: {tokenizer.vocab_size} tokens from {len(lines)} lines, {args.out.stat().st_size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
