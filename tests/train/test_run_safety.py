"""A run directory is never clobbered or lost, and nothing read back from it is trusted unchecked:
through the installed `graphattn` command, as a user (or a batch scheduler) drives it.

Run directories reused (refused, --overwrite, --resume with changed settings or nothing to
resume), two trains and two compiles on one directory, SIGTERM mid-run then an exact resume, a
full disk (a small tmpfs) during a checkpoint, flipped bits, a code-carrying pickle, damaged
run.json / trainer.pt / RNG files, and the argument checks that answer before torch loads."""

from __future__ import annotations

import json
import os
import pickle
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from graphattn.train import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
TOKENIZER = str(DATA / "tokenizer.json")
TINY = ["--hidden-size", "32", "--layers", "1", "--heads", "2", "--batch-size", "1", "--lr", "1e-3"]
TINY += ["--precision", "fp32", "--no-progress"]


def graphattn(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(["graphattn", *map(str, argv)], capture_output=True, text=True, env=env)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def fails(done: subprocess.CompletedProcess, *phrases: str) -> str:
    """Exit 2 with one line that holds every phrase."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for phrase in phrases:
        assert phrase in lines[0], (phrase, lines[0])
    return lines[0]


def start(*argv: str, throttle: float = 0.4, compile_throttle: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, "GRAPHATTN_TRAIN_THROTTLE": str(throttle), "GRAPHATTN_COMPILE_THROTTLE": str(compile_throttle)}
    return subprocess.Popen(
        ["graphattn", *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def wait_for(path: Path, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shards") / "wikihop"
    done = graphattn(
        "compile", DATA / "wikihop_sample.json", "--schema", "wikihop", "--tokenizer", TOKENIZER, "--out", out, "-q"
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def trained(shards, tmp_path_factory) -> Path:
    """A finished 4-step run with checkpoints at steps 2 and 4, logged every 2 steps."""
    run = tmp_path_factory.mktemp("runs") / "base"
    done = graphattn(
        "train", "--data", shards, "--out", run, "--steps", 4, "--checkpoint-every", 2, "--log-every", 2, *TINY
    )
    assert done.returncode == 0, done.stderr
    return run


@pytest.fixture
def run_copy(trained, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def weights(run: Path, step: int) -> dict:
    return torch.load(run / f"step-{step:08d}" / "trainer.pt", weights_only=True)["model"]


# -- run directories ---------------------------------------------------------------------------------
def test_a_run_directory_is_refused_overwritten_only_when_asked_and_resumed_only_as_it_was(shards, run_copy):
    before = (run_copy / "step-00000004" / "trainer.pt").read_bytes()
    again = graphattn("train", "--data", shards, "--out", run_copy, "--steps", 2, *TINY)
    fails(again, str(run_copy), "already holds a training run (checkpoint step-00000004)", "--resume", "--overwrite")
    assert (run_copy / "step-00000004" / "trainer.pt").read_bytes() == before
    assert (run_copy / "latest").read_text().strip() == "step-00000004"

    changed = graphattn(
        "train",
        "--data",
        shards,
        "--out",
        run_copy,
        "--steps",
        6,
        "--resume",
        *TINY,
        "--hidden-size",
        "64",
        "--seed",
        3,
    )
    line = fails(changed, "--resume refused", "--hidden-size was 32, now 64", "--seed was 0, now 3")
    assert "size mismatch" not in line

    (run_copy / "step-00000003.partial").mkdir()  # a save that a killed run never finished
    (run_copy / "step-00000003.partial" / "trainer.pt").write_bytes(b"half")
    longer = graphattn("train", "--data", shards, "--out", run_copy, "--steps", 6, "--resume", *TINY)
    assert longer.returncode == 0 and "trained 6 steps" in longer.stdout, longer.stderr
    assert not (run_copy / "step-00000003.partial").exists()

    replaced = graphattn("train", "--data", shards, "--out", run_copy, "--steps", 2, "--overwrite", *TINY)
    assert replaced.returncode == 0 and "trained 2 steps" in replaced.stdout, replaced.stderr
    assert sorted(p.name for p in run_copy.glob("step-*")) == ["step-00000002"]
    assert [json.loads(line)["step"] for line in (run_copy / "log.jsonl").read_text().splitlines()] == [2]


def test_resume_with_nothing_to_resume_says_so(shards, tmp_path):
    fails(
        graphattn("train", "--data", shards, "--out", tmp_path / "fresh", "--steps", 2, "--resume", *TINY),
        "--resume: nothing to resume here (no checkpoint); run without --resume to start",
    )
    assert not (tmp_path / "fresh" / "run.json").exists()
    fails(
        graphattn("train", "--data", shards, "--out", shards, "--steps", 2, *TINY),
        "holds the output of `graphattn compile`",
    )


def test_two_trains_on_one_directory(shards, tmp_path):
    out = tmp_path / "run"
    # 2 s a step: the two commands below start (seconds on a loaded machine) while the first still runs
    first = start("train", "--data", shards, "--out", out, "--steps", 6, "--checkpoint-every", 2, *TINY, throttle=2.0)
    wait_for(out / "run.json", first)
    second = graphattn("train", "--data", shards, "--out", out, "--steps", 2, "--resume", *TINY)
    fails(second, str(out), f"another command is using this directory (graphattn train, pid {first.pid})")
    third = graphattn("train", "--data", shards, "--out", out, "--steps", 2, "--overwrite", *TINY)
    fails(third, f"pid {first.pid}")
    _, err = first.communicate(timeout=180)
    assert first.returncode == 0, err
    assert (out / "latest").read_text().strip() == "step-00000006"


def test_a_killed_run_leaves_no_lock_behind(shards, tmp_path):
    out = tmp_path / "run"
    first = start("train", "--data", shards, "--out", out, "--steps", 50, *TINY)
    wait_for(out / "run.json", first)
    first.kill()  # SIGKILL: no handler runs; the kernel drops the flock with the process
    first.wait()
    assert (out / ".graphattn.lock").exists()
    fails(graphattn("train", "--data", shards, "--out", out, "--steps", 2, "--resume", *TINY), "nothing to resume")
    again = graphattn("train", "--data", shards, "--out", out, "--steps", 2, "--overwrite", *TINY)
    assert again.returncode == 0 and "trained 2 steps" in again.stdout, again.stderr


def test_two_compiles_on_one_directory_and_only_stale_temporaries_removed(tmp_path):
    out = tmp_path / "shards"
    argv = ["compile", DATA / "hotpotqa_sample.json", "--schema", "hotpotqa", "--tokenizer", TOKENIZER]
    argv += ["--out", out, "--shard-size", "1", "-q"]
    first = start(*argv, compile_throttle=4.0)
    wait_for(out / "shard-00000.done.json", first)
    busy = out / f"shard-00099.parquet.tmp-{first.pid}"  # what the running compile is writing
    busy.write_bytes(b"half a shard")
    for extra in ([], ["--resume"]):
        second = graphattn(*argv, *extra)
        fails(second, str(out), f"graphattn compile, pid {first.pid}")
        assert busy.read_bytes() == b"half a shard"
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = out / f"shard-00098.parquet.tmp-{dead.pid}"  # a killed run's half-written file
    stale.write_bytes(b"junk")
    busy.write_bytes(b"still being written")  # its writer's pid is gone now too: both are stale
    mine = out / f"shard-00097.parquet.tmp-{os.getpid()}"  # a live writer's (this test's pid)
    mine.write_bytes(b"live")
    resumed = graphattn(*argv, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert not stale.exists() and not busy.exists() and mine.read_bytes() == b"live"


# -- signals -------------------------------------------------------------------------------------------
def test_sigterm_saves_like_ctrl_c_and_the_resume_is_bit_exact(shards, tmp_path):
    args = ["--data", shards, "--steps", 10, *TINY, "--dropout", "0.1", "--log-every", 1]
    stopped = start("train", *args, "--out", tmp_path / "a", throttle=0.4)
    wait_for(tmp_path / "a" / "log.jsonl", stopped)
    while not (tmp_path / "a" / "log.jsonl").read_text().strip():
        time.sleep(0.05)
    stopped.send_signal(signal.SIGTERM)
    _, err = stopped.communicate(timeout=120)
    assert stopped.returncode == 143, err
    found = re.search(r"interrupted \(SIGTERM\) at step (\d+); checkpoint (\S+)\. Resume with:\n  (.+)\n", err)
    assert found and "Traceback" not in err, err
    step = int(found.group(1))
    assert 1 <= step < 10 and Path(found.group(2)) == tmp_path / "a" / f"step-{step:08d}"
    assert (tmp_path / "a" / "latest").read_text().strip() == f"step-{step:08d}"
    resumed = subprocess.run(shlex.split(found.group(3)), capture_output=True, text=True)
    assert resumed.returncode == 0 and "trained 10 steps" in resumed.stdout, resumed.stderr
    straight = graphattn("train", *args, "--out", tmp_path / "b")
    assert straight.returncode == 0, straight.stderr
    a, b = weights(tmp_path / "a", 10), weights(tmp_path / "b", 10)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    logged = [json.loads(line) for line in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(1, 11))  # one history: nothing logged twice
    straight_log = [json.loads(line) for line in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in logged] == [r["loss"] for r in straight_log]


# -- a full disk ---------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 6 MB tmpfs (root only; skipped with the reason where mounting is not permitted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount failed'}): needs root in a "
            "container that allows mounts"
        )
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_during_a_checkpoint_is_one_line_and_the_previous_checkpoint_survives(shards, small_disk):
    out = small_disk / "run"
    train = start("train", "--data", shards, "--out", out, "--steps", 40, "--checkpoint-every", 2, *TINY, throttle=0.5)
    wait_for(out / "step-00000002" / "digest.json", train)
    free = shutil.disk_usage(small_disk).free
    (small_disk / "filler").write_bytes(b"\0" * (free - 200_000))  # leaves less than a checkpoint needs
    _, err = train.communicate(timeout=180)
    assert train.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    found = re.search(
        r"disk full while saving checkpoint step-(\d{8}): it needs about ([\d.]+) MB, ([\d.]+) MB is free", err
    )
    assert found, err
    assert float(found.group(2)) > float(found.group(3))
    assert "the previous checkpoint step-00000002 is intact and `latest` names it" in err
    assert not list(out.glob("*.partial")) and not list(out.glob("**/*.tmp"))
    assert (out / "latest").read_text().strip() == "step-00000002"
    (small_disk / "filler").unlink()
    again = graphattn("train", "--data", shards, "--out", out, "--steps", 4, "--resume", *TINY)
    assert again.returncode == 0 and "trained 4 steps" in again.stdout, again.stderr


def test_a_write_that_fails_half_way_removes_the_partial_checkpoint(small_disk, monkeypatch):
    """The kernel's own ENOSPC in the middle of trainer.pt (torch reports it as 'unexpected pos'),
    reached by skipping the free-space check that would refuse the save before it starts."""
    from graphattn.train.loop import TrainConfig, Trainer

    model = torch.nn.Linear(800, 800)  # 2.6 MB of weights; AdamW's state triples what a save writes
    root = small_disk / "ck"
    trainer = Trainer(model, TrainConfig(max_steps=2, checkpoint_dir=str(root), precision="fp32"))
    trainer.step = 1
    trainer.save_checkpoint()  # fits: weights, no optimizer state yet
    model(torch.ones(1, 800)).sum().backward()
    trainer.optimizer.step()
    trainer.step = 2
    monkeypatch.setattr(ckpt, "check_room", lambda root, step, needed: None)
    with pytest.raises(ckpt.CheckpointError, match=r"disk full while saving checkpoint step-00000002: it needs about"):
        trainer.save_checkpoint()
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000001"]
    assert ckpt.resolve_checkpoint(True, root) == root / "step-00000001"
    ckpt.load_file(root / "step-00000001" / "trainer.pt")  # intact: its digest still matches


# -- damaged and hostile files -----------------------------------------------------------------------
def flip_a_bit_in_the_largest_weight(run: Path, step: int) -> str:
    path = run / f"step-{step:08d}" / "trainer.pt"
    model = torch.load(path, weights_only=True)["model"]
    name = max(model, key=lambda k: model[k].numel())
    raw = bytearray(path.read_bytes())
    at = bytes(raw).find(model[name].numpy().tobytes())
    assert at > 0
    raw[at + 101] ^= 0x04
    path.write_bytes(bytes(raw))
    return name


def rewrite(run: Path, step: int, name: str, obj) -> None:
    """Replace a checkpoint file and re-record the digest, as a tamperer who knows the format would."""
    directory = run / f"step-{step:08d}"
    torch.save(obj, directory / name)
    trainer_state = torch.load(directory / "trainer.pt", weights_only=True, mmap=True) if name != "trainer.pt" else obj
    ckpt.write_digest(directory, trainer_state if isinstance(trainer_state, dict) else {})


def trained_file(run_copy: Path) -> Path:
    return run_copy.parent.parent / "pristine-trainer.pt"


def test_a_flipped_bit_is_refused_naming_the_file_and_the_tensor(shards, run_copy):
    shutil.copy(run_copy / "step-00000004" / "trainer.pt", trained_file(run_copy))
    name = flip_a_bit_in_the_largest_weight(run_copy, 4)
    where = run_copy / "step-00000004" / "trainer.pt"
    fails(
        graphattn("evaluate", "--model", run_copy, "--data", shards),
        str(where),
        "damaged: its sha256 differs from the one recorded when it was saved",
        f"(tensor 'model/{name}' changed)",
    )
    fails(graphattn("train", "--data", shards, "--out", run_copy, "--steps", 6, "--resume", *TINY), str(where))
    shutil.copy(trained_file(run_copy), where)  # the weights as saved; now the random state is hit
    rng = run_copy / "step-00000004" / "rng-rank0.pt"
    raw = bytearray(rng.read_bytes())
    raw[len(raw) // 2] ^= 1
    rng.write_bytes(bytes(raw))
    fails(
        graphattn("train", "--data", shards, "--out", run_copy, "--steps", 6, "--resume", *TINY),
        f"{rng}: damaged: its sha256 differs",
    )


def test_a_damaged_digest_or_a_latest_pointing_elsewhere(shards, run_copy):
    (run_copy / "latest").write_text("../../etc\n")  # not a checkpoint name: the newest complete one is used
    digest = run_copy / "step-00000004" / "digest.json"
    digest.write_text(digest.read_text()[:-40])
    fails(
        graphattn("evaluate", "--model", run_copy, "--data", shards),
        f"{digest}: digest.json is damaged",
    )
    digest.unlink()  # as an older graphattn left it: never a silent step back to step 2
    fails(
        graphattn("evaluate", "--model", run_copy, "--data", shards),
        "checkpoint step-00000004 has no digest.json",
        "--trust-undigested",
        "to use step-00000002",
    )


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch /tmp/graphattn-pickle-ran",))


@pytest.mark.parametrize("form", ["torch zip", "bare pickle"])
def test_a_code_carrying_pickle_is_refused_without_suggesting_weights_only_false(shards, run_copy, form):
    marker = Path("/tmp/graphattn-pickle-ran")
    marker.unlink(missing_ok=True)
    directory = run_copy / "step-00000004"
    state = torch.load(directory / "trainer.pt", weights_only=True)
    hostile = {**state, "model": _RunsCode()}
    if form == "torch zip":
        torch.save(hostile, directory / "trainer.pt")
    else:
        (directory / "trainer.pt").write_bytes(pickle.dumps(hostile))
    ckpt.write_digest(directory, state)  # the digest says the file is as written
    for done in (
        graphattn("evaluate", "--model", run_copy, "--data", shards),
        graphattn("train", "--data", shards, "--out", run_copy, "--steps", 6, "--resume", *TINY),
    ):
        line = fails(done, str(directory / "trainer.pt"), "refused: the file holds Python objects other than tensors")
        assert "weights_only" not in line and "UnpicklingError" not in line
    assert not marker.exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 1048576}, "$.encoder.hidden_size: expected an integer in [1, 16,384], found 1048576"),
        ({"num_hidden_layers": "three"}, "$.encoder.num_hidden_layers: expected an integer in [1, 256], found 'three'"),
        ({"vocab_size": 4_000_000, "hidden_size": 16_384}, "would hold about"),
        ({"hidden_size": 64, "intermediate_size": 256}, "does not fit the model run.json describes"),
        ({"relative_bias": "yes"}, "$.encoder.relative_bias: expected true or false, found 'yes'"),
    ],
)
def test_run_json_sizes_are_bounded_and_checked_against_the_tensors_before_allocation(
    shards, run_copy, change, message
):
    run_file = run_copy / "run.json"
    run = json.loads(run_file.read_text())
    run["encoder"].update(change)
    run_file.write_text(json.dumps(run))
    started = time.monotonic()
    done = graphattn("evaluate", "--model", run_copy, "--data", shards)
    line = fails(done, message)
    assert "size mismatch" not in line
    assert time.monotonic() - started < 30  # nothing of gigabytes was allocated or initialised


@pytest.mark.parametrize(
    "tamper, message",
    [
        (lambda s: {**s, "step": "three"}, "'step' must be a non-negative integer, found 'three'"),
        (lambda s: [s["model"]], "expected a dict of trainer state, found list"),
        (lambda s: {**s, "model": {**s["model"], "x": 3}}, "'model' must be a dict of tensors"),
        (
            lambda s: {**s, "model": {k: (v.fill_(float("nan")) if v.ndim == 2 else v) for k, v in s["model"].items()}},
            "non-finite value(s) (NaN or inf)",
        ),
    ],
)
def test_a_trainer_state_that_is_not_what_train_writes_is_one_line(shards, run_copy, tamper, message):
    state = torch.load(run_copy / "step-00000004" / "trainer.pt", weights_only=True)
    rewrite(run_copy, 4, "trainer.pt", tamper(state))
    fails(graphattn("evaluate", "--model", run_copy, "--data", shards), str(run_copy / "step-00000004"), message)
    fails(graphattn("train", "--data", shards, "--out", run_copy, "--steps", 6, "--resume", *TINY), message)


@pytest.mark.parametrize(
    "tamper, message",
    [
        (
            lambda r: {**r, "now": {**r["now"], "torch": torch.zeros(7, dtype=torch.uint8)}},
            "now: the random state is damaged",
        ),
        (lambda r: {**r, "epoch_start": "x"}, "epoch_start: expected the python, numpy and torch generator states"),
        (lambda r: [1, 2], "not a random-state file"),
        (lambda r: {**r, "now": {**r["now"], "cuda": "x"}}, "cuda: expected a list of uint8 tensors"),
    ],
)
def test_a_damaged_random_state_is_one_line(shards, run_copy, tamper, message):
    rng = torch.load(run_copy / "step-00000004" / "rng-rank0.pt", weights_only=True)
    rewrite(run_copy, 4, "rng-rank0.pt", tamper(rng))
    fails(
        graphattn("train", "--data", shards, "--out", run_copy, "--steps", 6, "--resume", *TINY),
        str(run_copy / "step-00000004" / "rng-rank0.pt"),
        message,
    )


# -- arguments, checked before torch loads -------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--batch-size", "0"], "argument --batch-size: must be in [1, 65,536], got 0"),
        (["--hidden-size", "1000000"], "argument --hidden-size: must be in [2, 16,384], got 1000000"),
        (["--steps", "0"], "argument --steps: must be in [1, 1,000,000,000], got 0"),
        (["--lr", "0"], "argument --lr: must be in (0.0, 10.0], got 0"),
        (["--heads", "3"], "--hidden-size 32 is not divisible by --heads 3"),
        (["--eval-data", "nowhere/"], "--eval-data nowhere/: no such file or directory"),
        (["--resume", "--overwrite"], "not allowed with argument"),
    ],
)
def test_argument_errors_answer_before_torch_loads(shards, tmp_path, extra, message):
    argv = ["train", "--data", shards, "--out", tmp_path / "r", "--steps", "1", *TINY, *extra]
    started = time.monotonic()
    done = graphattn(*argv)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert time.monotonic() - started < 5  # about 0.2 s idle; torch alone takes several seconds to import
    assert not (tmp_path / "r" / "run.json").exists()


def test_eval_data_without_the_targets_is_refused_before_training(shards, tmp_path):
    other = tmp_path / "hotpot"
    done = graphattn(
        "compile", DATA / "hotpotqa_sample.json", "--schema", "hotpotqa", "--tokenizer", TOKENIZER, "--out", other, "-q"
    )
    assert done.returncode == 0, done.stderr
    fails(
        graphattn("train", "--data", shards, "--out", tmp_path / "r", "--steps", "1", *TINY, "--eval-data", other),
        "--eval-data: the --eval-data shards' schema 'hotpotqa' has no target 'answer' like the model's (choice)",
        "supporting (global_labels)",
    )
    assert not list((tmp_path / "r").glob("step-*"))


def test_help_answers_in_under_a_second():
    for command in ("train", "evaluate", "plot", "compile"):
        started = time.monotonic()
        done = graphattn(command, "--help")
        assert done.returncode == 0 and "usage: graphattn" in done.stdout
        assert time.monotonic() - started < 2.0, command  # 0.1-0.25 s measured; slack for a loaded machine


def test_evaluate_on_cuda_without_a_gpu_says_so(trained, shards):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    fails(
        graphattn("evaluate", "--model", trained, "--data", shards, "--device", "cuda"),
        "--device cuda: no CUDA device is available here",
        "use --device cpu",
    )
