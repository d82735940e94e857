"""A checkpoint without digest.json (written by a graphattn from before checkpoint digests, or its
digest removed) is named as such by `evaluate`, `train --resume` and `train`, with the way out
(--trust-undigested, or setting it aside for the previous checkpoint); following any message
leads somewhere else than back to it, and nothing steps back to an older checkpoint silently.
Checkpoint digests are taken as the files are written, from the tensors' own memory."""

from __future__ import annotations

import hashlib
import json
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_run_safety import TINY, fails, graphattn, run_copy, shards, trained  # noqa: E402, F401

from graphattn.train import checkpoint as ckpt  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def digest_of(run: Path, step: int) -> dict:
    return json.loads((run / f"step-{step:08d}" / "digest.json").read_text())


@pytest.mark.slow  # seven graphattn commands (~30 s on 2 loaded cores)
def test_only_the_newest_without_a_digest_is_named_never_passed_over_and_trusted_only_when_asked(shards, run_copy):  # noqa: F811
    before = digest_of(run_copy, 4)
    (run_copy / "step-00000004" / "digest.json").unlink()
    newest = run_copy / "step-00000004"
    for done in (
        graphattn("evaluate", "--model", run_copy, "--data", shards),
        graphattn("evaluate", "--model", newest, "--data", shards),
        graphattn("train", "--data", shards, "--out", run_copy, "--steps", 6, "--resume", *TINY),
    ):
        line = fails(done, str(newest), "checkpoint step-00000004 has no digest.json", "--trust-undigested")
        assert "nothing to resume" not in line and "without --resume" not in line
    assert "to use step-00000002" in fails(graphattn("evaluate", "--model", run_copy, "--data", shards))
    fails(
        graphattn("train", "--data", shards, "--out", run_copy, "--steps", 6, *TINY),
        "already holds a training run (its newest checkpoint step-00000004 has no digest.json)",
        "pass --resume --trust-undigested",
    )
    assert not (newest / "digest.json").exists()

    trusted = graphattn("evaluate", "--model", run_copy, "--data", shards, "--trust-undigested")
    assert trusted.returncode == 0 and "(step 4)" in trusted.stdout, trusted.stderr
    assert digest_of(run_copy, 4) == before  # recorded from the files as they are: what the save recorded
    resumed = graphattn("train", "--data", shards, "--out", run_copy, "--steps", 6, "--resume", *TINY)
    assert resumed.returncode == 0 and "trained 6 steps" in resumed.stdout, resumed.stderr


@pytest.mark.slow  # three graphattn commands and a 4-step run (~30 s on 2 loaded cores)
def test_a_run_with_no_digest_at_all_resumes_with_the_flag_and_a_damaged_one_is_not_trusted(shards, run_copy):  # noqa: F811
    for step in (2, 4):
        (run_copy / f"step-{step:08d}" / "digest.json").unlink()
    line = fails(graphattn("evaluate", "--model", run_copy, "--data", shards), "step-00000004 has no digest.json")
    assert "to use step-" not in line  # no older checkpoint has a digest either
    trainer = run_copy / "step-00000004" / "trainer.pt"
    state = torch.load(trainer, weights_only=True)
    state["model"] = {**state["model"], "extra": torch.tensor([float("nan")])}
    torch.save(state, trainer)
    argv = ["train", "--data", shards, "--out", run_copy, "--steps", 6, "--resume", "--trust-undigested", *TINY]
    fails(graphattn(*argv), str(trainer), "non-finite value(s)")
    assert not (run_copy / "step-00000004" / "digest.json").exists()
    (run_copy / "step-00000004" / "rng-rank0.pt").unlink()
    torch.save({**state, "model": {k: v for k, v in state["model"].items() if k != "extra"}}, trainer)
    fails(graphattn(*argv), "missing rng-rank0.pt: the checkpoint is incomplete")
    assert not (run_copy / "step-00000004" / "digest.json").exists()


def test_a_run_stopped_before_its_first_checkpoint_points_to_overwrite_not_back_to_resume(shards, run_copy):  # noqa: F811
    for step in (2, 4):
        ckpt_dir = run_copy / f"step-{step:08d}"
        for path in ckpt_dir.iterdir():
            path.unlink()
        ckpt_dir.rmdir()
    plain = fails(graphattn("train", "--data", shards, "--out", run_copy, "--steps", 2, *TINY))
    assert "stopped before its first checkpoint" in plain and "--overwrite" in plain and "--resume" not in plain
    resume = fails(graphattn("train", "--data", shards, "--out", run_copy, "--steps", 2, "--resume", *TINY))
    assert "nothing to resume here" in resume and "--overwrite" in resume and "without --resume" not in resume


def test_digests_are_taken_as_the_file_is_written_without_copying_the_tensors(tmp_path):
    state = {
        "model": {
            "big": torch.randn(4096, 1024),  # 16 MB
            "strided": torch.randn(8, 6).t(),
            "half": torch.randn(7).bfloat16(),
            "flags": torch.tensor([True, False]),
            "empty": torch.zeros(0, 3),
        },
        "step": 3,
        "history": [{"loss": 1.0}],
    }
    path = tmp_path / "trainer.pt"
    entry, tensors = ckpt.save_trainer_file(state, path)
    assert entry == {"bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    copied = {
        f"model/{k}": hashlib.sha256(v.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        for k, v in state["model"].items()
    }
    assert tensors == copied
    ckpt.write_digest(tmp_path, files={"trainer.pt": entry}, tensors=tensors)
    assert ckpt.load_file(path)["step"] == 3  # the recorded digest is the file's

    tracemalloc.start()
    ckpt.tensor_digests(state)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20, peak  # hashed where the tensors lie: no bytes copy of the 16 MB tensor
