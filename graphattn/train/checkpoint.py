"""Checkpoint files and random-number state, so that a resumed run continues exactly.

Layout of a checkpoint directory (one per save, `step-00000100/`):

    trainer.pt        model, optimizer, scheduler, grad scaler, step, epoch position, history
    rng-rank0.pt      Python / NumPy / torch (CPU and CUDA) generator states of rank 0, now and at
    rng-rank1.pt      the start of the current epoch (needed to rebuild the data order), ...

`trainer.pt` is written last, so a directory without it is an interrupted save and is ignored.
`<checkpoint_dir>/latest` names the newest complete checkpoint. Files hold only tensors and
plain Python values, and load with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphattn.errors import GraphattnError

TRAINER_FILE = "trainer.pt"
LATEST_FILE = "latest"


def capture_rng() -> dict[str, Any]:
    """Every global generator a training step or a data pipeline may draw from."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["kind"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    """random.setstate needs tuples all the way down; serialization may hand back lists."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def save_rng(directory: Path, rank: int, epoch_start: dict[str, Any]) -> None:
    _atomic_save({"now": capture_rng(), "epoch_start": epoch_start}, directory / f"rng-rank{rank}.pt")


def save_trainer_state(directory: Path, state: dict[str, Any]) -> None:
    """Write trainer.pt (marking the checkpoint complete) and point `latest` at it."""
    _atomic_save(state, directory / TRAINER_FILE)
    latest = directory.parent / LATEST_FILE
    tmp = latest.with_name(LATEST_FILE + ".tmp")
    tmp.write_text(directory.name + "\n")
    os.replace(tmp, latest)


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / TRAINER_FILE).is_file())


def prune_checkpoints(root: Path, keep: int) -> None:
    if keep <= 0:
        return
    for old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def resolve_checkpoint(resume: str | os.PathLike | bool, checkpoint_dir: str | os.PathLike | None) -> Path | None:
    """What `resume` names: True / "latest" -> the newest checkpoint under `checkpoint_dir`
    (None when there is none yet: a fresh start); a path -> that checkpoint (must exist)."""
    if resume is False or resume is None:
        return None
    if resume is True or resume == "latest":
        if checkpoint_dir is None:
            raise GraphattnError("resume='latest' needs checkpoint_dir", path=("TrainConfig", "resume"))
        root = Path(checkpoint_dir)
        latest = root / LATEST_FILE
        if latest.is_file():
            named = root / latest.read_text().strip()
            if (named / TRAINER_FILE).is_file():
                return named
        found = complete_checkpoints(root)
        return found[-1] if found else None
    path = Path(resume)
    if path.is_file() and path.name == TRAINER_FILE:
        path = path.parent
    if not (path / TRAINER_FILE).is_file():
        raise GraphattnError(f"not a complete checkpoint (no {TRAINER_FILE} inside)", file=str(path))
    return path


def load_file(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except (OSError, RuntimeError, EOFError) as err:
        raise GraphattnError(f"cannot read checkpoint file: {err}", file=str(path)) from err
