"""Training targets for the task heads, read from a compiled instance and the graph it came from.

The compiler keeps provenance (which node each global stands for, the character span of every
long token), so answers stored on graph nodes by the ingest adapters become head targets here:

    wikihop_targets    candidate_mask [G], answer_position []          (CandidateScoringHead)
    hotpotqa_targets   sentence_mask [G], supporting [G]               (SupportingFactsHead)
    nq_targets         start_position [], end_position [], answer_type [] (SpanExtractionHead)
    keyphrase_targets  ngram_labels [N, L]                              (KeyphraseHead)

`TaskExample` pairs an instance with its targets; `collate_examples` pads both into
(EtcBatch, dict of tensors), padding per-position targets with 0 (not a candidate, not
supporting, not a keyphrase).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from graphattn.compile.batching import collate
from graphattn.contract import EtcBatch, EtcInstance
from graphattn.errors import GraphattnError
from graphattn.graph import DocGraph
from graphattn.nn.heads import NQ_ANSWER_TYPES

TARGET_AXES = {  # which axis of each target is padded to the batch's lengths ("" = a scalar per example)
    "candidate_mask": "global", "answer_position": "", "sentence_mask": "global", "supporting": "global",
    "start_position": "", "end_position": "", "answer_type": "", "ngram_labels": "long", "ngram_mask": "long",
}


@dataclass
class TaskExample:
    instance: EtcInstance
    targets: dict[str, np.ndarray]


def _positions_of_type(instance: EtcInstance, node_type: str) -> np.ndarray:
    return np.asarray(instance.global_node_types, dtype=object) == node_type


def tokens_in_span(instance: EtcInstance, start: int, end: int, doc: int = 0) -> tuple[int, int] | None:
    """(first, last) long positions of the tokens inside characters [start, end) of packed
    document `doc`, or None when none of them made it into the instance."""
    spans = instance.long_char_spans
    inside = (instance.long_doc_index == doc) & (spans[:, 0] >= 0) & (spans[:, 0] < end) & (spans[:, 1] > start)
    hits = np.flatnonzero(inside)
    return (int(hits[0]), int(hits[-1])) if hits.size else None


def wikihop_targets(instance: EtcInstance, graph: DocGraph) -> dict[str, np.ndarray]:
    """Candidate globals and the position of the one whose node has is_answer."""
    mask = _positions_of_type(instance, "candidate")
    answers = [g for g, node in enumerate(instance.global_node_ids) if mask[g] and graph.node(node).attrs.get("is_answer")]
    if len(answers) != 1:
        raise GraphattnError(f"expected one answer candidate among the compiled globals, found {len(answers)}", node=graph.doc_id)
    return {"candidate_mask": mask.astype(np.int32), "answer_position": np.int64(answers[0])}


def hotpotqa_targets(instance: EtcInstance, graph: DocGraph) -> dict[str, np.ndarray]:
    """Sentence globals and whether each is a supporting fact."""
    mask = _positions_of_type(instance, "sentence")
    supporting = np.array([bool(mask[g]) and bool(graph.node(node).attrs.get("supporting")) for g, node in enumerate(instance.global_node_ids)])
    if not mask.any():
        raise GraphattnError("the compiled instance has no sentence globals", node=graph.doc_id)
    return {"sentence_mask": mask.astype(np.int32), "supporting": supporting.astype(np.int32)}


def nq_targets(instance: EtcInstance, graph: DocGraph, question: str = "q") -> dict[str, np.ndarray]:
    """BERT-joint targets for one window: short answer span -> "short"; yes/no -> that type with
    the long answer's span; a long answer only -> "long" with its span; otherwise (or when the
    answer lies outside this window) "null" pointing at [CLS] (long position 0)."""
    attrs = graph.node(question).attrs
    long_answer = next((n for n in graph.nodes_of_type("candidate") if n.attrs.get("is_long_answer") and n.span), None)
    long_span = tokens_in_span(instance, *long_answer.span) if long_answer is not None else None
    short = [tokens_in_span(instance, s, e) for s, e in attrs.get("short_answers", [])]
    short = [span for span in short if span is not None]
    yes_no = str(attrs.get("yes_no_answer", "NONE")).lower()
    if short:
        kind, span = "short", short[0]
    elif yes_no in ("yes", "no") and long_span is not None:
        kind, span = yes_no, long_span
    elif long_span is not None:
        kind, span = "long", long_span
    else:
        kind, span = "null", (0, 0)
    return {"start_position": np.int64(span[0]), "end_position": np.int64(span[1]), "answer_type": np.int64(NQ_ANSWER_TYPES.index(kind))}


def keyphrase_targets(instance: EtcInstance, keyphrases: Sequence[str], max_ngram: int = 5) -> dict[str, np.ndarray]:
    """ngram_labels[n-1, i] = 1 where long tokens i..i+n-1 cover exactly an occurrence of a
    keyphrase (case-insensitive) in the instance's text. Occurrences longer than max_ngram
    tokens are not labelled."""
    labels = np.zeros((max_ngram, instance.long_length), np.int32)
    for doc, text in enumerate(instance.texts):
        lowered = text.lower()
        for phrase in keyphrases:
            needle = phrase.strip().lower()
            at = lowered.find(needle) if needle else -1
            while at >= 0:
                span = tokens_in_span(instance, at, at + len(needle), doc)
                if span is not None and span[1] - span[0] < max_ngram:
                    labels[span[1] - span[0], span[0]] = 1
                at = lowered.find(needle, at + 1)
    return {"ngram_labels": labels}


def _pad_target(name: str, values: list[np.ndarray], long_length: int, global_length: int) -> torch.Tensor:
    if name not in TARGET_AXES:
        raise GraphattnError(f"unknown target {name!r}; known: {', '.join(TARGET_AXES)}", path=(name,))
    axis = TARGET_AXES[name]
    if not axis:
        return torch.as_tensor(np.stack([np.asarray(v) for v in values]))
    length = long_length if axis == "long" else global_length
    first = np.asarray(values[0])
    out = np.zeros((len(values), *first.shape[:-1], length), dtype=first.dtype)
    for b, value in enumerate(values):
        out[b, ..., : value.shape[-1]] = value
    return torch.from_numpy(out)


def collate_examples(examples: Sequence[TaskExample]) -> tuple[EtcBatch, dict[str, torch.Tensor]]:
    """(EtcBatch, targets) for a batch of TaskExamples (an InstanceLoader collate_fn)."""
    batch = collate([example.instance for example in examples])
    names = set(examples[0].targets)
    if any(set(example.targets) != names for example in examples):
        raise GraphattnError("examples in one batch carry different targets")
    long_length, global_length = batch.long_token_ids.shape[1], batch.global_token_ids.shape[1]
    return batch, {name: _pad_target(name, [e.targets[name] for e in examples], long_length, global_length) for name in sorted(names)}
