"""Checkpoint files and random-number state, so that a resumed run continues exactly, and nothing
damaged is ever loaded.

Layout of a checkpoint directory (one per save, `step-00000100/`):

    rng-rank0.pt      Python / NumPy / torch (CPU and CUDA) generator states of rank 0, now and at
    rng-rank1.pt      the start of the current epoch (needed to rebuild the data order), ...
    trainer.pt        model, optimizer, scheduler, grad scaler, step, epoch position, history
    digest.json       written last: each file's size and sha256, and the sha256 of every tensor
                      of trainer.pt (so a damaged file names the tensor that changed)

A save fills `step-N.partial/` and renames it to `step-N/` once digest.json is in, so a directory
named `step-N` is always complete; `<checkpoint_dir>/latest` then names it. Disk full while saving
removes the partial directory and leaves the previous checkpoint and `latest` as they were.
Loading checks each file against digest.json before unpickling it, loads with
`torch.load(weights_only=True)` (tensors and plain values only: a pickle that would run code is
refused), then checks the shape of what came back (step counts are integers, the random states
restore, the weights are finite).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphattn.errors import GraphattnError
from graphattn.nn.tensorbundle import CheckpointError  # the one error type of every checkpoint loader

TRAINER_FILE = "trainer.pt"
DIGEST_FILE = "digest.json"
LATEST_FILE = "latest"
CHECKPOINT_FORMAT = "graphattn-checkpoint/1"
PARTIAL_SUFFIX = ".partial"
_NAME = re.compile(r"step-\d{8}")
_MAX_DIGEST_BYTES = 64 << 20
_CHUNK = 1 << 20


# -- random state ---------------------------------------------------------------------------------
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
    np.random.set_state(_numpy_state(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _numpy_state(np_state: dict[str, Any]) -> tuple:
    return (
        np_state["kind"],
        np_state["keys"].numpy().astype(np.uint32),
        np_state["pos"],
        np_state["has_gauss"],
        np_state["cached"],
    )


def _as_tuple(value: Any) -> Any:
    """random.setstate needs tuples all the way down; serialization may hand back lists."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def check_rng_file(state: Any, where: str) -> None:
    """Refuse (one line naming the file and the generator) a random state that would not restore:
    each part is tried on a scratch generator, so nothing global changes here."""
    if not isinstance(state, dict) or not {"now", "epoch_start"} <= set(state):
        raise CheckpointError("not a random-state file: expected a dict with 'now' and 'epoch_start'", file=where)
    for moment in ("now", "epoch_start"):
        part = state[moment]
        if not isinstance(part, dict) or not {"python", "numpy", "torch"} <= set(part):
            raise CheckpointError(f"{moment}: expected the python, numpy and torch generator states", file=where)
        try:
            random.Random().setstate(_as_tuple(part["python"]))
            if not isinstance(part["numpy"], dict) or not isinstance(part["numpy"].get("keys"), torch.Tensor):
                raise TypeError("numpy: expected a dict with a 'keys' tensor")
            np.random.RandomState().set_state(_numpy_state(part["numpy"]))
            if not isinstance(part["torch"], torch.Tensor) or part["torch"].dtype != torch.uint8:
                raise TypeError("torch: expected a uint8 tensor")
            torch.Generator().set_state(part["torch"])
            cuda = part.get("cuda", [])
            if not isinstance(cuda, (list, tuple)) or not all(
                isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda
            ):
                raise TypeError("cuda: expected a list of uint8 tensors, one per device")
        except (TypeError, ValueError, KeyError, RuntimeError, AttributeError, OverflowError) as err:
            raise CheckpointError(
                f"{moment}: the random state is damaged and cannot be restored ({_first_line(err)})", file=where
            ) from None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# -- digests ----------------------------------------------------------------------------------------
