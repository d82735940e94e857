"""DDP on 2 CPU processes (gloo) equals one process with the combined batch.

The comparison uses SGD with momentum: its update is linear in the gradient, so the parameters
agree to fp32 rounding. (Adam's g / sqrt(v) turns summation-order rounding in near-zero
gradients, ~1e-8, into learning-rate-sized differences, which says nothing about DDP.)

One spawn runs every distributed scenario (process start-up is the expensive part):
  * batches of 2 per rank vs batches of 4 in one process, 3 AdamW steps;
  * batches of 1 per rank with 2 accumulation steps (DDP's no_sync path) vs the same;
  * ranks with unequal shares of the data end each epoch together instead of hanging;
  * a checkpoint written by both ranks (one random-state file each).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_cases import instances, task_targets, tiny_config  # noqa: E402

from graphattn.compile import collate  # noqa: E402
from graphattn.nn import EtcEncoder  # noqa: E402
from graphattn.train import (  # noqa: E402
    InstanceLoader,
    TaskModel,
    TrainConfig,
    Trainer,
    cleanup_distributed,
    init_distributed,
)

STEPS = 3
SCENARIOS = {"plain": dict(batch_size=2, accumulation=1), "accumulate": dict(batch_size=1, accumulation=2)}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_model() -> TaskModel:
    torch.manual_seed(0)
    return TaskModel(EtcEncoder(tiny_config()), task_targets("wikihop"))


def config(accumulation: int, **changes) -> TrainConfig:
    settings = dict(
        max_steps=STEPS,
        learning_rate=0.5,
        gradient_accumulation_steps=accumulation,
        log_every=1,
        progress=False,
        precision="fp32",
        device="cpu",
    )
    return TrainConfig(**{**settings, **changes})


def run(batch_size: int, accumulation: int, world_size: int, rank: int, **changes) -> tuple[dict, list]:
    data = InstanceLoader(instances(8), batch_size, collate, shuffle=True, seed=3, rank=rank, world_size=world_size)
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    result = Trainer(model, config(accumulation, **changes), optimizer=sgd).fit(data)
    return model.state_dict(), result.history


def _worker(rank: int, world_size: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    init_distributed("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        results = {}
        for name, scenario in SCENARIOS.items():
            state, history = run(
                scenario["batch_size"],
                scenario["accumulation"],
                world_size,
                rank,
                **({"checkpoint_dir": str(Path(out) / "ckpt")} if name == "plain" else {}),
            )
            if rank == 0:
                torch.save(state, Path(out) / f"{name}.pt")
            results[name] = history
        # Unequal shares: rank 0 has 3 batches per epoch, rank 1 has 2; 4 steps = 2 epochs of 2.
        batch = collate(instances(2))
        uneven = [batch] * (3 if rank == 0 else 2)
        history = Trainer(make_model(), config(1, max_steps=4)).fit(uneven).history
        results["uneven_epochs"] = [r["epoch"] for r in history]
        Path(out, f"history-{rank}.json").write_text(json.dumps(results))
    finally:
        cleanup_distributed()


def spawn(world_size: int, out: Path, timeout: float = 240.0) -> None:
    """Start the ranks and wait, failing (not hanging) if they deadlock."""
    context = mp.start_processes(
        _worker, args=(world_size, str(out / "init"), str(out)), nprocs=world_size, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.terminate()
            pytest.fail(f"DDP workers did not finish within {timeout:.0f} s")


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    spawn(2, out)
    return out


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_ranks_equal_one_process_with_the_combined_batch(ddp_run, name) -> None:
    torch.set_num_threads(1)
    scenario = SCENARIOS[name]
    single_state, single_history = run(scenario["batch_size"] * 2, scenario["accumulation"], world_size=1, rank=0)
    ddp_state = torch.load(ddp_run / f"{name}.pt", weights_only=True)
    initial = make_model().state_dict()
    moved = [n for n in single_state if not torch.equal(single_state[n], initial[n])]
    assert len(moved) > len(single_state) // 2  # the comparison is not between untouched weights
    for key in single_state:
        torch.testing.assert_close(ddp_state[key], single_state[key], rtol=1e-5, atol=1e-6, msg=key)
    ddp_history = json.loads((ddp_run / "history-0.json").read_text())[name]
    assert [r["loss"] for r in ddp_history] == pytest.approx([r["loss"] for r in single_history], rel=1e-5)


def test_ranks_with_unequal_data_end_epochs_together(ddp_run) -> None:
    epochs = [json.loads((ddp_run / f"history-{rank}.json").read_text())["uneven_epochs"] for rank in range(2)]
    assert epochs[0] == epochs[1] == [0, 0, 1, 1]  # rank 0's third batch is dropped each epoch


def test_every_rank_saves_its_random_state(ddp_run) -> None:
    checkpoint = ddp_run / "ckpt" / f"step-{STEPS:08d}"
    assert sorted(p.name for p in checkpoint.iterdir()) == ["digest.json", "rng-rank0.pt", "rng-rank1.pt", "trainer.pt"]
    state = torch.load(checkpoint / "trainer.pt", weights_only=True)
    assert state["world_size"] == 2 and state["step"] == STEPS
