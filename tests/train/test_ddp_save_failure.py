"""Under DDP, a failure on any rank while a checkpoint is saved (the disk check, a file, the
publish) ends the save on every rank with the same one-line error, at once: no rank is left at a
barrier until the launcher's timeout. 2 CPU ranks (gloo) under torch.multiprocessing, the failure
injected on rank 0 and on rank 1; the parent gives up after a deadline, so a hang fails the test."""

from __future__ import annotations

import errno
import json
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from graphattn.errors import GraphattnError
from graphattn.train import TrainConfig, Trainer, cleanup_distributed, init_distributed
from graphattn.train import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DEADLINE = 180  # seconds for the whole spawn; the saves take well under one


def _fail(exc: BaseException):
    def raiser(*args, **kwargs):
        raise exc

    return raiser


# (name, failing rank, checkpoint function replaced on that rank, what it raises)
SCENARIOS = [
    ("disk check", 0, "_free_bytes", None),
    ("trainer file", 0, "save_trainer_file", OSError(errno.EIO, "Input/output error")),
    ("publish", 0, "publish", OSError(errno.EACCES, "Permission denied")),
    ("random state", 1, "save_file", OSError(errno.EIO, "Input/output error")),
]


def _worker(rank: int, world_size: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    init_distributed("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    results = {}
    try:
        for name, failing, attribute, exc in SCENARIOS:
            root = Path(out) / name.replace(" ", "-")
            trainer = Trainer(
                torch.nn.Linear(4, 4),
                TrainConfig(max_steps=1, checkpoint_dir=str(root), precision="fp32", device="cpu", progress=False),
            )
            trainer.step = 1
            original = getattr(ckpt, attribute)
            if rank == failing:
                setattr(ckpt, attribute, (lambda directory: 0) if exc is None else _fail(exc))
            try:
                trainer.save_checkpoint()
                results[name] = None
            except GraphattnError as err:
                results[name] = {"type": type(err).__name__, "message": str(err)}
            finally:
                setattr(ckpt, attribute, original)
        torch.distributed.barrier()  # every rank still answers: nothing is left half-way
        last = Trainer(
            torch.nn.Linear(4, 4),
            TrainConfig(max_steps=1, checkpoint_dir=str(Path(out) / "after"), precision="fp32", progress=False),
        )
        last.step = 1
        results["after"] = str(last.save_checkpoint())
    finally:
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(results))
        cleanup_distributed()


@pytest.mark.slow  # two processes start torch (~10-20 s on 2 loaded cores)
def test_a_failure_on_any_rank_during_a_save_ends_it_on_every_rank_with_the_same_line(tmp_path):
    context = mp.start_processes(
        _worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + DEADLINE
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the ranks did not finish within {DEADLINE} s: a save failure left a rank waiting")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for name, _failing, _, _ in SCENARIOS:
        zero, one = ranks[0][name], ranks[1][name]
        assert zero is not None and zero == one, (name, zero, one)
        assert zero["type"] == "CheckpointError" and "\n" not in zero["message"], zero
        root = tmp_path / name.replace(" ", "-")
        assert not list(root.glob("*.partial")) and not list(root.glob("step-*")), name
    assert "disk full while saving checkpoint step-00000001" in ranks[0]["disk check"]["message"]
    assert "cannot write checkpoint step-00000001: Input/output error" in ranks[0]["trainer file"]["message"]
    assert "cannot write checkpoint step-00000001: Permission denied" in ranks[0]["publish"]["message"]
    assert "cannot write checkpoint step-00000001: Input/output error" in ranks[1]["random state"]["message"]
    assert ranks[0]["after"] == ranks[1]["after"] == str(tmp_path / "after" / "step-00000001")
    assert (tmp_path / "after" / "step-00000001" / "rng-rank1.pt").is_file()