def tensors_in(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor in nested dicts / lists: `model/encoder.x.weight`,
    `optimizer/state/3/exp_avg`."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from tensors_in(value, f"{prefix}/{key}" if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors_in(value, f"{prefix}/{i}" if prefix else str(i))


def tensor_sha256(tensor: torch.Tensor) -> str:
    data = tensor.detach().to("cpu").contiguous().reshape(-1)
    return hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def state_bytes(obj: Any) -> int:
    """About what torch.save writes for `obj`: its tensors' bytes plus room for the pickle."""
    return sum(t.numel() * t.element_size() for _, t in tensors_in(obj)) + (64 << 10)


# -- saving -------------------------------------------------------------------------------------------
def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def partial_dir(root: Path, step: int) -> Path:
    return root / (checkpoint_name(step) + PARTIAL_SUFFIX)


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def _is_disk_full(err: BaseException, directory: Path, needed: int) -> bool:
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    # torch's zip writer reports a short write as a RuntimeError ("unexpected pos ..."), without errno
    return isinstance(err, RuntimeError) and _free_bytes(directory) < needed


def _free_bytes(directory: Path) -> int:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return 0


def disk_full_error(root: Path, step: int, needed: int) -> CheckpointError:
    """The one line a full disk gets: what the save needs, what is free, what is still safe."""
    previous = complete_checkpoints(root)
    kept = (
        f"the previous checkpoint {previous[-1].name} is intact and `latest` names it"
        if previous
        else "no earlier checkpoint exists"
    )
    return CheckpointError(
        f"disk full while saving checkpoint {checkpoint_name(step)}: it needs about {_megabytes(needed)}, "
        f"{_megabytes(_free_bytes(root))} is free there; {kept}; free some space, then run again with --resume",
        file=str(root),
    )


def check_room(root: Path, step: int, needed: int) -> None:
    """Refuse a save that cannot fit before writing a byte of it."""
    if _free_bytes(root) < needed:
        raise disk_full_error(root, step, needed)


def save_file(obj: Any, path: Path) -> None:
    """torch.save into `path` (inside a partial checkpoint directory), flushed to disk; the
    caller removes the directory when this raises."""
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def write_digest(directory: Path, trainer_state: dict[str, Any]) -> None:
    """digest.json: every file of the directory and every tensor of trainer.pt. Written last."""
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(directory.iterdir())
        if p.suffix == ".pt"
    }
    tensors = {name: tensor_sha256(t) for name, t in tensors_in(trainer_state)}
    data = {"format": CHECKPOINT_FORMAT, "files": files, "tensors": {TRAINER_FILE: tensors}}
    path = directory / DIGEST_FILE
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


def publish(partial: Path, final: Path) -> None:
    """Rename the finished partial directory to its step name and point `latest` at it."""
    if final.exists():  # the same step saved again (a run resumed from it and stopped at once)
        shutil.rmtree(final)
    os.replace(partial, final)
    latest = final.parent / LATEST_FILE
    tmp = latest.with_name(LATEST_FILE + ".tmp")
    tmp.write_text(final.name + "\n")
    os.replace(tmp, latest)


def remove_partials(root: Path) -> None:
    """Directories of saves that never finished (killed, disk full): never trusted."""
    if root.is_dir():
        for partial in root.glob(f"step-*{PARTIAL_SUFFIX}"):
            shutil.rmtree(partial, ignore_errors=True)


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if _NAME.fullmatch(p.name) and (p / DIGEST_FILE).is_file())


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
            named = root / latest.read_text(encoding="utf-8", errors="replace").strip()
            if _NAME.fullmatch(named.name) and (named / DIGEST_FILE).is_file():
                return named
        found = complete_checkpoints(root)
        return found[-1] if found else None
    path = Path(resume)
    if path.is_file() and path.name in (TRAINER_FILE, DIGEST_FILE):
        path = path.parent
    if not (path / DIGEST_FILE).is_file():
        raise CheckpointError(
            f"not a complete checkpoint (no {DIGEST_FILE} inside: a save that never finished, or not a checkpoint)",
            file=str(path),
        )
    return path


# -- loading ------------------------------------------------------------------------------------------
def read_digest(directory: Path) -> dict[str, Any]:
    path = directory / DIGEST_FILE
    try:
        if path.stat().st_size > _MAX_DIGEST_BYTES:
            raise CheckpointError(f"{DIGEST_FILE} is larger than {_MAX_DIGEST_BYTES >> 20} MB", file=str(path))
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{DIGEST_FILE} is damaged ({err})", file=str(path)) from None
    except OSError as err:
        raise CheckpointError(f"cannot read {DIGEST_FILE}: {err.strerror or err}", file=str(path)) from None
    if (
        not isinstance(data, dict)
        or data.get("format") != CHECKPOINT_FORMAT
        or not isinstance(data.get("files"), dict)
        or not isinstance(data.get("tensors"), dict)
    ):
        raise CheckpointError(
            f"{DIGEST_FILE} is not a {CHECKPOINT_FORMAT} digest (format, files and tensors expected)", file=str(path)
        )
    return data


