"""Task metrics, written from the definitions in the datasets' official evaluation scripts.

    normalize_answer(text)              HotpotQA / SQuAD: lower case, punctuation removed, the articles
                                        a / an / the removed, whitespace collapsed (in that order)
    answer_scores(prediction, gold)     exact match, F1, precision, recall of two answer strings over their
                                        normalized tokens; a yes / no / noanswer on either side scores 0
                                        unless both are the same (hotpot_evaluate_v1.py)
    set_scores(predicted, gold)         F1, precision, recall, exact match of two sets (HotpotQA's
                                        supporting facts; precision 0 when nothing is predicted)
    best_threshold_f1(examples)         NQ (nq_eval.py): examples (has_gold, has_prediction, correct, score)
                                        sorted by score; precision = correct / predicted and recall = correct /
                                        gold above each score threshold; the threshold with the best F1
    keyphrase_scores(predicted, gold)   OpenKP (evaluate.py): phrases lower-cased with single spaces and
                                        de-duplicated in order; P@k = hits in the first k / k (k, even when
                                        fewer are predicted), R@k = hits / gold phrases, F1@k, for k = 1, 3, 5

Every score is averaged over examples by the caller (`graphattn.train.evaluate`), as the scripts do.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
SPECIAL_ANSWERS = ("yes", "no", "noanswer")
KEYPHRASE_DEPTHS = (1, 3, 5)


def normalize_answer(text: str) -> str:
    lowered = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", lowered).split())


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def answer_scores(prediction: str, gold: str) -> dict[str, float]:
    """{"em", "f1", "precision", "recall"} of one predicted answer against the gold one."""
    pred, truth = normalize_answer(prediction), normalize_answer(gold)
    em = float(pred == truth)
    zero = {"em": em, "f1": 0.0, "precision": 0.0, "recall": 0.0}
    if (pred in SPECIAL_ANSWERS or truth in SPECIAL_ANSWERS) and pred != truth:
        return zero
    pred_tokens, gold_tokens = pred.split(), truth.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return zero
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return {"em": em, "f1": _f1(precision, recall), "precision": precision, "recall": recall}


def set_scores(predicted: Iterable, gold: Iterable) -> dict[str, float]:
    """{"f1", "precision", "recall", "em"} of a predicted set against the gold set."""
    predicted, gold = set(predicted), set(gold)
    hits = len(predicted & gold)
    precision = hits / len(predicted) if predicted else 0.0
    recall = hits / len(gold) if gold else 0.0
    return {"f1": _f1(precision, recall), "precision": precision, "recall": recall, "em": float(predicted == gold)}


def best_threshold_f1(examples: Sequence[tuple[bool, bool, bool, float]]) -> dict[str, float]:
    """{"f1", "precision", "recall", "threshold"} at the score threshold with the best F1.

    Each example is (has_gold, has_prediction, correct, score); examples scoring below the
    threshold count as predicting nothing. Ties are counted together (a threshold keeps or
    drops all examples of one score)."""
    if not examples:
        return {"f1": 0.0, "precision": 0.0, "recall": 0.0, "threshold": 0.0}
    has_gold, has_pred, correct, score = (np.asarray(column) for column in zip(*examples))
    order = np.argsort(-score.astype(np.float64), kind="stable")
    score = score[order].astype(np.float64)
    correct_so_far = np.cumsum(correct[order].astype(np.int64))
    predicted_so_far = np.cumsum(has_pred[order].astype(np.int64))
    gold_total = int(np.count_nonzero(has_gold))
    last_of_score = np.flatnonzero(np.append(score[1:] != score[:-1], True))  # after every tie is counted
    precision = np.divide(correct_so_far, predicted_so_far, out=np.zeros(score.size), where=predicted_so_far > 0)[
        last_of_score
    ]
    recall = (correct_so_far / gold_total if gold_total else np.zeros(score.size))[last_of_score]
    f1 = np.divide(
        2 * precision * recall, precision + recall, out=np.zeros(precision.size), where=precision + recall > 0
    )
    if not (f1 > 0).any():
        return {"f1": 0.0, "precision": 0.0, "recall": 0.0, "threshold": 0.0}
    best = int(np.argmax(f1))  # the first (highest) threshold reaching the best F1, as nq_eval keeps it
    return {
        "f1": float(f1[best]),
        "precision": float(precision[best]),
        "recall": float(recall[best]),
        "threshold": float(score[last_of_score][best]),
    }


def keyphrase_key(phrase: str) -> str:
    return " ".join(word.lower() for word in phrase.split())


def _dedup(phrases: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(keyphrase_key(p) for p in phrases if p.strip()))


def keyphrase_scores(
    predicted: Sequence[str], gold: Sequence[str], depths: Sequence[int] = KEYPHRASE_DEPTHS
) -> dict[str, float]:
    """{"p@k", "r@k", "f1@k"} for k in `depths`, for one page."""
    candidates, references = _dedup(predicted), set(_dedup(gold))
    out = {}
    for k in depths:
        hits = sum(1 for phrase in candidates[:k] if phrase in references)
        precision, recall = hits / k, (hits / len(references) if references else 0.0)
        out.update({f"p@{k}": precision, f"r@{k}": recall, f"f1@{k}": _f1(precision, recall)})
    return out


def mean_scores(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each key's mean over the rows (every row has the same keys); {} for no rows."""
    return {key: float(np.mean([row[key] for row in rows])) for key in rows[0]} if rows else {}
