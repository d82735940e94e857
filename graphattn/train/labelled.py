"""Which documents `graphattn evaluate` can score: those whose targets carry a gold label.

A record compiled without answers (a test set, documents to predict on) has no gold: its target
arrays are IGNORE throughout (`graphattn.compile.targets`: a global_labels target whose nodes
never carry the attr is IGNORE, not the schema's default class, and so is a choice target whose
candidates never carry it, the null global too; no answer node gives an IGNORE span). The
HotpotQA and NQ adapters leave the attrs and the answer node out of records without
`supporting_facts` / `answer` / `annotations`. Scoring such a document would
read "no label" as "the answer is none" (HotpotQA's supporting facts: predicting nothing is an
exact match), so evaluate leaves it out of that target's score and says how many it left out,
and refuses shards in which no document has any label: those are for `graphattn predict`.

The records per document are the ones `evaluate._gather` builds for each target kind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from graphattn.contract import TARGET_IGNORE
from graphattn.errors import GraphattnError

Source = str | os.PathLike | Sequence[str | os.PathLike]


def has_gold(kind: str, records: list) -> bool:
    """Whether any window of one document has a gold label for a target of `kind`."""
    if kind in ("global_labels", "choice"):
        return any(bool((labels != TARGET_IGNORE).any()) for _, labels, _ in records)
    if kind == "span":
        return any(r["gold_type"] is not None for r in records)
    return any(bool(gold) for gold, _ in records)  # spans: the gold phrases found in the window


def split_labelled(kind: str, documents: list[list]) -> tuple[list[list], np.ndarray]:
    """(the documents with a gold label, a bool per document: labelled)."""
    labelled = np.fromiter((has_gold(kind, records) for records in documents), dtype=bool, count=len(documents))
    return [records for records, keep in zip(documents, labelled) if keep], labelled


def require_labels(labelled: Mapping[str, np.ndarray], model: str, data: Source, first_shard: str) -> None:
    """Refuse shards in which no document has a gold label for any target (one line, pointing to
    `graphattn predict` with the same model and data); `labelled`: per target, the flags of
    `split_labelled`."""
    if any(bool(flags.any()) for flags in labelled.values()):
        return
    documents = max((flags.size for flags in labelled.values()), default=0)
    inputs = " ".join(map(str, [data] if isinstance(data, (str, os.PathLike)) else data))
    raise GraphattnError(
        f"--data: none of the {documents:,} document(s) has a gold label for {', '.join(labelled) or 'any target'} "
        "(compiled from records without answers): there is nothing to score; `graphattn predict --model "
        f"{model} {inputs} --out FILE` writes the model's answers",
        file=first_shard,
    )


def gold_positives(kind: str, documents: list[list]) -> int | None:
    """How many labelled globals have a class > 0 in the gold (global_labels targets; None else):
    0 means every labelled global says "no", which is what shards compiled from records without
    answers by graphattn before it told them apart hold."""
    if kind != "global_labels":
        return None
    return sum(int(np.count_nonzero(labels > 0)) for records in documents for _, labels, _ in records)
