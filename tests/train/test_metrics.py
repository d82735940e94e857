"""The task metrics on cases computed by hand, and the per-document aggregation of `evaluate`."""

from __future__ import annotations

import numpy as np
import pytest

from graphattn.train import evaluate as ev
from graphattn.train.metrics import answer_scores, best_threshold_f1, keyphrase_scores, normalize_answer, set_scores

I = -100  # noqa: E741 - TARGET_IGNORE


def test_normalization_lowers_drops_punctuation_then_articles_then_spaces():
    assert normalize_answer("The  Cat's, hat!") == "cats hat"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("Theatre, the THEATRE") == "theatre theatre"  # whole words only
    assert normalize_answer("  a.  ") == ""


def test_answer_exact_match_and_f1_by_hand():
    assert answer_scores("the Eiffel Tower", "Eiffel Tower.") == {"em": 1.0, "f1": 1.0, "precision": 1.0, "recall": 1.0}
    scores = answer_scores("Eiffel tower in Paris", "the Eiffel Tower")  # 2 of 4 predicted tokens, 2 of 2 gold
    assert scores == pytest.approx({"em": 0.0, "f1": 2 / 3, "precision": 0.5, "recall": 1.0})
    assert answer_scores("yes", "no") == {"em": 0.0, "f1": 0.0, "precision": 0.0, "recall": 0.0}
    assert answer_scores("Yes.", "yes")["f1"] == 1.0
    assert answer_scores("yes", "yes it is")["f1"] == 0.0  # a yes / no answer scores only against itself
    assert answer_scores("river river", "river")["f1"] == pytest.approx(2 / 3)  # counts clip: 1 of 2, 1 of 1


def test_set_scores_by_hand():
    assert set_scores({"a", "b", "c"}, {"b", "c", "d", "e"}) == pytest.approx(
        {"f1": 4 / 7, "precision": 2 / 3, "recall": 0.5, "em": 0.0}
    )
    assert set_scores(set(), {"a"}) == {"f1": 0.0, "precision": 0.0, "recall": 0.0, "em": 0.0}
    assert set_scores({"a"}, {"a"})["em"] == 1.0


def test_best_threshold_f1_by_hand():
    examples = [
        (True, True, True, 0.9),
        (True, True, False, 0.8),
        (False, True, False, 0.7),
        (True, True, True, 0.6),
        (True, False, False, 0.5),
    ]
    # thresholds: .9 -> P 1, R 1/4; .8 -> 1/2, 1/4; .7 -> 1/3, 1/4; .6 -> 2/4, 2/4 (F1 .5); .5 -> the same: .6 is kept
    assert best_threshold_f1(examples) == pytest.approx({"f1": 0.5, "precision": 0.5, "recall": 0.5, "threshold": 0.6})
    tied = [(True, True, True, 1.0), (True, True, False, 1.0), (True, True, True, 0.0)]  # a threshold keeps both 1.0s
    assert best_threshold_f1(tied) == pytest.approx(
        {"f1": 2 / 3, "precision": 2 / 3, "recall": 2 / 3, "threshold": 0.0}
    )
    assert best_threshold_f1([(True, True, False, 1.0)])["f1"] == 0.0


def test_keyphrase_scores_by_hand_and_on_openkps_own_example():
    scores = keyphrase_scores(
        ["Storm Surge", "storm surge", "tide", "Thames Barrier"], ["storm surge", "thames barrier", "flood"]
    )
    assert scores == pytest.approx(
        {
            "p@1": 1.0,
            "r@1": 1 / 3,
            "f1@1": 0.5,
            "p@3": 2 / 3,
            "r@3": 2 / 3,
            "f1@3": 2 / 3,
            "p@5": 0.4,
            "r@5": 2 / 3,
            "f1@5": 0.5,
        }
    )  # precision @5 divides by 5, not by 3
    # OpenKP's README: candidate [NBA] [Key Generator] [Xbox] against reference [NBA 2K17] [Key Generator] [Xbox]
    official = keyphrase_scores(["NBA", "Key Generator", "Xbox"], ["NBA 2K17", "Key Generator", "Xbox"])
    assert [official[f"f1@{k}"] for k in (1, 3, 5)] == pytest.approx([0.0, 2 / 3, 0.5])
    assert (official["p@5"], official["r@5"]) == pytest.approx((0.4, 2 / 3))


# -- aggregation over the windows of a document -------------------------------------------------------
def test_nq_long_answer_takes_the_best_candidate_over_windows():
    nodes = ["<cls>", "q", "c0", "c1"]
    window = lambda labels, scores: (nodes, np.array(labels), np.array(scores, dtype=np.float32))  # noqa: E731
    right = [
        window([0, I, 1, 0], [0.0, 9.0, 2.0, 1.0]),
        window([1, I, 0, 0], [3.0, 9.0, 0.0, 5.0]),
    ]  # c0 +2 here, c1 +2 there
    wrong = [window([0, I, 0, 1], [0.0, 0.0, 4.0, 1.0])]
    null = [window([1, I, 0, 0], [0.0, 0.0, 0.5, 0.2])]  # no gold answer; predicts c0 at margin 0.5
    scores = ev._nq_long([right, wrong, null], "<cls>")
    # margins: right doc ties (c0 +2, c1 +2: the first, c0, is kept) -> correct at 2; wrong doc c0 at 4; null doc at 0.5
    # sorted 4 (wrong), 2 (right), 0.5 (null): best threshold 2 -> P 1/2, R 1/2
    assert scores == pytest.approx({"f1": 0.5, "precision": 0.5, "recall": 0.5, "threshold": 2.0, "n": 3})


def test_squad_scores_the_best_window_and_skips_documents_without_a_known_answer():
    def record(kind, text, margin, gold_type, gold_text):
        return {
            "type": kind,
            "text": text,
            "margin": margin,  # noqa: E731
            "gold_type": gold_type,
            "gold_text": gold_text,
        }

    documents = [
        [record("span", "the River Thames", 3.0, "span", "River Thames")],
        [record("yes", "", 1.0, "no", "")],
        [record("span", "Thames", 1.0, "null", "")],
    ]  # the answer was cut away: no gold to compare with
    assert ev._squad(documents) == pytest.approx(
        {"em": 0.5, "f1": 0.5, "precision": 0.5, "recall": 0.5, "n": 2, "skipped": 1}
    )


def test_supporting_fact_f1_per_document():
    nodes = ["<cls>", "s0", "s1", "s2"]
    labels = np.array([I, 1, 0, 1])
    scores = np.array([[1, 0], [0.2, 0.8], [0.3, 0.7], [0.9, 0.1]])  # predicts s0 and s1
    assert ev._set_f1([[(nodes, labels, scores)]]) == pytest.approx(
        {"sp_f1": 0.5, "sp_precision": 0.5, "sp_recall": 0.5, "sp_em": 0.0, "n": 1, "skipped": 0}
    )


def test_f1_at_k_merges_windows_by_score():
    documents = [[(["storm surge"], [(2.0, "tide"), (0.5, "barrier")]), ([], [(3.0, "Storm surge")])]]
    scores = ev._f1_at_k(documents)
    assert (scores["p@1"], scores["r@1"], scores["n"]) == (1.0, 1.0, 1)  # "Storm surge" (3.0) comes first
