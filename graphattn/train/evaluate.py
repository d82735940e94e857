"""`graphattn evaluate --model RUN_OR_CHECKPOINT --data SHARDS...`: each target's standard metric.

The gold answers are the targets in the shards; the model is the one `graphattn train` wrote.
Each target is scored by the metric its schema names (`metric:`, see `graphattn.train.metrics`),
per document: the windows of one NQ document are read together, as the datasets' scripts read
one prediction per example.

    set_f1     HotpotQA supporting facts: per document, the F1 / precision / recall / exact match of
               the predicted positive globals (class > 0) against the labelled ones, averaged
    accuracy   global_labels: share of labelled globals with the right class; choice (WikiHop): share
               of instances whose best candidate is a chosen one
    nq_long    NQ long answer: per document the best candidate over its windows, scored by its logit
               minus the null global's; F1 / precision / recall at the best score threshold
    squad      HotpotQA answer: exact match and F1 of the answer text (the predicted span's characters,
               or yes / no) against the gold target's, normalized
    nq_short   NQ short answer: the best span over the windows (span score minus the null score); right
               when its characters equal the gold short answer's, or its yes / no type the gold one;
               F1 at the best score threshold
    f1_at_k    OpenKP: the best distinct n-grams over the windows against the gold keyphrase texts,
               P / R / F1 @1, @3, @5

Documents whose gold is not in the shards (truncation cut the answer, the label matched
nothing at compile time, or the record had no answers: `graphattn.train.labelled`) are left out
of that target's score and counted as `skipped` (`unlabelled`: those without any gold label);
the report says how many documents had no label for any target, and shards in which none has
one are refused with a pointer to `graphattn predict`.

Beside each target's headline score the report prints what trivial predictors score on the same
documents, so that a number can be read: `all-positive` (every global a positive / every
candidate tied), `majority` (the most frequent gold class or answer, for every item) and
`random` (uniform choices from a generator seeded with 0). A line says so when the model
predicts no positive at all (a supporting-fact F1 of 0 then means "it learned to say no").
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphattn.contract import TARGET_IGNORE, EtcInstance
from graphattn.errors import GraphattnError
from graphattn.shards.inspect import add_verify_argument
from graphattn.train import metrics as m
from graphattn.train.arguments import bounded, path_exists
from graphattn.train.checkpoint_dirs import TRUST_FLAG
from graphattn.train.labelled import gold_positives, require_labels, split_labelled

DEVICE = re.compile(r"cpu|cuda(:\d{1,3})?")
BASELINE_SEED = 0
HEADLINE = {
    "accuracy": "accuracy",
    "set_f1": "sp_f1",
    "nq_long": "f1",
    "squad": "f1",
    "nq_short": "f1",
    "f1_at_k": "f1@3",
}


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """--model RUN, as evaluate and predict take it."""
    parser.add_argument(
        "--model",
        required=True,
        metavar="RUN",
        help="a `graphattn train --out` directory (its newest checkpoint) or a checkpoint directory inside one",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    parser.add_argument(
        "--data", required=True, nargs="+", metavar="SHARDS", help="compiled shards: directories, files or globs"
    )
    parser.add_argument("--batch-size", type=bounded(int, 1, 65_536), default=8)
    parser.add_argument("--device", type=_device_name, default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--json", metavar="FILE", help="also write the metrics to FILE as JSON")
    parser.add_argument(
        TRUST_FLAG,
        action="store_true",
        help="the checkpoint has no digest.json (an older graphattn wrote it, or its digest was removed): check that "
        "it loads and record its digest.json",
    )
    add_verify_argument(parser)


def _device_name(text: str) -> str:
    if not DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


def check_device(device: str) -> None:
    """`--device cuda` on a machine without one: say so (not a damaged checkpoint)."""
    import torch

    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise GraphattnError(
            f"--device {device}: no CUDA device is available here (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda or 'none'}); use --device cpu"
        )
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise GraphattnError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def run(args: argparse.Namespace) -> int:
    missing = next((v for v in args.data if not path_exists(v)), None)
    if missing is not None:
        raise GraphattnError(f"--data {missing}: no such file or directory (nor a glob that matches one)")
    if not path_exists(args.model):
        raise GraphattnError(f"--model {args.model}: no such directory")
    report = evaluate_model(
        args.model,
        args.data,
        batch_size=args.batch_size,
        device=args.device,
        verify_sha256=args.verify_sha256,
        trust_undigested=args.trust_undigested,
    )
    print("\n".join(report_lines(report)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report.to_dict(), handle, indent=1)
    return 0


# -- what one instance contributes ---------------------------------------------------------------
@dataclass
class _Document:
    """Everything gathered for one document over its instances (windows)."""

    number: int
    labels: dict[str, list] = field(default_factory=lambda: defaultdict(list))


def _span_text(inst: EtcInstance, first: int, last: int) -> tuple[int, int, str]:
    """Characters (start, end) and text of long tokens first..last (the compiler's own tokens add nothing)."""
    from graphattn.train.spans import span_text  # torch: imported once a model runs

    return span_text(inst, first, last)


def _gather(name: str, kind: str, spec, inst: EtcInstance, prediction: Any, b: int, docs: dict, number: int) -> None:
    """Append what instance b of a batch says about target `name` to its document's record. Span
    answers and keyphrases are the whole-word ones `graphattn predict` writes (`graphattn.train.spans`)."""
    from graphattn.train.spans import instance_keyphrases, instance_span

    doc = docs.setdefault(number, _Document(number))
    targets = inst.targets
    G = inst.global_length
    if kind in ("global_labels", "choice"):
        gold = targets[name]
        scores = prediction[b, :G].float().cpu().numpy()
        doc.labels[name].append((list(inst.global_node_ids), gold, scores))
    elif kind == "span":
        answer = instance_span(prediction, b, inst, n_best=1)
        gold = tuple(int(targets[f"{name}_{part}"]) for part in ("start", "end", "type"))
        gold_text = _span_text(inst, gold[0], gold[1]) if gold[0] >= 0 else (-1, -1, "")
        doc.labels[name].append(
            {
                "type": answer["type"],
                "chars": (answer["char_start"], answer["char_end"]),
                "text": answer["text"],
                "margin": answer["margin"],
                "gold_type": None if gold[2] == TARGET_IGNORE else spec.types[gold[2]],
                "gold_chars": gold_text[:2],
                "gold_text": gold_text[2],
            }
        )
    else:
        rows = targets[name]
        gold = [_span_text(inst, int(a), int(z))[2] for a, z in rows if a >= 0]
        ranked = [(phrase["score"], phrase["text"]) for phrase in instance_keyphrases(prediction, b, inst)]
        doc.labels[name].append((gold, ranked))


# -- scoring each metric over documents -------------------------------------------------------------
def _global_accuracy(records: list) -> dict[str, float]:
    right = total = 0
    for _, gold, scores in records:
        labelled = gold != TARGET_IGNORE
        right += int(np.count_nonzero(scores[labelled].argmax(-1) == gold[labelled]))
        total += int(np.count_nonzero(labelled))
    return {"accuracy": right / total if total else 0.0, "n": total}


def _set_f1(documents: list[list]) -> dict[str, float]:
    rows, skipped = [], 0
    for records in documents:
        gold, predicted = set(), set()
        for nodes, labels, scores in records:
            labelled = np.flatnonzero(labels != TARGET_IGNORE)
            gold |= {(nodes[g], int(labels[g])) for g in labelled if labels[g] > 0}
            guessed = scores.argmax(-1)
            predicted |= {(nodes[g], int(guessed[g])) for g in labelled if guessed[g] > 0}
        if not any((labels != TARGET_IGNORE).any() for _, labels, _ in records):
            skipped += 1
            continue
        rows.append(m.set_scores(predicted, gold))
    means = m.mean_scores(rows)
    return {**{f"sp_{k}": v for k, v in means.items()}, "n": len(rows), "skipped": skipped}


def _choice_accuracy(records: list) -> dict[str, float]:
    right = total = 0
    for _, labels, scores in records:
        candidates = labels != TARGET_IGNORE
        if not (labels == 1).any():
            continue
        best = int(np.argmax(np.where(candidates, scores, -np.inf)))
        right += int(labels[best] == 1)
        total += 1
    return {"accuracy": right / total if total else 0.0, "n": total}


def _nq_long(documents: list[list], null_node: str | None) -> dict[str, float]:
    examples = []
    for records in documents:
        gold, best, best_margin = set(), None, -np.inf
        for nodes, labels, scores in records:
            null = nodes.index(null_node) if null_node in nodes else None
            floor = scores[null] if null is not None else 0.0
            for g in np.flatnonzero(labels != TARGET_IGNORE):
                if g == null:
                    continue
                if labels[g] == 1:
                    gold.add(nodes[g])
                if scores[g] - floor > best_margin:
                    best, best_margin = nodes[g], float(scores[g] - floor)
        examples.append((bool(gold), best is not None, best in gold, best_margin if best is not None else -np.inf))
    return {**m.best_threshold_f1(examples), "n": len(examples)}


def _squad(documents: list[list]) -> dict[str, float]:
    rows, skipped = [], 0
    for records in documents:
        known = [r for r in records if r["gold_type"] not in (None, "null")]
        if not known:
            skipped += 1
            continue
        gold = known[0]
        gold_answer = gold["gold_type"] if gold["gold_type"] in ("yes", "no") else gold["gold_text"]
        best = max(records, key=lambda r: r["margin"])
        answer = best["type"] if best["type"] in ("yes", "no") else ("" if best["type"] == "null" else best["text"])
        rows.append(m.answer_scores(answer, gold_answer))
    return {**m.mean_scores(rows), "n": len(rows), "skipped": skipped}


def _nq_short(documents: list[list]) -> dict[str, float]:
    examples = []
    for records in documents:
        gold = {
            (r["gold_type"], r["gold_chars"] if r["gold_type"] == "short" else None)
            for r in records
            if r["gold_type"] in ("short", "yes", "no")
        }
        candidates = [r for r in records if r["type"] in ("short", "yes", "no")]
        best = max(candidates, key=lambda r: r["margin"]) if candidates else None
        guess = (best["type"], best["chars"] if best["type"] == "short" else None) if best else None
        examples.append((bool(gold), best is not None, guess in gold, best["margin"] if best else -np.inf))
    return {**m.best_threshold_f1(examples), "n": len(examples)}


def _f1_at_k(documents: list[list]) -> dict[str, float]:
    rows, skipped = [], 0
    for records in documents:
        gold = [text for g, _ in records for text in g]
        if not gold:
            skipped += 1
            continue
        ranked = sorted((pair for _, r in records for pair in r), key=lambda pair: -pair[0])
        rows.append(m.keyphrase_scores([text for _, text in ranked], gold))
    return {**m.mean_scores(rows), "n": len(rows), "skipped": skipped}


@dataclass
class EvaluationReport:
    model: str
    step: int
    data: list[str]
    instances: int
    documents: int
    scores: dict[str, dict[str, Any]]  # target -> {"metric": name, score name -> value}
    skipped: int = 0  # documents without a gold label for any target: scored nowhere

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "step": self.step,
            "data": self.data,
            "instances": self.instances,
            "documents": self.documents,
            "skipped_documents": self.skipped,
            "scores": self.scores,
        }


