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
import shutil
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphattn.errors import GraphattnError
from graphattn.nn.tensorbundle import CheckpointError  # the one error type of every checkpoint loader
from graphattn.train.checkpoint_dirs import (  # noqa: F401 - the names of a checkpoint's files, re-exported
    DIGEST_FILE,
    LATEST_FILE,
    PARTIAL_SUFFIX,
    TRAINER_FILE,
    TRUST_FLAG,
    checkpoint_name,
    complete_checkpoints,
    step_directories,
    undigested_message,
    undigested_newest,
)

CHECKPOINT_FORMAT = "graphattn-checkpoint/1"
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
    """sha256 of a tensor's bytes, read where they lie (no copy of a contiguous CPU tensor; a
    CUDA or strided one is copied alone, as torch.save copies it)."""
    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.to("cpu")
    if not data.is_contiguous():
        data = data.contiguous()
    if not data.numel():
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(memoryview(data.reshape(-1).view(torch.uint8).numpy())).hexdigest()


def tensor_digests(state: Any) -> dict[str, str]:
    """{path: sha256} of every tensor in `state` (see tensors_in)."""
    return {name: tensor_sha256(t) for name, t in tensors_in(state)}


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


class _HashingWriter:
    """A file handle that hashes the bytes torch.save hands it on their way to the disk (torch's
    zip writer writes a stream once, front to back), so a save's digest needs no second read."""

    def __init__(self, handle: Any):
        self.handle, self.sha256, self.size = handle, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha256.update(view)
        self.size += view.nbytes
        return self.handle.write(view)

    def flush(self) -> None:
        self.handle.flush()


def save_file(obj: Any, path: Path) -> dict[str, Any]:
    """torch.save into `path` (inside a partial checkpoint directory), flushed to disk; returns
    the file's digest.json entry ({"bytes", "sha256"}), taken from the bytes as they were
    written. The caller removes the directory when this raises."""
    with open(path, "wb") as handle:
        writer = _HashingWriter(handle)
        torch.save(obj, writer)
        handle.flush()
        if handle.tell() != writer.size:  # torch wrote past the stream (it never seeks today): read it back
            return {"bytes": handle.tell(), "sha256": file_sha256(path)}
        os.fsync(handle.fileno())
    return {"bytes": writer.size, "sha256": writer.sha256.hexdigest()}


def save_trainer_file(state: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """trainer.pt saved, and (its digest entry, the digest of each of its tensors): the tensors
    are hashed from their own memory on a second thread while torch.save writes them (hashlib
    works outside the GIL), so the digest adds neither a copy of the state nor, on a machine
    whose disk is slower than sha256, time to the save."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="graphattn-digest") as pool:
        tensors = pool.submit(tensor_digests, state)
        entry = save_file(state, path)
        return entry, tensors.result()


def write_digest(
    directory: Path,
    trainer_state: dict[str, Any] | None = None,
    *,
    files: Mapping[str, dict[str, Any]] | None = None,
    tensors: Mapping[str, str] | None = None,
) -> None:
    """digest.json: every .pt file of the directory and every tensor of trainer.pt. Written last
    (through a temporary file, so it is there whole or not at all). `files` and `tensors` are
    digests already taken while saving; any .pt file not in `files` is read and hashed here,
    and the tensors are hashed from `trainer_state` when `tensors` is not given."""
    known = dict(files or {})
    recorded = {
        p.name: known.get(p.name) or {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(directory.iterdir())
        if p.suffix == ".pt"
    }
    if tensors is None:
        tensors = tensor_digests(trainer_state or {})
    data = {"format": CHECKPOINT_FORMAT, "files": recorded, "tensors": {TRAINER_FILE: dict(tensors)}}
    path = directory / DIGEST_FILE
    tmp = path.with_name(DIGEST_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


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


def prune_checkpoints(root: Path, keep: int) -> None:
    if keep <= 0:
        return
    for old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def undigested_error(directory: Path, previous: Path | None = None) -> CheckpointError:
    return CheckpointError(undigested_message(directory, previous), file=str(directory))


def newest_checkpoint(root: Path, *, trust_undigested: bool = False) -> Path | None:
    """The newest `step-N` under `root` (None when there is none). One without digest.json is
    never passed over for an older one: it is refused (undigested_message) or, with
    `trust_undigested`, checked and given its digest (trust_checkpoint)."""
    undigested = undigested_newest(root)
    if undigested is None:
        steps = step_directories(root)
        return steps[-1] if steps else None
    if trust_undigested:
        return trust_checkpoint(undigested[0])
    raise undigested_error(*undigested)


def resolve_checkpoint(
    resume: str | os.PathLike | bool,
    checkpoint_dir: str | os.PathLike | None,
    *,
    trust_undigested: bool = False,
) -> Path | None:
    """What `resume` names: True / "latest" -> the newest checkpoint under `checkpoint_dir`
    (None when there is none yet: a fresh start); a path -> that checkpoint (must exist). A
    checkpoint without digest.json is refused unless `trust_undigested` (see newest_checkpoint)."""
    if resume is False or resume is None:
        return None
    if resume is True or resume == "latest":
        if checkpoint_dir is None:
            raise GraphattnError("resume='latest' needs checkpoint_dir", path=("TrainConfig", "resume"))
        return newest_checkpoint(Path(checkpoint_dir), trust_undigested=trust_undigested)
    path = Path(resume)
    if path.is_file() and path.name in (TRAINER_FILE, DIGEST_FILE):
        path = path.parent
    if (path / DIGEST_FILE).is_file():
        return path
    if path.name.endswith(PARTIAL_SUFFIX) or not (path / TRAINER_FILE).is_file():
        raise CheckpointError(
            f"not a complete checkpoint (no {DIGEST_FILE} and {TRAINER_FILE} inside: a save that never finished, "
            "or not a checkpoint)",
            file=str(path),
        )
    if trust_undigested:
        return trust_checkpoint(path)
    raise undigested_error(path)


def trust_checkpoint(directory: Path) -> Path:
    """--trust-undigested: a checkpoint without digest.json is checked as a resume or an
    evaluation would check it (weights_only load, the trainer state's keys and types, finite
    weights, one random state per rank that restores), then its digest.json is written from its
    files as they are now. Nothing is written when a check fails."""
    trainer = directory / TRAINER_FILE
    if not trainer.is_file():
        raise CheckpointError(f"no {TRAINER_FILE}: not a checkpoint graphattn wrote", file=str(directory))
    state = check_trainer_state(_torch_load(trainer, "cpu", mmap=True), str(trainer))
    for rank in range(state.get("world_size", 1)):
        rng = directory / f"rng-rank{rank}.pt"
        if not rng.is_file():
            raise CheckpointError(f"missing {rng.name}: the checkpoint is incomplete", file=str(directory))
        check_rng_file(_torch_load(rng, "cpu", False), str(rng))
    write_digest(directory, state)
    return directory


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
