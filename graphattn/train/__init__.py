"""Training: the loop (AdamW / LAMB, warm-up, clipping, mixed precision, exact resume, Ctrl-C,
DDP), data loaders for in-memory batches and compiled shards, task heads built from the schema's
targets, fine-tuning and evaluation from shards, and process-group helpers."""

from graphattn.train.batches import InstanceLoader, shard_loader
from graphattn.train.distributed import (
    cleanup_distributed,
    free_port,
    get_rank,
    get_world_size,
    init_distributed,
    is_main_process,
)
from graphattn.train.loop import (
    TrainConfig,
    Trainer,
    TrainingInterrupted,
    TrainResult,
    move_to_device,
    split_output,
    train,
)
from graphattn.train.optim import Lamb, WarmupDecay, build_optimizer, build_scheduler
from graphattn.train.tasks import TaskModel, task_targets

__all__ = [
    "InstanceLoader",
    "Lamb",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingInterrupted",
    "WarmupDecay",
    "build_optimizer",
    "build_scheduler",
    "cleanup_distributed",
    "free_port",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_main_process",
    "move_to_device",
    "shard_loader",
    "split_output",
    "train",
    "TaskModel",
    "task_targets",
]
