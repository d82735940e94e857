"""What one document's prediction record holds: each target's answer, merged over its windows.

`graphattn.train.predict.Predictor` runs the model; this module turns what the heads say about
one instance (`instance_part`) into plain values, and the parts of a document's instances (its
windows) into the document's record (`document_record`), with the same choices `evaluate` makes
(the best span by its margin over the null span, a supporting fact when any window says so, the
best candidate by its score, or its margin over the null global where the schema has one), so
that the answer `predict` writes is the one `evaluate` scores.

    {"id": "5a8b57f2...", "document": 0, "source": "dev.json", "windows": 1,
     "answer": {"type": "span", "text": "River Thames", "char_start": 212, "char_end": 224,
                "score": 7.1, "margin": 5.3, "n_best": [{"text", "char_start", "char_end", "score"}, ...]},
     "supporting": {"node_ids": ["p0.s0", "p1.s2"], "scores": [0.93, 0.71],
                    "facts": [["Thames Barrier", 0], ["Woolwich", 2]]},
     "truncation": {...}}                                    # only when the document was cut

`facts` are [title, sentence index] pairs for HotpotQA-style graphs (sentence nodes `p<i>.s<j>`
with a title node `p<i>.title`, `graphattn.ingest.json`): the index is the sentence's position
in the record, read from the node id, and the title is the title node's text in the document,
so a fact never names a sentence the document does not have.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np

from graphattn.contract import TARGET_IGNORE
from graphattn.train.spans import instance_keyphrases, instance_span

HOTPOT_SENTENCE = re.compile(r"p(\d+)\.s(\d+)")


def finite(value: float) -> float | None:
    """JSON has no infinity: a score a decoder left at -inf (nothing valid) is written as null."""
    return float(value) if math.isfinite(value) else None


def _owned_chars(inst: Any, level: str, g: int) -> tuple[int, int] | None:
    """(start, end) characters of the long tokens global g owns at hierarchy level `level`."""
    owners = inst.long_owners.get(level)
    if owners is None:
        return None
    spans = np.asarray(inst.long_char_spans)[(np.asarray(owners) == g)]
    spans = spans[spans[:, 0] >= 0]
    return (int(spans[:, 0].min()), int(spans[:, 1].max())) if len(spans) else None


def _title(inst: Any, g: int) -> str | None:
    """A HotpotQA title node's text: from its first token's line start to its line end (the
    reader writes "\\n\\n" + title + "\\n" + sentences), so spaces the tokens leave out stay."""
    chars = _owned_chars(inst, "title", g)
    if chars is None:
        return None
    doc = int(inst.global_doc_index[g]) if inst.global_doc_index is not None else 0
    text = inst.texts[doc]
    start = text.rfind("\n\n", 0, chars[0] + 1)
    start = 0 if start < 0 else start + 2
    end = text.find("\n", chars[1])
    return text[start : end if end >= 0 else len(text)]


def candidate_mask(inst: Any, spec: Any) -> np.ndarray:
    """[G] bool: the globals a choice target chooses among (its node types, and its null global)."""
    types = np.asarray(inst.global_node_types, dtype=object)
    mask = np.isin(types, list(spec.node_types))
    if spec.null_global:
        mask |= np.asarray(inst.global_node_ids, dtype=object) == f"<{spec.null_global}>"
    return mask


def open_candidates(inst: Any, spec: Any) -> None:
    """Unlabelled candidates are TARGET_IGNORE, which the choice head reads as "no candidate":
    mark them 0 so that the head scores every candidate of a document without answers."""
    values = inst.targets[spec.name]
    inst.targets[spec.name] = np.where(candidate_mask(inst, spec) & (values == TARGET_IGNORE), 0, values).astype(
        values.dtype
    )


def instance_part(spec: Any, prediction: Any, b: int, inst: Any, *, n_best: int, max_answer_length: int | None):
    """What target `spec` of instance b of a batch says, as plain values."""
    kind = spec.kind
    if kind == "span":
        return instance_span(prediction, b, inst, n_best=n_best, max_answer_length=max_answer_length)
    if kind == "spans":
        return instance_keyphrases(prediction, b, inst, top_k=max(32, n_best))
    G = inst.global_length
    scores = prediction[b, :G].float().cpu().numpy()
    ids = inst.global_node_ids
    if kind == "choice":
        mask = candidate_mask(inst, spec)
        null = f"<{spec.null_global}>" if spec.null_global else None
        floor = next((float(scores[g]) for g in np.flatnonzero(mask) if ids[g] == null), 0.0)
        out = []
        for g in np.flatnonzero(mask).tolist():  # per candidate global
            if ids[g] == null:
                continue
            chars = next((c for level in spec.node_types if (c := _owned_chars(inst, level, g)) is not None), None)
            doc = int(inst.global_doc_index[g]) if inst.global_doc_index is not None else 0
            text = inst.texts[doc][chars[0] : chars[1]] if chars else None
            out.append({"node_id": ids[g], "text": text, "score": float(scores[g]), "margin": float(scores[g]) - floor})
        return out
    types = np.asarray(inst.global_node_types, dtype=object)
    targeted = np.flatnonzero(np.isin(types, list(spec.node_types)))
    chosen = scores.argmax(-1)
    hotpot = any(HOTPOT_SENTENCE.fullmatch(ids[g]) for g in targeted.tolist()) and "title" in inst.long_owners
    out = []
    for g in targeted[chosen[targeted] > 0].tolist():  # positives only
        entry = {"node_id": ids[g], "class": spec.classes[int(chosen[g])], "score": float(scores[g, chosen[g]])}
        found = HOTPOT_SENTENCE.fullmatch(ids[g])
        if hotpot and found and f"p{found[1]}.title" in ids:
            title = _title(inst, ids.index(f"p{found[1]}.title"))
            if title is not None:
                entry["fact"] = [title, int(found[2])]
        out.append(entry)
    return {"hotpot": hotpot, "positives": out}


def _merge_span(parts: list[dict], n_best: int) -> dict:
    best = max(parts, key=lambda p: p["margin"])
    merged: dict[tuple[int, int], dict] = {}
    for part in parts:
        for answer in part["n_best"]:
            key = (answer["char_start"], answer["char_end"])
            if key not in merged or answer["score"] > merged[key]["score"]:
                merged[key] = answer
    ranked = sorted(merged.values(), key=lambda a: -a["score"])[:n_best]
    return {
        "type": best["type"],
        "text": best["text"],
        "char_start": best["char_start"],
        "char_end": best["char_end"],
        "score": finite(best["score"]),
        "margin": finite(best["margin"]),
        "n_best": [{**a, "score": finite(a["score"])} for a in ranked],
    }


def _merge_keyphrases(parts: list[list[dict]], n_best: int) -> list[dict]:
    from graphattn.train.metrics import keyphrase_key

    seen, out = set(), []
    for phrase in sorted((p for part in parts for p in part), key=lambda p: -p["score"]):
        key = keyphrase_key(phrase["text"])
        if key and key not in seen:
            seen.add(key)
            out.append({**phrase, "score": finite(phrase["score"])})
        if len(out) == n_best:
            break
    return out


def _merge_choice(parts: list[list[dict]], spec: Any) -> dict:
    candidates = [c for part in parts for c in part]
    if not candidates:
        return {"node_id": None, "text": None, "score": None}
    key = "margin" if spec.null_global else "score"
    best = max(candidates, key=lambda c: c[key])
    out = {"node_id": best["node_id"], "text": best["text"], "score": finite(best["score"])}
    if spec.null_global:
        out["margin"] = finite(best["margin"])
    return out


def _merge_labels(parts: list[list[dict]], spec: Any) -> dict:
    nodes: dict[str, dict] = {}
    for part in parts:
        for entry in part["positives"]:
            if entry["node_id"] not in nodes or entry["score"] > nodes[entry["node_id"]]["score"]:
                nodes[entry["node_id"]] = entry
    out: dict[str, Any] = {"node_ids": list(nodes), "scores": [e["score"] for e in nodes.values()]}
    if len(spec.classes) > 2:
        out["classes"] = [e["class"] for e in nodes.values()]
    if any(part["hotpot"] for part in parts):
        out["facts"] = [e["fact"] for e in nodes.values() if "fact" in e]
    return out


def document_record(head: dict[str, Any], specs: dict[str, Any], parts: dict[str, list], instances: list, n_best: int):
    """The record of one document: `head` (id, document number, source), then per target its
    answer over the document's instances, then the truncation report when the document was cut."""
    record = {**head, "windows": len(instances)}
    for name, spec in specs.items():
        if spec.kind == "span":
            record[name] = _merge_span(parts[name], n_best)
        elif spec.kind == "spans":
            record[name] = _merge_keyphrases(parts[name], n_best)
        elif spec.kind == "choice":
            record[name] = _merge_choice(parts[name], spec)
        else:
            record[name] = _merge_labels(parts[name], spec)
    cut = [inst.truncation for inst in instances if inst.truncation.truncated]
    if cut:
        record["truncation"] = dataclasses.asdict(cut[0])
    return record
