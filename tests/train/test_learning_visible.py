"""A user can see what a run learned: log.jsonl every --log-every steps (each target's loss, the
learning rate), `graphattn plot RUN` draws it, and `evaluate` sets each score beside what trivial
predictors get, saying so when the model predicts no positive at all."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from graphattn.schema import load_schema
from graphattn.train.evaluate import EvaluationReport, predicted_positives, report_lines, trivial_scores
from graphattn.train.runlog import RunLog, read_log

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
TOKENIZER = str(DATA / "tokenizer.json")
TINY = ["--hidden-size", "32", "--layers", "1", "--heads", "2", "--batch-size", "2", "--lr", "1e-3"]
TINY += ["--precision", "fp32", "--no-progress"]


def graphattn(*argv) -> subprocess.CompletedProcess:
    done = subprocess.run(["graphattn", *map(str, argv)], capture_output=True, text=True)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_log_plot_and_trivial_predictors_through_the_command(tmp_path):
    shards, run = tmp_path / "shards", tmp_path / "run"
    compiled = graphattn(
        "compile",
        DATA / "hotpotqa_sample.json",
        "--schema",
        "hotpotqa",
        "--tokenizer",
        TOKENIZER,
        "--out",
        shards,
        "-q",
    )
    assert compiled.returncode == 0, compiled.stderr
    trained = graphattn("train", "--data", shards, "--out", run, "--steps", 6, "--log-every", 2, *TINY)
    assert trained.returncode == 0, trained.stderr
    assert f"log {run / 'log.jsonl'}" in trained.stdout
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6]
    for record in records:
        assert {"loss", "loss/supporting", "loss/answer", "lr", "grad_norm", "epoch"} <= set(record)
        assert record["loss"] == pytest.approx(record["loss/supporting"] + record["loss/answer"], rel=1e-5)
    assert records[0]["lr"] > records[-1]["lr"] > 0  # warm-up over, then the linear decay

    picture = tmp_path / "curves.png"
    drawn = graphattn("plot", run, "--out", picture)
    assert drawn.returncode == 0 and f"wrote {picture}" in drawn.stdout, drawn.stderr
    import matplotlib.image

    pixels = matplotlib.image.imread(picture)
    assert pixels.shape[0] >= 400 and pixels.shape[1] >= 600
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 20  # curves, not a blank canvas

    scored = graphattn("evaluate", "--model", run, "--data", shards, "--json", tmp_path / "m.json")
    assert scored.returncode == 0, scored.stderr
    lines = scored.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("supporting"))
    assert "trivial predictors, sp_f1: all-positive " in lines[at + 1] and " majority " in lines[at + 1]
    assert " random " in lines[at + 1]
    saved = json.loads((tmp_path / "m.json").read_text())["scores"]
    assert set(saved["supporting"]["baselines"]) == {"all-positive", "majority", "random"}


def test_plot_refuses_what_it_cannot_draw_in_one_line(tmp_path):
    done = graphattn("plot", tmp_path)
    assert done.returncode == 2 and "no log.jsonl here" in done.stderr
    (tmp_path / "log.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": "two"}\n')
    done = graphattn("plot", tmp_path)
    assert (
        done.returncode == 2
        and f"{tmp_path / 'log.jsonl'}:2: expected an object with a non-negative integer 'step'" in done.stderr
    )
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_resumed_log_keeps_one_history(tmp_path):
    log = RunLog(tmp_path)
    for step in (1, 2, 3, 4):
        log.write({"step": float(step), "loss": 1.0 / step, "lr": 0.1})
    log.close()
    RunLog(tmp_path, resumed_step=2).close()  # resumed from the checkpoint at step 2
    assert [r["step"] for r in read_log(tmp_path / "log.jsonl")] == [1, 2]
    with open(tmp_path / "log.jsonl", "a") as handle:
        handle.write('{"step": 3, "lo')  # a run killed in the middle of a line
    assert [r["step"] for r in read_log(tmp_path / "log.jsonl")] == [1, 2]


def test_tensorboard_gets_the_same_records_when_installed(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is optional and not installed here")
    log = RunLog(tmp_path)
    log.write({"step": 1, "loss": 0.5, "lr": 0.1})
    log.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


# -- trivial predictors, by hand -----------------------------------------------------------------------
SUPPORTING = load_schema("hotpotqa").targets["supporting"]  # global_labels, set_f1, classes no / yes


def _records(labels: list[int], predicted: list[int]) -> tuple:
    nodes = [f"n{i}" for i in range(len(labels))]
    scores = np.zeros((len(labels), 2), dtype=np.float32)
    scores[np.arange(len(labels)), predicted] = 1.0
    return nodes, np.array(labels), scores


def test_trivial_predictors_of_supporting_facts_by_hand():
    documents = [
        [_records([1, 0, -100], [0, 0, 0])],  # gold {n0}
        [_records([1, 0, 0], [0, 0, 0])],  # gold {n0}; labelled classes overall: 1,0,1,0,0 -> majority 0
    ]
    scores = trivial_scores(SUPPORTING, documents)
    # all-positive: doc 1 predicts {n0, n1}: P 1/2, R 1, F1 2/3; doc 2 {n0, n1, n2}: P 1/3, R 1, F1 1/2
    assert scores["all-positive"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert scores["majority"] == 0.0  # class 0 everywhere: nothing predicted, F1 0
    assert 0.0 <= scores["random"] <= 1.0 and trivial_scores(SUPPORTING, documents)["random"] == scores["random"]
    assert predicted_positives("global_labels", documents) == 0
    report = EvaluationReport(
        "run/step-00000004",
        4,
        ["s.parquet"],
        2,
        2,
        {"supporting": {"metric": "set_f1", "sp_f1": 0.0, "n": 2, "baselines": scores, "predicted_positives": 0}},
    )
    lines = report_lines(report)
    assert lines[2].strip().startswith("trivial predictors, sp_f1: all-positive 0.5833  majority 0.0000  random")
    assert "note: the model predicted no positive at all" in lines[3]
