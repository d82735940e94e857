"""`graphattn train`: fine-tune a task head on WikiHop / HotpotQA / NQ records.

    graphattn train --task wikihop --data dev.json --schema schemas/wikihop.yaml \
        --tokenizer tokenizer.json --init-from ./roberta-base --out runs/wikihop --steps 2000

Reads the records with the task's JSON adapter, compiles them with the schema (NQ in windows),
builds the head's targets from the answers the adapter put on the graph, and trains with the
Trainer (checkpoints and `--resume` under --out). Under `torchrun` it runs DDP. The run's
encoder config and task are written to <out>/run.json, so `TaskModel` can be rebuilt from a
checkpoint's trainer.pt.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from graphattn.cli import add_verbosity_arguments, verbosity
from graphattn.errors import GraphattnError

TASK_FORMATS = {"wikihop": "wikihop", "hotpotqa": "hotpotqa", "nq": "nq"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", required=True, choices=sorted(TASK_FORMATS), help="which head to train")
    parser.add_argument("--data", required=True, nargs="+", help="record files in the task's JSON format")
    parser.add_argument("--eval-data", nargs="*", default=[], help="records to report the mean loss (and accuracy) on after training")
    parser.add_argument("--schema", required=True, help="relation schema (YAML/JSON), e.g. schemas/wikihop.yaml")
    parser.add_argument("--tokenizer", required=True, help="tokenizer.json (matching --init-from's vocabulary)")
    parser.add_argument("--out", required=True, help="directory for checkpoints and run.json")
    parser.add_argument("--init-from", help="local HF BERT/RoBERTa checkpoint directory to lift the encoder from")
    parser.add_argument("--hidden-size", type=int, default=256, help="random encoder (no --init-from): hidden size")
    parser.add_argument("--layers", type=int, default=4, help="random encoder: layers")
    parser.add_argument("--heads", type=int, default=4, help="random encoder: attention heads")
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=int, help="optimizer steps")
    length.add_argument("--epochs", type=int, help="passes over --data")
    parser.add_argument("--batch-size", type=int, default=8, help="examples per step and process")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--optimizer", choices=("adamw", "lamb"), default="adamw")
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--accumulate", type=int, default=1, help="batches per optimizer step")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: at the end only)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint under --out")
    parser.add_argument("--seed", type=int, default=0)
    add_verbosity_arguments(parser, "--no-progress")  # -q/--quiet; --no-progress is its older name


def _examples(paths: list[str], task: str, schema, tokenizer) -> list:
    from graphattn.compile import compile_windows
    from graphattn.ingest.json import read_json
    from graphattn.train.targets import TaskExample, hotpotqa_targets, nq_targets, wikihop_targets

    build = {"wikihop": wikihop_targets, "hotpotqa": hotpotqa_targets, "nq": nq_targets}[task]
    examples = []
    for path in paths:
        for graph in read_json(path, TASK_FORMATS[task]):
            for instance in compile_windows(graph, schema, tokenizer):
                examples.append(TaskExample(instance, build(instance, graph)))
    if not examples:
        raise GraphattnError("no records found", file=", ".join(paths))
    return examples


def _encoder(args: argparse.Namespace, schema, vocab_size: int):
    from graphattn.nn import EtcConfig, EtcEncoder
    from graphattn.nn.lift import lift_pretrained

    geometry = dict(local_radius=schema.local_radius, relative_pos_max_distance=schema.relative_pos_max_distance,
                    relative_vocab_size=schema.relative_vocab_size)
    if args.init_from:
        encoder, report = lift_pretrained(args.init_from, **geometry)
        if encoder.config.vocab_size < vocab_size:
            raise GraphattnError(f"the tokenizer has {vocab_size} ids but the lifted model only {encoder.config.vocab_size}: "
                                 "use the checkpoint's own tokenizer", file=args.tokenizer)
        return encoder, str(report)
    config = EtcConfig(vocab_size=vocab_size, hidden_size=args.hidden_size, num_hidden_layers=args.layers,
                       num_attention_heads=args.heads, intermediate_size=4 * args.hidden_size, **geometry)
    return EtcEncoder(config), f"random encoder: {args.layers} layers, hidden {args.hidden_size}, {args.heads} heads"


def run(args: argparse.Namespace) -> int:
    import torch

    from graphattn.schema import load_schema
    from graphattn.tokenize import load_tokenizer
    from graphattn.train.batches import InstanceLoader
    from graphattn.train.distributed import cleanup_distributed, init_distributed, is_main_process
    from graphattn.train.loop import TrainConfig, Trainer
    from graphattn.train.targets import collate_examples
    from graphattn.train.tasks import TaskModel

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        init_distributed()
    try:
        torch.manual_seed(args.seed)
        schema, tokenizer = load_schema(args.schema), load_tokenizer(args.tokenizer)
        examples = _examples(args.data, args.task, schema, tokenizer)
        encoder, description = _encoder(args, schema, tokenizer.vocab_size)
        model = TaskModel(encoder, args.task)
        out = Path(args.out)
        if is_main_process():
            print(f"{len(examples)} training instances; {description}")
            out.mkdir(parents=True, exist_ok=True)
            (out / "run.json").write_text(json.dumps({"task": args.task, "encoder": encoder.config.to_dict(), "schema": args.schema,
                                                      "tokenizer": args.tokenizer}, indent=2))
        config = TrainConfig(max_steps=args.steps, epochs=args.epochs, learning_rate=args.lr, optimizer=args.optimizer,
                             warmup_ratio=args.warmup_ratio, gradient_accumulation_steps=args.accumulate, precision=args.precision,
                             checkpoint_dir=str(out), checkpoint_every=args.checkpoint_every, resume="latest" if args.resume else False,
                             seed=args.seed, progress=verbosity(args) >= 0)
        data = InstanceLoader(examples, args.batch_size, collate_examples, shuffle=True, seed=args.seed)
        trainer = Trainer(model, config)
        result = trainer.fit(data)
        if is_main_process():
            last = result.history[-1] if result.history else {}
            print(f"trained {result.step} steps; last loss {last.get('loss', float('nan')):.4f}; checkpoint {result.checkpoint}")
        if args.eval_data:
            held_out = InstanceLoader(_examples(args.eval_data, args.task, schema, tokenizer), args.batch_size, collate_examples)
            scores = trainer.evaluate(held_out)
            if is_main_process():
                print("eval: " + ", ".join(f"{name} {value:.4f}" for name, value in scores.items()))
        return 0
    finally:
        if distributed:
            cleanup_distributed()
