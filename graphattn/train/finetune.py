"""Fine-tuning from compiled shards: the one hand-off between `graphattn compile` and training.

    result = fine_tune(["shards/"], "runs/hotpotqa", steps=2000, batch_size=8)
    model, run = load_task_model("runs/hotpotqa")            # the newest checkpoint, for evaluation

The shards say everything a model needs: their footer carries the schema (so the heads follow its
`targets:`), the label vocabulary and geometry (so the encoder matches), and the tokenizer's
vocabulary size. Training streams them through `ShardIterableDataset` (`shard_loader`): row
groups shuffled per epoch, a shuffle buffer of `buffer_size` instances in compact form, split
across DataLoader workers and DDP ranks, so memory stays flat whatever the corpus size and
nothing is compiled again. `<out>/run.json` records the encoder config and the schema, so that
`load_task_model` (and `graphattn evaluate`) rebuild the model from a checkpoint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphattn.errors import GraphattnError
from graphattn.train.run_match import schema_from_text
from graphattn.train.rundir import RUN_FILE, RUN_FORMAT, read_run_file, save_run_tokenizer, settings_of


@dataclass
class ShardSet:
    """Compiled shards and what their footers say about them."""

    paths: list[str]
    schema: Any  # the Schema they were compiled with
    schema_text: str
    vocab_size: int
    tokenizer: str | None
    instances: int
    classes: dict[str, int] | None = None  # per class-valued target array, the schema's class count
    verify_sha256: bool = True  # each shard against its done marker (checked once per process)
    tokenizer_sha256: str | None = None  # the footer's fingerprint of the tokenizer (None: not recorded)


def open_shards(
    source: str | os.PathLike | Sequence[str | os.PathLike], schema: Any = None, *, verify_sha256: bool = True
) -> ShardSet:
    """Shards named by directories, files or globs, checked to come from one run (footers, and
    with `verify_sha256` each file against its done marker; rows are checked as they are read);
    `schema` overrides the footer's (a file or shipped name, for shards compiled from a Python dict)."""
    from graphattn.schema import load_schema
    from graphattn.shards.dataset import ShardDataset, shard_paths
    from graphattn.shards.verify import target_classes

    paths = shard_paths(source)
    dataset = ShardDataset(paths, compact=True, cache_row_groups=1, verify_sha256=verify_sha256)
    info = dataset.info
    loaded = load_schema(schema) if schema is not None else schema_from_text(info.schema_text, paths[0])
    vocab = info.settings.get("tokenizer_vocab_size")
    if not isinstance(vocab, int):
        raise GraphattnError("the shard footer does not say the tokenizer's vocabulary size", file=paths[0])
    stored = {name: (axis, tuple(shape)) for name, axis, shape in info.layout.targets}
    for spec in loaded.targets.values():
        for array in spec.arrays:
            if stored.get(array.name) != (array.axis, tuple(array.shape)):
                raise GraphattnError(
                    f"schema {loaded.name!r} declares target array {array.name!r} ({spec.kind}), which these shards "
                    "do not hold in that shape: compile them with this schema",
                    file=paths[0],
                )
    return ShardSet(
        paths,
        loaded,
        info.schema_text,
        vocab,
        info.settings.get("tokenizer"),
        len(dataset),
        target_classes(loaded),
        verify_sha256,
        sha if isinstance(sha := info.settings.get("tokenizer_sha256"), str) else None,
    )


def build_encoder(
    shards: ShardSet,
    *,
    init_from: str | None = None,
    hidden_size: int = 256,
    layers: int = 4,
    heads: int = 4,
    dropout: float = 0.1,
):
    """An encoder matching the shards' geometry: loaded from an ETC checkpoint directory (etcmodel's
    etc_config.json + model.ckpt), lifted from a local BERT/RoBERTa directory, or new."""
    from graphattn.nn import EtcConfig, EtcEncoder

    schema = shards.schema
    geometry = dict(
        local_radius=schema.local_radius,
        relative_pos_max_distance=schema.relative_pos_max_distance,
        relative_vocab_size=schema.relative_vocab_size,
    )
    if init_from:
        from graphattn.nn.etc_checkpoint import is_etc_checkpoint, load_etc_for_schema
        from graphattn.nn.lift import lift_pretrained

        if is_etc_checkpoint(init_from):
            encoder, report = load_etc_for_schema(init_from, **geometry, hidden_dropout_prob=dropout)
        else:
            encoder, report = lift_pretrained(init_from, **geometry)
        if encoder.config.vocab_size < shards.vocab_size:
            raise GraphattnError(
                f"the shards' tokenizer has {shards.vocab_size} ids but the lifted model only "
                f"{encoder.config.vocab_size}: compile with the checkpoint's own tokenizer",
                file=init_from,
            )
        return encoder, str(report)
    config = EtcConfig(
        vocab_size=shards.vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden_size,
        hidden_dropout_prob=dropout,
        **geometry,
    )
    return EtcEncoder(config), f"random encoder: {layers} layers, hidden {hidden_size}, {heads} heads"


