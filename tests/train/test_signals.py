"""A stop signal sent to the whole process group (a terminal's Ctrl-C, `scancel`, `docker stop`,
Kubernetes) while DataLoader workers read the shards: the trainer finishes its step, saves it,
exits 130 / 143 with its message and no traceback, and `--resume` continues bit for bit.

Each run is `graphattn train --workers 2` in a session of its own (start_new_session), signalled
with os.killpg, so the workers receive the signal exactly as the trainer does."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from graphattn.train import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
TOKENIZER = str(DATA / "tokenizer.json")
TINY = ["--hidden-size", "32", "--layers", "1", "--heads", "2", "--batch-size", "1", "--lr", "1e-3"]
TINY += ["--precision", "fp32", "--no-progress", "--dropout", "0.1", "--log-every", "1", "--workers", "2"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """12 instances (six copies of the 2-document sample): one epoch outlasts the run, so the
    workers are alive, mid-epoch, when the signal comes."""
    records = tmp_path_factory.mktemp("records")
    for copy in range(6):
        shutil.copy(DATA / "wikihop_sample.json", records / f"part{copy}.json")
    out = tmp_path_factory.mktemp("shards") / "wikihop"
    done = subprocess.run(
        ["graphattn", "compile", *sorted(records.iterdir()), "--schema", "wikihop", "--tokenizer", TOKENIZER]
        + ["--out", out, "-q"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return out


def weights(run: Path, step: int) -> dict:
    return torch.load(run / f"step-{step:08d}" / "trainer.pt", weights_only=True)["model"]


def logged_steps(run: Path) -> int:
    log = run / "log.jsonl"
    return len(log.read_text().splitlines()) if log.is_file() else 0


@pytest.mark.slow  # three runs of `graphattn train` each (~45 s on 2 loaded cores)
@pytest.mark.parametrize("signum, code, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_a_stop_signal_to_the_process_group_with_workers_saves_the_step_and_the_resume_is_exact(
    shards, tmp_path, signum, code, name
):
    args = ["train", "--data", shards, "--steps", 8, *TINY]
    env = {**os.environ, "GRAPHATTN_TRAIN_THROTTLE": "0.3"}
    run = tmp_path / "stopped"
    stopped = subprocess.Popen(
        ["graphattn", *map(str, args), "--out", run, "--checkpoint-every", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: the trainer and its DataLoader workers
    )
    deadline = time.monotonic() + 120
    while logged_steps(run) < 3:  # past the periodic save of step 2, the workers mid-epoch
        assert stopped.poll() is None and time.monotonic() < deadline, stopped.communicate()
        time.sleep(0.05)
    os.killpg(stopped.pid, signum)
    _, err = stopped.communicate(timeout=120)
    assert stopped.returncode == code, err
    assert "Traceback" not in err and "DataLoader worker" not in err, err
    found = re.search(
        rf"^graphattn train: interrupted \({name}\) at step (\d+); checkpoint (\S+)\. Resume with:\n  (.+)\n$", err
    )
    assert found, err
    step = int(found.group(1))
    assert 3 <= step < 8 and Path(found.group(2)) == run / f"step-{step:08d}"
    assert (run / "latest").read_text().strip() == f"step-{step:08d}"
    ckpt.load_file(run / f"step-{step:08d}" / "trainer.pt")  # complete: its digest matches
    assert not list(run.glob("*.partial"))

    resumed = subprocess.run(shlex.split(found.group(3)), capture_output=True, text=True)
    assert resumed.returncode == 0 and "trained 8 steps" in resumed.stdout, resumed.stderr
    straight = subprocess.run(["graphattn", *map(str, args), "--out", tmp_path / "straight"], capture_output=True)
    assert straight.returncode == 0, straight.stderr
    a, b = weights(run, 8), weights(tmp_path / "straight", 8)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = [json.loads(line)["loss"] for line in (run / "log.jsonl").read_text().splitlines()]
    straight_losses = [
        json.loads(line)["loss"] for line in (tmp_path / "straight" / "log.jsonl").read_text().splitlines()
    ]
    assert losses == straight_losses
