"""Fine-tuning starts from a converted ETC checkpoint: `graphattn train --init-from DIR` with an
etcmodel checkpoint directory (tests/fixtures/etc/finetune_tiny, made by etcmodel), its report,
new relative rows for the schema's labels, falling loss, and `graphattn evaluate` on the run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[2]
CHECKPOINT = REPO / "tests" / "fixtures" / "etc" / "finetune_tiny"
SAMPLE = REPO / "examples" / "data" / "hotpotqa_sample.json"
TOKENIZER = str(REPO / "examples" / "data" / "tokenizer.json")  # the shipped 3,000 ids the checkpoint has


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("etc_init") / "shards"
    argv = ["compile", str(SAMPLE), "--schema", "hotpotqa", "--tokenizer", TOKENIZER, "--out", str(out), "--quiet"]
    done = subprocess.run(["graphattn", *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


def test_train_from_an_etc_checkpoint_then_evaluate(shards, tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--data", str(shards), "--out", str(run), "--steps", "2", "--init-from", str(CHECKPOINT)]
    argv += ["--batch-size", "2", "--precision", "fp32", "--no-progress"]
    trained = subprocess.run(["graphattn", *argv], capture_output=True, text=True)
    assert trained.returncode == 0, trained.stderr
    assert f"etcmodel from {CHECKPOINT}" in trained.stdout
    assert "layer.*.attention.global_relative_key_table: rows 28..31 new (the schema has 32 relative labels)" in (
        trained.stdout
    )
    assert "cls/predictions/output_bias: pre-training head" in trained.stdout
    assert "trained 2 steps" in trained.stdout
    evaluated = subprocess.run(
        ["graphattn", "evaluate", "--model", str(run), "--data", str(shards)], capture_output=True, text=True
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert evaluated.stdout.startswith(f"evaluated {run / 'step-00000002'} (step 2)")


def test_a_schema_with_another_distance_clipping_is_refused(tmp_path):
    (tmp_path / "doc.txt").write_text((REPO / "examples" / "data" / "corpus.txt").read_text()[:2000])
    out = tmp_path / "shards"
    argv = ["compile", str(tmp_path / "doc.txt"), "--schema", "etc-sentences-42relmaxdist", "--out", str(out), "-q"]
    done = subprocess.run(["graphattn", *argv, "--tokenizer", TOKENIZER], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    argv = ["train", "--data", str(out), "--out", str(tmp_path / "run"), "--steps", "1", "--init-from", str(CHECKPOINT)]
    done = subprocess.run(["graphattn", *argv, "--no-progress"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "etc_config.json" in done.stderr and "clips relative distances at 42" in done.stderr
    assert "relative_pos_max_distance=12" in done.stderr and "'etc-sentences'" in done.stderr


def test_fine_tuning_from_the_checkpoint_lowers_the_loss(shards, tmp_path):
    from graphattn.train.finetune import fine_tune

    result = fine_tune(
        shards,
        tmp_path / "run",
        steps=40,
        batch_size=2,
        learning_rate=2e-3,
        warmup_ratio=0.0,
        precision="fp32",
        init_from=str(CHECKPOINT),
        dropout=0.0,
        progress=False,
        print_fn=None,
        log_every=1,
    )
    losses = [record["loss"] for record in result.history]
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.7 * first, losses
