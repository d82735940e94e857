"""`graphattn compile` -> `graphattn train --data OUT` -> `graphattn evaluate`, as a user runs them:
on every bundled sample at tiny sizes, from raw records, with the errors a user meets, and
Ctrl-C in the middle of training (a checkpoint, the resume command, exit 130, an exact resume)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from graphattn.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
TOKENIZER = str(DATA / "tokenizer.json")
SAMPLES = {
    "hotpotqa": "hotpotqa_sample.json",
    "wikihop": "wikihop_sample.json",
    "nq": "nq_sample.jsonl",
    "openkp-dom": "openkp_sample.jsonl",
}
TINY = [
    "--hidden-size",
    "32",
    "--layers",
    "1",
    "--heads",
    "2",
    "--batch-size",
    "2",
    "--lr",
    "1e-3",
    "--precision",
    "fp32",
    "--no-progress",
]
METRIC_LINES = {
    "hotpotqa": [r"supporting +set_f1 +sp_f1 [0-9.]+  sp_precision", r"answer +squad +em [0-9.]+  f1 [0-9.]+"],
    "wikihop": [r"answer +accuracy +accuracy [0-9.]+  n 2"],
    "nq": [r"long_answer +nq_long +f1 [0-9.]+  precision", r"answer +nq_short +f1 [0-9.]+"],
    "openkp-dom": [r"keyphrases +f1_at_k +p@1 [0-9.]+  r@1 [0-9.]+  f1@1 [0-9.]+  p@3 .* f1@5 [0-9.]+"],
}


def compile_argv(source: str | Path, schema: str, out: Path) -> list[str]:
    return ["compile", str(source), "--schema", schema, "--tokenizer", TOKENIZER, "--out", str(out), "--quiet"]


def sample(schema: str) -> Path:
    return DATA / SAMPLES[schema]


def graphattn(*argv: str) -> subprocess.CompletedProcess:
    done = subprocess.run(["graphattn", *argv], capture_output=True, text=True)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_compile_train_evaluate_with_the_installed_command(tmp_path):
    shards, run = tmp_path / "shards", tmp_path / "run"
    compiled = graphattn(*compile_argv(sample("hotpotqa"), "hotpotqa", shards))
    assert compiled.returncode == 0, compiled.stderr
    trained = graphattn("train", "--data", str(shards), "--out", str(run), "--steps", "2", *TINY)
    assert trained.returncode == 0, trained.stderr
    assert (
        "2 training instances in 1 shard(s), streamed; targets supporting (global_labels), answer (span); "
        "random encoder: 1 layers, hidden 32, 2 heads"
    ) in trained.stdout
    assert "trained 2 steps; last loss" in trained.stdout and (run / "step-00000002" / "trainer.pt").is_file()
    evaluated = graphattn("evaluate", "--model", str(run), "--data", str(shards), "--json", str(tmp_path / "m.json"))
    assert evaluated.returncode == 0, evaluated.stderr
    first = f"evaluated {run / 'step-00000002'} (step 2) on 2 instance(s) of 2 document(s) in 1 shard(s)"
    assert evaluated.stdout.startswith(first)
    for pattern in METRIC_LINES["hotpotqa"]:
        assert re.search(pattern, evaluated.stdout), evaluated.stdout
    scores = json.loads((tmp_path / "m.json").read_text())["scores"]
    assert scores["supporting"]["metric"] == "set_f1" and 0 <= scores["supporting"]["sp_f1"] <= 1
    assert scores["answer"]["n"] == 2


@pytest.mark.parametrize("schema", ["wikihop", "nq", "openkp-dom"])
def test_compile_train_evaluate_on_the_other_samples(schema, tmp_path, capsys):
    shards, run = tmp_path / "shards", tmp_path / "run"
    assert main(compile_argv(sample(schema), schema, shards)) == 0
    glob = str(shards / "*.parquet")  # --data takes globs of shard files too
    assert main(["train", "--data", glob, "--out", str(run), "--steps", "2", *TINY, "--eval-data", str(shards)]) == 0
    printed = capsys.readouterr().out
    assert "trained 2 steps" in printed and "evaluated" in printed
    for pattern in METRIC_LINES[schema]:
        assert re.search(pattern, printed), printed


def test_raw_records_are_compiled_into_the_run_first_and_reused(tmp_path, capsys):
    argv = [
        "train",
        "--data",
        str(sample("wikihop")),
        "--schema",
        "wikihop",
        "--tokenizer",
        TOKENIZER,
        "--out",
        str(tmp_path),
        *TINY,
    ]
    assert main(argv + ["--steps", "1"]) == 0
    printed = capsys.readouterr().out
    compiled = tmp_path / "compiled"
    assert (
        f"--data holds raw records, not shards: compiling them into {compiled} first (graphattn compile); "
        f"next time pass --data {compiled}"
    ) in printed
    assert "trained 1 steps" in printed and (compiled / "shard-00000.parquet").is_file()
    assert main(argv + ["--steps", "2", "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "finishing or reusing the earlier compile there" in printed and "trained 2 steps" in printed


def test_errors_a_user_meets(tmp_path, capsys):
    wikihop, run = str(sample("wikihop")), str(tmp_path / "r")

    def fails(argv: list[str], message: str) -> None:
        assert main(argv) == 2
        assert message in capsys.readouterr().err

    fails(
        ["train", "--data", wikihop, "--out", run, "--steps", "1"],
        "is not compiled shards: compile it with `graphattn compile` first, or give --schema and --tokenizer",
    )
    assert main(compile_argv(wikihop, "wikihop", tmp_path / "w")) == 0
    fails(
        ["train", "--data", str(tmp_path / "w"), wikihop, "--out", run, "--steps", "1"], "--data mixes compiled shards"
    )
    assert main(compile_argv(DATA / "article.txt", "etc-sentences", tmp_path / "plain")) == 0
    fails(
        ["train", "--data", str(tmp_path / "plain"), "--out", run, "--steps", "1", *TINY],
        "schema 'etc-sentences' declares no targets: the shards carry no task labels",
    )
    fails(
        ["train", "--data", str(tmp_path / "w"), "--out", run, "--steps", "1", "--targets", "answr", *TINY],
        "--targets 'answr' is not a target of schema 'wikihop' (answer)",
    )
    fails(
        ["evaluate", "--model", str(tmp_path / "nothing"), "--data", str(tmp_path / "w")],
        f"--model {tmp_path / 'nothing'}: no such directory",
    )
    fails(
        ["evaluate", "--model", str(tmp_path / "w"), "--data", str(tmp_path / "w")],
        "is the output of `graphattn compile`, not a training run",
    )
    (tmp_path / "empty").mkdir()
    fails(
        ["evaluate", "--model", str(tmp_path / "empty"), "--data", str(tmp_path / "w")],
        "no run.json here or in the parent directory",
    )
    fails(
        ["train", "--data", str(tmp_path / "w"), "--out", str(tmp_path / "w"), "--steps", "1", *TINY],
        "holds the output of `graphattn compile`",
    )
    assert main(["train", "--data", str(tmp_path / "w"), "--out", run, "--steps", "1", *TINY]) == 0
    assert main(compile_argv(sample("hotpotqa"), "hotpotqa", tmp_path / "h")) == 0
    capsys.readouterr()
    fails(
        ["evaluate", "--model", run, "--data", str(tmp_path / "h")],
        "the shards' schema 'hotpotqa' has no target 'answer' like the model's (choice)",
    )


def _weights(run: Path, step: int) -> dict:
    return torch.load(run / f"step-{step:08d}" / "trainer.pt", weights_only=True)["model"]


def test_ctrl_c_saves_a_checkpoint_prints_the_resume_command_exits_130_and_resume_is_exact(tmp_path):
    shards = tmp_path / "shards"
    assert main(compile_argv(sample("wikihop"), "wikihop", shards)) == 0
    args = [
        "--data",
        str(shards),
        "--steps",
        "12",
        *TINY,
        "--batch-size",
        "1",
        "--dropout",
        "0.1",
        "--checkpoint-every",
        "1",
    ]
    env = {**os.environ, "GRAPHATTN_TRAIN_THROTTLE": "0.4"}  # slow steps, so that SIGINT lands mid-run
    stopped = subprocess.Popen(
        ["graphattn", "train", *args, "--out", str(tmp_path / "a")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / "a" / "step-00000001" / "trainer.pt").is_file():  # training is under way
        assert stopped.poll() is None and time.monotonic() < deadline, stopped.communicate()
        time.sleep(0.05)
    stopped.send_signal(signal.SIGINT)
    _, err = stopped.communicate(timeout=120)
    assert stopped.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    found = re.search(
        r"graphattn train: interrupted \(Ctrl-C\) at step (\d+); checkpoint (\S+)\. Resume with:\n  (.+)\n", err
    )
    assert found, err
    step = int(found.group(1))
    assert 1 <= step < 12 and Path(found.group(2)) == tmp_path / "a" / f"step-{step:08d}"
    command = shlex.split(found.group(3))
    assert command[:2] == ["graphattn", "train"] and command[-1] == "--resume"
    resumed = subprocess.run(command, capture_output=True, text=True)  # the printed command, as printed
    assert resumed.returncode == 0 and "trained 12 steps" in resumed.stdout, resumed.stderr
    straight = graphattn("train", *args, "--out", str(tmp_path / "b"))
    assert straight.returncode == 0, straight.stderr
    a, b = _weights(tmp_path / "a", 12), _weights(tmp_path / "b", 12)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