def _score(spec, documents: list[list]) -> dict[str, Any]:
    metric = spec.default_metric
    flat = [r for records in documents for r in records]
    if metric == "accuracy" and spec.kind == "global_labels":
        values = _global_accuracy(flat)
    elif metric == "accuracy":
        values = _choice_accuracy(flat)
    elif metric == "set_f1":
        values = _set_f1(documents)
    elif metric == "nq_long":
        values = _nq_long(documents, f"<{spec.null_global}>" if spec.null_global else None)
    elif metric == "squad":
        values = _squad(documents)
    elif metric == "nq_short":
        values = _nq_short(documents)
    else:
        values = _f1_at_k(documents)
    return {"metric": metric, **values}


def evaluate_model(
    model_path: str,
    data: str | Sequence[str],
    *,
    batch_size: int = 8,
    device: str = "cpu",
    verify_sha256: bool = True,
    trust_undigested: bool = False,
) -> EvaluationReport:
    """Score a trained model on compiled shards (see the module docstring); every row read is
    checked, and each shard against its done marker unless `verify_sha256` is False."""
    import torch

    from graphattn.compile.batching import collate
    from graphattn.shards.dataset import ShardDataset
    from graphattn.train.finetune import load_task_model, open_shards
    from graphattn.train.run_match import check_shards_fit_run
    from graphattn.train.rundir import RUN_FILE

    if batch_size < 1:
        raise GraphattnError(f"--batch-size must be at least 1, got {batch_size}")
    check_device(device)
    model, run = load_task_model(model_path, device, trust_undigested=trust_undigested)
    shards = open_shards(data, verify_sha256=verify_sha256)
    check_shards_fit_run(run, shards, flag="--data", where=str(Path(run["checkpoint"]).parent / RUN_FILE))
    dataset = ShardDataset(shards.paths, compact=True, classes=shards.classes, verify_sha256=verify_sha256)
    documents: dict[str, dict[int, _Document]] = {name: {} for name in model.targets}
    numbers = set()
    with torch.no_grad():
        for start in range(0, len(dataset), batch_size):
            indices = range(start, min(start + batch_size, len(dataset)))
            instances = [dataset[i] for i in indices]
            predictions = model.predict(collate(instances).to(device))
            for b, (i, inst) in enumerate(zip(indices, instances)):
                number = dataset.provenance(i).doc_numbers[0]
                numbers.add(number)
                for name, head in model.targets.items():
                    _gather(name, head.spec.kind, head.spec, inst, predictions[name], b, documents[name], number)
    scores, flags = {}, {}
    for name, head in model.targets.items():
        kind = head.spec.kind
        per_document, flags[name] = split_labelled(kind, [d.labels[name] for _, d in sorted(documents[name].items())])
        unlabelled = int(flags[name].size - np.count_nonzero(flags[name]))
        values = _score(head.spec, per_document) if per_document else {"metric": head.spec.default_metric, "n": 0}
        scores[name] = {**values, "skipped": values.get("skipped", 0) + unlabelled, "unlabelled": unlabelled}
        scores[name]["baselines"] = trivial_scores(head.spec, per_document) if per_document else {}
        scores[name]["predicted_positives"] = predicted_positives(kind, per_document)
        scores[name]["gold_positives"] = gold_positives(kind, per_document) if per_document else None
    require_labels(flags, model_path, data, shards.paths[0])
    skipped = int(np.count_nonzero(~np.logical_or.reduce(list(flags.values())))) if flags else 0
    return EvaluationReport(
        str(run["checkpoint"]), run["step"], shards.paths, len(dataset), len(numbers), scores, skipped
    )


