"""Training: the loop (AdamW / LAMB, warm-up, clipping, mixed precision, exact resume, DDP),
data loaders for in-memory examples and compiled shards, and process-group helpers."""

from graphattn.train.batches import InstanceLoader, shard_loader
from graphattn.train.distributed import cleanup_distributed, free_port, get_rank, get_world_size, init_distributed, is_main_process
from graphattn.train.loop import TrainConfig, Trainer, TrainResult, move_to_device, split_output, train
from graphattn.train.optim import Lamb, WarmupDecay, build_optimizer, build_scheduler
from graphattn.train.targets import TaskExample, collate_examples, hotpotqa_targets, keyphrase_targets, nq_targets, wikihop_targets
from graphattn.train.tasks import TASK_TARGETS, TaskModel

__all__ = [
    "InstanceLoader", "Lamb", "TrainConfig", "TrainResult", "Trainer", "WarmupDecay", "build_optimizer", "build_scheduler",
    "cleanup_distributed", "free_port", "get_rank", "get_world_size", "init_distributed", "is_main_process", "move_to_device",
    "shard_loader", "split_output", "train", "TASK_TARGETS", "TaskExample", "TaskModel", "collate_examples", "hotpotqa_targets",
    "keyphrase_targets", "nq_targets", "wikihop_targets",
]
