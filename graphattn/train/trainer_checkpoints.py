"""The checkpoint half of `graphattn.train.loop.Trainer`: save (every rank, through
`step-N.partial/`, a failure on any rank raised on all), load (each file checked against its
digest before use), and which checkpoint a resume names. A mixin, so that the loop module holds
the loop; it reads the Trainer's model, optimizer, scheduler, scaler, position and config."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphattn.train import checkpoint as ckpt
from graphattn.train.distributed import is_distributed, raise_together


class TrainerCheckpoints:
    """Checkpoint methods of Trainer (see graphattn.train.loop)."""

    def _resolve_resume(self, resume: str | bool) -> Path | None:
        """The checkpoint `resume` names. A checkpoint without digest.json is refused, or with
        trust_undigested checked and given its digest by rank 0 alone, the others waiting."""
        trust = self.config.trust_undigested
        if trust and is_distributed():
            failure = None
            if self.is_main:
                try:
                    ckpt.resolve_checkpoint(resume, self.config.checkpoint_dir, trust_undigested=True)
                except Exception as err:  # noqa: BLE001 - raised on every rank by raise_together
                    failure = err
            raise_together(failure)
            trust = False
        return ckpt.resolve_checkpoint(resume, self.config.checkpoint_dir, trust_undigested=trust)

    def save_checkpoint(self, root: str | Path | None = None) -> Path:
        """Save everything needed to continue exactly; every rank must call it (each saves its
        own random state). Returns the checkpoint directory. The files go to `step-N.partial/`,
        renamed to `step-N/` when complete (see `graphattn.train.checkpoint`); a full disk
        raises CheckpointError with the partial directory removed and the previous checkpoint
        and `latest` untouched. Under DDP, a failure on any rank (the disk check, a file, the
        digest, the publish) is raised on every rank, the same error, at the same point."""
        root = Path(root or self.config.checkpoint_dir or "checkpoints")
        final = root / ckpt.checkpoint_name(self.step)
        if self._saved_step == self.step and (final / ckpt.DIGEST_FILE).is_file():
            return final  # already saved at this step (a periodic save, then Ctrl-C)
        partial = ckpt.partial_dir(root, self.step)
        state = self._trainer_state() if self.is_main else None
        needed = ckpt.state_bytes(state) + (1 << 20) * self.world_size
        try:
            self._save_stage(root, final, needed, self._prepare_save, root, partial, needed)
            rng = {"now": ckpt.capture_rng(), "epoch_start": self._epoch_rng or ckpt.capture_rng()}
            self._save_stage(root, final, needed, ckpt.save_file, rng, partial / f"rng-rank{self.rank}.pt")
            self._save_stage(root, final, needed, self._finish_save, state, root, partial, final)
        except BaseException:
            if self.is_main:
                shutil.rmtree(partial, ignore_errors=True)
            raise
        self._saved_step = self.step
        return final

    def _save_stage(self, root: Path, final: Path, needed: int, work: Callable, *args: Any) -> None:
        """One stage of a save, run by every rank and ended together (graphattn.train.distributed
        .raise_together): an OSError or RuntimeError becomes the one-line CheckpointError (disk
        full, or what failed); any other error goes through as it is."""
        failure: BaseException | None = None
        try:
            work(*args)
        except Exception as err:  # noqa: BLE001 - each rank's failure is sent to all ranks, then raised
            failure = err
            if isinstance(err, (OSError, RuntimeError)):
                if ckpt._is_disk_full(err, root, needed):
                    failure = ckpt.disk_full_error(root, self.step, needed)
                else:
                    what = err.strerror if isinstance(err, OSError) and err.strerror else ckpt._first_line(err)
                    failure = ckpt.CheckpointError(f"cannot write checkpoint {final.name}: {what}", file=str(root))
        raise_together(failure)

    def _prepare_save(self, root: Path, partial: Path, needed: int) -> None:
        if self.is_main:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)
            ckpt.check_room(root, self.step, needed)
            partial.mkdir()

    def _finish_save(self, state: dict[str, Any] | None, root: Path, partial: Path, final: Path) -> None:
        """Rank 0: trainer.pt (hashed as it is written), digest.json, the rename, pruning."""
        if self.is_main:
            entry, tensors = ckpt.save_trainer_file(state, partial / ckpt.TRAINER_FILE)
            ckpt.write_digest(partial, files={ckpt.TRAINER_FILE: entry}, tensors=tensors)
            ckpt.publish(partial, final)
            ckpt.prune_checkpoints(root, self.config.keep_checkpoints)

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "world_size": self.world_size,
            "history": self.history,
            "config": self.config.to_dict(),
        }

    def _load_scheduler(self, saved: dict[str, Any]) -> None:
        """The saved position, with this run's schedule: resuming with a larger max_steps
        stretches the decay to the new end instead of sitting at learning rate 0."""
        current = [copy.deepcopy(fn) for fn in self.scheduler.lr_lambdas]
        self.scheduler.load_state_dict(saved)  # (also overwrites the schedule objects' settings)
        self.scheduler.lr_lambdas = current
        for group, base, fn in zip(self.optimizer.param_groups, self.scheduler.base_lrs, current):
            group["lr"] = base * fn(self.scheduler.last_epoch)
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def load_checkpoint(self, path: str | Path) -> None:
        """Load model, optimizer, schedule, position and this rank's random state, each file
        checked against the checkpoint's digest and for what it must hold before it is used."""
        directory = ckpt.resolve_checkpoint(str(path), None)
        where = str(directory / ckpt.TRAINER_FILE)
        state = ckpt.check_trainer_state(ckpt.load_file(directory / ckpt.TRAINER_FILE, self.device), where)
        mismatch = ckpt.shape_mismatch(self.model.state_dict(), state["model"])
        if mismatch:
            raise ckpt.CheckpointError(f"the checkpoint does not fit this model: {mismatch}", file=where)
        if state.get("world_size", 1) != self.world_size:
            raise ckpt.CheckpointError(
                f"the checkpoint was written by {state['world_size']} processes; resume it with the same number "
                f"(this run has {self.world_size}) so that the data position means the same",
                file=str(directory),
            )
        rng_file = directory / f"rng-rank{self.rank}.pt"
        if not rng_file.is_file():
            raise ckpt.CheckpointError(f"missing {rng_file.name}: the checkpoint is incomplete", file=str(directory))
        rng = ckpt.load_file(rng_file)
        ckpt.check_rng_file(rng, str(rng_file))
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scheduler is not None and state.get("scheduler") is not None:
                self._load_scheduler(state["scheduler"])
            if state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as err:
            raise ckpt.CheckpointError(
                f"the checkpoint's optimizer or schedule state does not fit this run: {ckpt._first_line(err)}",
                file=where,
            ) from None
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.history = list(state.get("history") or [])
        self._pending_rng = rng
        self._saved_step = self.step
