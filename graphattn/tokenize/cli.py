"""`graphattn tokenizer train FILES... --vocab-size N --out tokenizer.json`.

Trains a BERT-style WordPiece (`graphattn.tokenize.train_wordpiece`) on plain UTF-8 text: files,
or directories searched for .txt / .text / .md files. Lines are streamed to the trainer, so the
text never has to fit in memory at once. Ids 0..9 are the special tokens ([PAD] [UNK] [CLS] [SEP]
[MASK]) and the reserved [unused0]..[unused4] that the shipped schemas name as global tokens.
The result is an ordinary ``tokenizer.json`` that `graphattn compile --tokenizer` and the
`tokenizers` library read.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path

from graphattn.cli import add_verbosity_arguments, verbosity
from graphattn.tokenize import RESERVED_GLOBAL_TOKENS, WORDPIECE_SPECIAL_TOKENS, TokenizerError

TEXT_SUFFIXES = (".txt", ".text", ".md")
MAX_VOCAB_SIZE = 1_000_000  # ids; a WordPiece past this is a typo, and its trainer would hold it all in memory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    train = actions.add_parser(
        "train",
        help="train a WordPiece tokenizer.json on plain text",
        formatter_class=parser.formatter_class,
        description="train a WordPiece tokenizer.json on plain text (lowercased, BERT-style)",
        epilog="example:\n  graphattn tokenizer train corpus.txt notes/ --vocab-size 8000 --out tokenizer.json",
    )
    train.add_argument(
        "files", nargs="+", metavar="FILE", help="UTF-8 text files, or directories of .txt/.text/.md files"
    )
    train.add_argument(
        "--vocab-size", type=int, default=8000, metavar="N", help="ids in the vocabulary, special tokens included"
    )
    train.add_argument(
        "--min-frequency", type=int, default=2, metavar="N", help="a piece must occur this often to be kept"
    )
    train.add_argument(
        "--cased", action="store_true", help="keep case and accents (default: lowercase, as BERT uncased)"
    )
    train.add_argument("--out", required=True, metavar="FILE", help="the tokenizer.json to write")
    add_verbosity_arguments(train)


def text_files(inputs: list[str]) -> list[Path]:
    """The files to read: each file as named, each directory's text files in sorted order."""
    files = []
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
            if not found:
                raise TokenizerError(f"no {'/'.join(TEXT_SUFFIXES)} files in this directory", file=name)
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise TokenizerError("no such file or directory", file=name)
    return files


class _Lines:
    """Non-blank lines of the files, streamed; counts what it read for the closing line."""

    def __init__(self, files: list[Path]):
        self.files, self.lines, self.chars = files, 0, 0

    def __iter__(self) -> Iterator[str]:
        for path in self.files:
            try:
                with path.open(encoding="utf-8") as handle:
                    for line in handle:
                        if line.strip():
                            self.lines += 1
                            self.chars += len(line)
                            yield line
            except UnicodeDecodeError as err:
                raise TokenizerError(
                    f"not UTF-8 text ({err.reason} at byte {err.start} of a line); convert it or leave it out",
                    file=str(path),
                ) from None


def run(args: argparse.Namespace) -> int:
    from graphattn.tokenize import train_wordpiece

    least = len(WORDPIECE_SPECIAL_TOKENS) + len(RESERVED_GLOBAL_TOKENS) + 1  # the special tokens and one piece
    if not least <= args.vocab_size <= MAX_VOCAB_SIZE:
        raise TokenizerError(
            f"--vocab-size must be from {least} (the special and reserved tokens, and a piece) to "
            f"{MAX_VOCAB_SIZE:,}, got {args.vocab_size:,}"
        )
    if args.min_frequency < 1:
        raise TokenizerError(f"--min-frequency must be at least 1, got {args.min_frequency}")
    out = Path(args.out)
    if out.is_dir():
        raise TokenizerError("--out names a directory; give the tokenizer.json file to write", file=str(out))
    lines = _Lines(text_files(args.files))
    started = time.perf_counter()
    tokenizer = train_wordpiece(
        lines, vocab_size=args.vocab_size, min_frequency=args.min_frequency, lowercase=not args.cased
    )
    if lines.lines == 0:
        raise TokenizerError("the files hold no text to train on", file=", ".join(args.files))
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(out)
    if verbosity(args) >= 0:
        short = " (the text has fewer distinct pieces)" if tokenizer.vocab_size < args.vocab_size else ""
        print(
            f"wrote {out}: {tokenizer.vocab_size:,} ids{short}, trained on {lines.lines:,} lines "
            f"({lines.chars:,} characters) of {len(lines.files)} file(s) in {time.perf_counter() - started:.1f} s"
        )
    return 0
