"""Training: the loop (AdamW / LAMB, warm-up, clipping, mixed precision, exact resume, Ctrl-C,
DDP), data loaders for in-memory batches and compiled shards, task heads built from the schema's
targets, fine-tuning and evaluation from shards, and process-group helpers.

The names load lazily: `graphattn train --help` and its argument checks import this package
without torch (the command line checks everything before it loads torch)."""

from __future__ import annotations

from graphattn.lazy import lazy_exports

_EXPORTS = {
    "InstanceLoader": "graphattn.train.batches",
    "shard_loader": "graphattn.train.batches",
    "cleanup_distributed": "graphattn.train.distributed",
    "free_port": "graphattn.train.distributed",
    "get_rank": "graphattn.train.distributed",
    "get_world_size": "graphattn.train.distributed",
    "init_distributed": "graphattn.train.distributed",
    "is_main_process": "graphattn.train.distributed",
    "TrainConfig": "graphattn.train.loop",
    "Trainer": "graphattn.train.loop",
    "TrainingInterrupted": "graphattn.train.loop",
    "TrainResult": "graphattn.train.loop",
    "move_to_device": "graphattn.train.loop",
    "split_output": "graphattn.train.loop",
    "train": "graphattn.train.loop",
    "Lamb": "graphattn.train.optim",
    "Predictor": "graphattn.train.predict",
    "WarmupDecay": "graphattn.train.optim",
    "build_optimizer": "graphattn.train.optim",
    "build_scheduler": "graphattn.train.optim",
    "TaskModel": "graphattn.train.tasks",
    "task_targets": "graphattn.train.tasks",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