def chosen_targets(schema, names: Sequence[str] | None) -> dict:
    targets = dict(schema.targets)
    if not targets:
        raise GraphattnError(
            f"schema {schema.name!r} declares no targets: the shards carry no task labels to train on "
            "(add a targets: section to the schema and compile again)",
            path=("targets",),
        )
    if names:
        unknown = [n for n in names if n not in targets]
        if unknown:
            raise GraphattnError(
                f"--targets {unknown[0]!r} is not a target of schema {schema.name!r} ({', '.join(targets)})"
            )
        targets = {n: targets[n] for n in names}
    return targets


def fine_tune(
    data: str | os.PathLike | Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    steps: int | None = None,
    epochs: int | None = None,
    batch_size: int = 8,
    learning_rate: float = 5e-5,
    optimizer: str = "adamw",
    warmup_ratio: float = 0.1,
    accumulate: int = 1,
    precision: str = "auto",
    checkpoint_every: int = 0,
    resume: bool = False,
    seed: int = 0,
    workers: int = 0,
    buffer_size: int = 1024,
    init_from: str | None = None,
    hidden_size: int = 256,
    layers: int = 4,
    heads: int = 4,
    dropout: float = 0.1,
    targets: Sequence[str] | None = None,
    schema: Any = None,
    progress: bool = True,
    print_fn: Callable[[str], None] | None = print,
    callbacks: Sequence[Callable] = (),
    log_every: int = 10,
    settings: dict[str, Any] | None = None,
    verify_sha256: bool = True,
    trust_undigested: bool = False,
):
    """Train a TaskModel (a head per schema target) on compiled shards; checkpoints under `out`.

    Raises `TrainingInterrupted` after saving a checkpoint when Ctrl-C or SIGTERM stops it.
    `settings` (the command line's, `graphattn.train.rundir.settings_of`; by default this call's
    own) go into run.json for a
    later --resume to compare with; every logged step goes to `out/log.jsonl`."""
    import torch

    from graphattn.train.batches import shard_loader
    from graphattn.train.distributed import is_main_process
    from graphattn.train.loop import TrainConfig, Trainer
    from graphattn.train.tasks import TaskModel

    shards = open_shards(data, schema, verify_sha256=verify_sha256)
    out = Path(out)
    if resume and (out / RUN_FILE).is_file():  # the checkpoint was trained on ids these shards must mean too
        from graphattn.train.run_match import check_shards_fit_run

        check_shards_fit_run(read_run_file(out / RUN_FILE), shards, flag="--data", where=str(out / RUN_FILE))
    torch.manual_seed(seed)
    encoder, description = build_encoder(
        shards, init_from=init_from, hidden_size=hidden_size, layers=layers, heads=heads, dropout=dropout
    )
    model = TaskModel(encoder, chosen_targets(shards.schema, targets))
    if is_main_process():
        out.mkdir(parents=True, exist_ok=True)
        max_ngram = next((h.max_ngram for h in model.heads.values() if hasattr(h, "max_ngram")), None)
        run = {
            "format": RUN_FORMAT,
            "encoder": encoder.config.to_dict(),
            "targets": list(model.targets),
            "schema_name": shards.schema.name,
            "schema_text": shards.schema_text,
            "data": shards.paths,
            "tokenizer": shards.tokenizer,
            "tokenizer_sha256": shards.tokenizer_sha256,  # what evaluate / predict compare shards with
            "tokenizer_vocab_size": shards.vocab_size,
            "max_ngram": max_ngram,
            "settings": settings
            if settings is not None
            else settings_of(
                {
                    "data": [data] if isinstance(data, (str, os.PathLike)) else list(data),
                    "targets": list(targets) if targets else None,
                    "schema": schema if isinstance(schema, (str, os.PathLike)) else None,
                    "init_from": init_from,
                    "hidden_size": hidden_size,
                    "layers": layers,
                    "heads": heads,
                    "dropout": dropout,
                    "batch_size": batch_size,
                    "lr": learning_rate,
                    "optimizer": optimizer,
                    "warmup_ratio": warmup_ratio,
                    "accumulate": accumulate,
                    "precision": precision,
                    "buffer_size": buffer_size,
                    "seed": seed,
                }
            ),
        }
        tmp = out / (RUN_FILE + ".tmp")
        tmp.write_text(json.dumps(run, indent=1), encoding="utf-8")
        os.replace(tmp, out / RUN_FILE)
        save_run_tokenizer(out, shards.tokenizer, shards.tokenizer_sha256)  # what predict compiles new documents with
        if print_fn is not None:
            print_fn(
                f"{shards.instances:,} training instances in {len(shards.paths)} shard(s), streamed; targets "
                f"{', '.join(f'{n} ({s.spec.kind})' for n, s in model.targets.items())}; {description}"
            )
    config = TrainConfig(
        max_steps=steps,
        epochs=epochs,
        learning_rate=learning_rate,
        optimizer=optimizer,
        warmup_ratio=warmup_ratio,
        gradient_accumulation_steps=accumulate,
        precision=precision,
        checkpoint_dir=str(out),
        checkpoint_every=checkpoint_every,
        resume="latest" if resume else False,
        seed=seed,
        progress=progress,
        log_every=log_every,
        log_dir=str(out),
        trust_undigested=trust_undigested,
    )
    loader = shard_loader(
        shards.paths,
        batch_size,
        shuffle=True,
        seed=seed,
        buffer_size=buffer_size,
        num_workers=workers,
        compact=True,
        classes=shards.classes,
        verify_sha256=verify_sha256,
    )
    trainer = Trainer(model, config, callbacks=callbacks)
    return trainer.fit(loader)


