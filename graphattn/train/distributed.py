"""torch.distributed in one place: start and stop a process group, ask who we are, reduce.

Works the same under `torchrun` (reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR from the
environment) and under `torch.multiprocessing.spawn` (pass rank, world size and an init method).
Without a process group every helper answers as the single process (rank 0 of 1).
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

from graphattn.errors import GraphattnError


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    return get_rank() == 0


def local_rank() -> int:
    """The device index of this process on its machine (torchrun's LOCAL_RANK, else rank)."""
    return int(os.environ.get("LOCAL_RANK", get_rank()))


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def free_port() -> int:
    """A free TCP port on 127.0.0.1, for init_method=f"tcp://127.0.0.1:{port}"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_distributed(
    backend: str | None = None, init_method: str | None = None, rank: int | None = None, world_size: int | None = None
) -> tuple[int, int]:
    """Start the default process group and return (rank, world_size).

    backend: "nccl" when CUDA is available, else "gloo". With no init_method the environment
    (torchrun) says where to meet; rank and world size default to RANK and WORLD_SIZE."""
    if not dist.is_available():
        raise GraphattnError("this torch build has no torch.distributed")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    if init_method is None and "MASTER_ADDR" not in os.environ:
        raise GraphattnError(
            "no init_method and no MASTER_ADDR: run under torchrun or pass init_method "
            "(e.g. 'tcp://127.0.0.1:PORT' or 'file:///tmp/some-file')"
        )
    dist.init_process_group(backend, init_method=init_method or "env://", rank=rank, world_size=world_size)
    if backend == "nccl":
        torch.cuda.set_device(local_rank())
    return rank, world_size


def cleanup_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (in place for a process group; unchanged without one)."""
    if is_distributed():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_ranks_agree(flag: bool, device: torch.device) -> bool:
    """True only if `flag` is true on every rank (used to end an epoch together when one rank's
    share of the data runs out first, instead of hanging in the next gradient all-reduce)."""
    if not is_distributed():
        return flag
    value = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def raise_together(error: BaseException | None) -> None:
    """Every rank calls this at the same point of a step that all take part in (a checkpoint
    save): when any rank brings an error, every rank raises the error of the lowest failing rank,
    so that the job ends with the same one line on each of them instead of the others waiting at
    the next collective call until the launcher's timeout. Without a process group: raises
    `error` if there is one."""
    if not is_distributed():
        if error is not None:
            raise error
        return
    gathered: list = [None] * get_world_size()
    dist.all_gather_object(gathered, None if error is None else _portable(error))
    first = next((found for found in gathered if found is not None), None)
    if first is not None:
        raise first from None


def _portable(error: BaseException) -> BaseException:
    """`error` itself when it survives pickling (GraphattnError does, message and location), else
    a GraphattnError carrying its first line."""
    import pickle

    if isinstance(error, GraphattnError):
        try:
            pickle.loads(pickle.dumps(error))
            return error
        except Exception:  # noqa: BLE001 - any unpicklable error is sent as its text
            pass
    lines = str(error).strip().splitlines()
    return GraphattnError(f"rank {get_rank()}: {type(error).__name__}: {lines[0][:300] if lines else ''}".rstrip(": "))