def report_lines(report: EvaluationReport) -> list[str]:
    out = [
        f"evaluated {report.model} (step {report.step}) on {report.instances:,} instance(s) of {report.documents:,} "
        f"document(s) in {len(report.data)} shard(s)"
    ]
    if report.skipped:
        out.append(
            f"  skipped {report.skipped:,} of {report.documents:,} document(s): no gold label for any target "
            "(records without answers); the scores are those of the labelled ones"
        )
    for name, values in report.scores.items():
        shown = "  ".join(
            f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
            for k, v in values.items()
            if k not in ("metric", "baselines", "predicted_positives", "gold_positives", "unlabelled")
        )
        out.append(f"  {name:<14} {values['metric']:<9} {shown}")
        baselines = values.get("baselines") or {}
        if baselines:
            headline = HEADLINE[values["metric"]]
            trivial = "  ".join(f"{k} {v:.4f}" for k, v in baselines.items())
            out.append(f"  {'':<14} {'':<9} trivial predictors, {headline}: {trivial}")
        if values.get("unlabelled") and values["unlabelled"] != report.skipped:
            out.append(
                f"  {'':<14} {'':<9} {values['unlabelled']:,} document(s) without a gold label for {name} left out "
                "(counted in skipped)"
            )
        if values.get("gold_positives") == 0:
            out.append(
                f"  {'':<14} {'':<9} note: no labelled global has a positive gold class: shards compiled from "
                "records without answers by an older graphattn read so; compile them again"
            )
        if values.get("predicted_positives") == 0:
            out.append(
                f"  {'':<14} {'':<9} note: the model predicted no positive at all (every labelled global got class 0); "
                "its score is that of a model that always says no"
            )
    return out