def load_task_model(path: str | os.PathLike, device: str = "cpu", *, trust_undigested: bool = False):
    """(TaskModel with the checkpoint's weights, run.json) from a run directory (its newest
    checkpoint) or a checkpoint directory inside one.

    Nothing is allocated before it is checked: run.json's sizes are bounded (`read_run_file`),
    trainer.pt is checked against the checkpoint's digest and memory-mapped, and the model
    run.json describes is first built on the meta device (shapes only) and compared tensor by
    tensor with the checkpoint's; its weights must be finite."""
    import torch

    from graphattn.nn import EtcConfig, EtcEncoder
    from graphattn.train import checkpoint as ckpt
    from graphattn.train.tasks import TaskModel

    path = Path(path)
    run_dir = path if (path / RUN_FILE).is_file() else path.parent
    run_file = run_dir / RUN_FILE
    if not run_file.is_file():
        raise GraphattnError(
            f"no {RUN_FILE} here or in the parent directory: name a `graphattn train --out` directory "
            "or a checkpoint inside one",
            file=str(path),
        )
    run = read_run_file(run_file)
    found = ckpt.resolve_checkpoint(
        str(path) if path != run_dir else "latest", run_dir, trust_undigested=trust_undigested
    )
    if found is None:
        raise GraphattnError("the run has no checkpoint yet (it stopped before its first save)", file=str(run_dir))
    schema = schema_from_text(run["schema_text"], str(run_file))
    unknown = [name for name in run["targets"] if name not in schema.targets]
    if unknown:
        raise GraphattnError(
            f"target {unknown[0]!r} is not in the schema run.json carries ({', '.join(schema.targets)})",
            file=str(run_file),
            path=("targets",),
        )
    targets = {name: schema.targets[name] for name in run["targets"]}
    options = {"max_ngram": run["max_ngram"]} if run.get("max_ngram") else {}
    config = EtcConfig.from_dict(run["encoder"], file=str(run_file), path=("encoder",))
    where = str(found / ckpt.TRAINER_FILE)
    state = ckpt.check_trainer_state(ckpt.load_file(found / ckpt.TRAINER_FILE, "cpu", mmap=True), where)
    with torch.device("meta"):
        shapes = TaskModel(EtcEncoder(config), targets, **options).state_dict()
    mismatch = ckpt.shape_mismatch(shapes, state["model"])
    if mismatch:
        raise GraphattnError(f"the checkpoint does not fit the model {RUN_FILE} describes: {mismatch}", file=where)
    model = TaskModel(EtcEncoder(config), targets, **options)
    model.load_state_dict(state["model"])
    model.eval()
    return model.to(torch.device(device)), {**run, "checkpoint": str(found), "step": state["step"]}