def load_file(path: Path, device: torch.device | str = "cpu", *, mmap: bool = False) -> Any:
    """A checkpoint file, after checking its size and sha256 against the directory's digest.json."""
    path = Path(path)
    digest = read_digest(path.parent)
    recorded = digest["files"].get(path.name)
    if not isinstance(recorded, dict) or not isinstance(recorded.get("sha256"), str):
        raise CheckpointError(f"{DIGEST_FILE} records no digest for {path.name}", file=str(path))
    try:
        size = path.stat().st_size
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint file: {err.strerror or err}", file=str(path)) from None
    if size != recorded.get("bytes"):
        raise CheckpointError(
            f"the file is {size:,} bytes but {recorded.get('bytes')!r} were written (truncated or replaced); "
            "restore it from a copy or resume from an older checkpoint",
            file=str(path),
        )
    if file_sha256(path) != recorded["sha256"]:
        where = _changed_tensor(path, digest["tensors"].get(path.name, {}))
        raise CheckpointError(
            f"damaged: its sha256 differs from the one recorded when it was saved{where}; "
            "restore it from a copy or resume from an older checkpoint",
            file=str(path),
        )
    return _torch_load(path, device, mmap)


def _torch_load(path: Path, device: torch.device | str, mmap: bool) -> Any:
    mmap = mmap and zipfile.is_zipfile(path)  # torch maps only its zip format; a bare pickle is read whole
    try:
        with warnings.catch_warnings():  # torch's notes on a foreign pickle's protocol: the refusal below says it
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location=device, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        raise CheckpointError(
            "refused: the file holds Python objects other than tensors and plain values (unpickling it could run "
            "code), so graphattn did not write it; nothing in it was loaded",
            file=str(path),
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError, KeyError, AttributeError, IndexError) as err:
        raise CheckpointError(f"cannot read checkpoint file: {_first_line(err)}", file=str(path)) from None


def _changed_tensor(path: Path, recorded: Any) -> str:
    """`(tensor 'model/x' changed)` when the file still loads and a tensor's bytes differ."""
    if not isinstance(recorded, dict):
        return ""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - the file is already known to be damaged; this only names the place
        return " (the damage is in the file's structure, not in a tensor's values)"
    changed = [name for name, t in tensors_in(state) if recorded.get(name) not in (None, tensor_sha256(t))]
    if not changed:
        return " (no tensor's values changed: the damage is in the file's index or metadata)"
    more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
    return f" (tensor {changed[0]!r}{more} changed)"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62


def check_trainer_state(state: Any, where: str) -> dict[str, Any]:
    """The trainer.pt of a checkpoint, checked for the keys and types a resume or evaluation reads."""
    if not isinstance(state, dict):
        raise CheckpointError(f"expected a dict of trainer state, found {type(state).__name__}", file=where)
    model = state.get("model")
    if not isinstance(model, dict) or not all(isinstance(v, torch.Tensor) for v in model.values()):
        raise CheckpointError("'model' must be a dict of tensors (the model's state_dict)", file=where)
    for key in ("step", "epoch", "batch_in_epoch"):
        if not _is_count(state.get(key)):
            raise CheckpointError(f"{key!r} must be a non-negative integer, found {state.get(key)!r:.60}", file=where)
    world = state.get("world_size", 1)
    if not _is_count(world) or world < 1:
        raise CheckpointError(f"'world_size' must be a positive integer, found {world!r:.60}", file=where)
    for key, kind in (("optimizer", dict), ("history", list), ("config", dict)):
        if key in state and state[key] is not None and not isinstance(state[key], kind):
            raise CheckpointError(f"{key!r} must be a {kind.__name__}, found {type(state[key]).__name__}", file=where)
    history = state.get("history") or []
    if not all(isinstance(r, dict) for r in history):
        raise CheckpointError("'history' must be a list of dicts (one per logged step)", file=where)
    check_finite_weights(model, where)
    return state


def check_finite_weights(weights: Mapping[str, torch.Tensor], where: str) -> None:
    """Refuse NaN or infinite weights, naming the first tensor that holds one."""
    for name, tensor in weights.items():
        if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(
                f"tensor {name!r} holds {bad:,} non-finite value(s) (NaN or inf): the model diverged or the file "
                "was altered; resume from an earlier checkpoint",
                file=where,
            )


def shape_mismatch(expected: Mapping[str, Any], found: Mapping[str, torch.Tensor]) -> str:
    """'' when `found` (a checkpoint's state_dict) has exactly the tensors and shapes of
    `expected` (a model's, possibly on the meta device); else the differences, in one line."""
    problems = []
    for name, want in expected.items():
        have = found.get(name)
        if have is None:
            problems.append(f"{name!r} is missing from the checkpoint")
        elif tuple(have.shape) != tuple(want.shape):
            problems.append(f"{name!r} is {list(have.shape)} in the checkpoint but {list(want.shape)} here")
    problems += [f"{name!r} is in the checkpoint but not in this model" for name in found if name not in expected]
    if not problems:
        return ""
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more