# -- what trivial predictors score ------------------------------------------------------------------
def predicted_positives(kind: str, documents: list[list]) -> int | None:
    """How many labelled globals the model put in a class > 0 (global_labels targets; None else)."""
    if kind != "global_labels":
        return None
    count = 0
    for records in documents:
        for _, labels, scores in records:
            labelled = labels != TARGET_IGNORE
            count += int(np.count_nonzero(scores[labelled].argmax(-1) > 0))
    return count


def _one_hot(scores: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    out = np.zeros_like(scores)
    np.put_along_axis(out, chosen[..., None], 1.0, axis=-1)
    return out


def _replace_global_scores(documents: list[list], make) -> list[list]:
    return [[(nodes, labels, make(labels, scores)) for nodes, labels, scores in records] for records in documents]


def trivial_scores(spec, documents: list[list]) -> dict[str, float]:
    """The headline metric of all-positive / majority / random predictions on the same documents
    (only those that mean something for the target's kind)."""
    rng = np.random.default_rng(BASELINE_SEED)
    headline = HEADLINE[spec.default_metric]
    kind = spec.kind
    made: dict[str, list[list]] = {}
    if kind == "global_labels":
        golds = [labels[labels != TARGET_IGNORE] for records in documents for _, labels, _ in records]
        flat = np.concatenate(golds) if golds else np.zeros(0, dtype=np.int64)
        majority = int(np.bincount(flat).argmax()) if flat.size else 0

        def classes(value):
            return lambda labels, scores: _one_hot(scores, np.full(scores.shape[:-1], value(scores), dtype=np.int64))

        made["all-positive"] = _replace_global_scores(documents, classes(lambda scores: 1))
        made["majority"] = _replace_global_scores(documents, classes(lambda scores: majority))
        made["random"] = _replace_global_scores(
            documents,
            lambda labels, scores: _one_hot(scores, rng.integers(0, scores.shape[-1], size=scores.shape[:-1])),
        )
    elif kind == "choice" or spec.default_metric == "nq_long":
        made["all-positive"] = _replace_global_scores(documents, lambda labels, scores: np.ones_like(scores))
        made["random"] = _replace_global_scores(documents, lambda labels, scores: rng.random(scores.shape))
    elif kind == "span":
        gold_types = Counter(r["gold_type"] for records in documents for r in records if r["gold_type"])
        gold_texts = Counter(
            (r["gold_type"] if r["gold_type"] in ("yes", "no") else r["gold_text"])
            for records in documents
            for r in records
            if r["gold_type"] not in (None, "null")
        )
        if gold_texts and spec.default_metric == "squad":
            answer = gold_texts.most_common(1)[0][0]
            kind_of = answer if answer in ("yes", "no") else "span"
            made["majority"] = [
                [{**r, "type": kind_of, "text": answer, "margin": 0.0} for r in records] for records in documents
            ]
        elif gold_types:
            common = gold_types.most_common(1)[0][0]
            made["majority"] = [
                [{**r, "type": common, "chars": r["gold_chars"], "margin": 0.0} for r in records]
                for records in documents
            ]
    else:  # spans (keyphrases): the model's own candidate phrases in a random order
        made["random"] = [
            [(gold, [(float(rng.random()), text) for _, text in ranked]) for gold, ranked in records]
            for records in documents
        ]
    return {name: float(_score(spec, docs).get(headline, 0.0)) for name, docs in made.items()}
