"""Shared bits of the example scripts: where the bundled data is, and a readable summary.

The summary shows what a user checks first in a compiled instance: lengths, how many globals of
each node type, what truncation dropped, and how often each relative label is used (counted over
the pairs whose mask allows attention).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "examples" / "data"
SCHEMAS = ROOT / "schemas"
TOKENIZER = DATA / "tokenizer.json"

if str(ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

from graphattn.contract import EtcInstance  # noqa: E402
from graphattn.tokenize import load_tokenizer  # noqa: E402


def tokenizer():
    """The WordPiece tokenizer the project ships (trained on examples/data/corpus.txt)."""
    return load_tokenizer(str(TOKENIZER))


def schema_path(name: str) -> str:
    return str(SCHEMAS / f"{name}.yaml")


def label_histogram(instance: EtcInstance) -> Counter:
    """Label name -> number of (query, key) pairs that may attend with that label."""
    side, vocab = instance.side, instance.label_vocab
    counts = np.zeros(len(vocab), dtype=np.int64)
    for piece in ("l2l", "g2g", "l2g", "g2l"):
        mask = np.asarray(getattr(side, f"{piece}_att_mask")).astype(bool)
        ids = np.asarray(getattr(side, f"{piece}_relative_att_ids"))[mask]
        counts += np.bincount(ids.ravel(), minlength=len(vocab))[: len(vocab)]
    return Counter({vocab.name(i): int(c) for i, c in enumerate(counts) if c})


def summarize(title: str, instance: EtcInstance, top_labels: int = 8) -> None:
    """Print lengths, globals by type, truncation and the most used labels of one instance."""
    report = instance.truncation
    print(f"== {title}")
    print(
        f"   long tokens {instance.long_length:5d}   global tokens {instance.global_length:4d}   "
        f"documents {len(instance.doc_ids)}   label vocabulary {len(instance.label_vocab)}"
    )
    by_type = Counter(instance.global_node_types)
    print("   globals by type: " + ", ".join(f"{t} {n}" for t, n in by_type.items()))
    if report.truncated:
        print(
            f"   truncated: long {report.long_tokens_before} -> {report.long_tokens_after}, "
            f"globals {report.globals_before} -> {report.globals_after}, {len(report.dropped_nodes)} node(s) dropped"
        )
        for message in report.messages:
            print(f"     - {message}")
    else:
        print("   truncated: no")
    histogram = label_histogram(instance)
    shown = ", ".join(f"{name} {count}" for name, count in histogram.most_common(top_labels))
    print(f"   labels (attending pairs): {shown}")
    extra = sorted(set(histogram) - {n for n in histogram if n.startswith("dist:")} - {"belongs", "does_not_belong"})
    if extra:
        print("   schema labels: " + ", ".join(f"{name} {histogram[name]}" for name in extra))
    if instance.features:
        print(
            "   feature arrays: "
            + ", ".join(f"{k} {tuple(v.shape)}" for k, v in sorted(instance.features.items())[:4])
            + (f", ... ({len(instance.features)} in all)" if len(instance.features) > 4 else "")
        )
