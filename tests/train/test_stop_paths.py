"""What the loop does when its data ends after a stop was asked for (DataLoader workers that exited
with the signal: "DataLoader worker ... exited unexpectedly"): the run ends at the step it reached,
saved when no batch of the next step was consumed, and named as not saved when one was; without a
stop the same error is the data's failure and goes through."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from graphattn.train import TrainConfig, Trainer, TrainingInterrupted
from graphattn.train import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _DyingData:
    """Batches of a linear model's input; at batch `dies_at` (counted from 0) the process gets
    SIGTERM (when `signalled`), as the whole group would, and the iterator raises torch's
    worker-death error, as a worker killed by that signal makes it."""

    def __init__(self, dies_at: int, signalled: bool = True):
        self.dies_at, self.signalled = dies_at, signalled

    def __iter__(self):
        for index in range(100):
            if index == self.dies_at:
                if self.signalled:
                    os.kill(os.getpid(), signal.SIGTERM)
                raise RuntimeError("DataLoader worker (pid(s) 12345) exited unexpectedly")
            yield torch.full((2, 3), float(index))


def _fit(tmp_path, dies_at: int, accumulate: int = 1, signalled: bool = True):
    model = torch.nn.Linear(3, 1)
    config = TrainConfig(
        max_steps=10,
        checkpoint_dir=str(tmp_path / "run"),
        gradient_accumulation_steps=accumulate,
        precision="fp32",
        progress=False,
        log_every=1,
    )
    loss = lambda m, x: m(x).pow(2).mean()  # noqa: E731
    return Trainer(model, config, loss_fn=loss).fit(_DyingData(dies_at, signalled))


def test_data_that_ends_after_a_stop_at_a_step_boundary_saves_that_step(tmp_path):
    with pytest.raises(TrainingInterrupted) as stop:
        _fit(tmp_path, dies_at=2)  # step 3's first batch never comes
    assert stop.value.step == 2 and stop.value.signal == signal.SIGTERM and not stop.value.unsaved
    assert stop.value.checkpoint == tmp_path / "run" / "step-00000002"
    assert ckpt.load_file(stop.value.checkpoint / "trainer.pt")["batch_in_epoch"] == 2


def test_data_that_ends_half_way_through_a_step_is_named_not_saved(tmp_path):
    with pytest.raises(TrainingInterrupted) as stop:
        _fit(tmp_path, dies_at=5, accumulate=2)  # step 3 has taken batch 4 when batch 5 fails
    assert stop.value.step == 2 and stop.value.unsaved and stop.value.checkpoint is None
    assert not (tmp_path / "run" / "step-00000003").exists()


def test_without_a_stop_the_data_failure_goes_through(tmp_path):
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        _fit(tmp_path, dies_at=2, signalled=False)
