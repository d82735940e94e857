"""Do these shards fit this model? The one comparison behind `evaluate`, `predict` and `train`.

A model reads ids: token ids its tokenizer gave, relative-attention label ids laid out by its
schema (distances clipped at `relative_pos_max_distance`, then the schema's labels), local
attention within `local_radius`, and the target arrays its heads were built for. Shards compiled
with another schema or tokenizer hold ids that mean something else there, and nothing fails: the
model runs and scores noise. So every reader that hands shards to a trained model compares first
what the shards' footer records (`graphattn.shards.reader.ShardInfo`: the layout, the label
vocabulary, the schema text, `settings` with the tokenizer's name, sha256 and vocabulary size)
with what the run recorded (run.json, `graphattn.train.rundir.read_run_file`: the encoder config,
the schema text, the targets, the tokenizer), and refuses the first difference in one line
naming the shard file, both values and what to do.

    check_shards_fit_run(run, shards, flag="--data")            # evaluate, predict, train --resume
    check_shards_match(data, eval_data, flag="--eval-data")     # train: --eval-data against --data

The other shards of a set are held to the first by `check_same_run` when they are read together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from graphattn.errors import GraphattnError

SHA256_HEX = 64


def schema_from_text(text: str, where: str):
    """The Schema a shard footer (or run.json) carries, parsed within the schema loader's bounds."""
    from graphattn.schema import load_schema
    from graphattn.schema.io import parse_bounded

    try:
        data, _ = parse_bounded(text, None)
    except (GraphattnError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise GraphattnError(
            "the footer holds no readable relation schema (was it compiled from a Python dict?); "
            "pass --schema with the schema file the shards were compiled with",
            file=where,
        )
    try:
        return load_schema(data)
    except GraphattnError as err:
        raise GraphattnError(f"the relation schema it carries does not load: {err.reason}", file=where) from None


@dataclass(frozen=True)
class Fit:
    """What decides whether a model reads shards as it was trained on them (None: not recorded)."""

    schema_name: str
    relative_pos_max_distance: int
    local_radius: int
    labels: tuple[str, ...]  # the relative-attention label vocabulary, in id order
    targets: Mapping[str, Any]  # name -> TargetSpec
    tokenizer: str | None
    tokenizer_sha256: str | None
    tokenizer_vocab_size: int | None


def shard_fit(info) -> Fit:
    """The Fit a shard's footer (a checked `ShardInfo`) records."""
    settings = info.settings
    sha = settings.get("tokenizer_sha256")
    schema = schema_from_text(info.schema_text, info.path)
    return Fit(
        schema_name=schema.name,
        relative_pos_max_distance=info.layout.max_distance,
        local_radius=info.layout.local_radius,
        labels=tuple(info.label_vocab.names),
        targets=dict(schema.targets),
        tokenizer=settings.get("tokenizer") if isinstance(settings.get("tokenizer"), str) else None,
        tokenizer_sha256=sha if isinstance(sha, str) else None,
        tokenizer_vocab_size=settings.get("tokenizer_vocab_size"),
    )


def run_fit(run: Mapping[str, Any], where: str = "run.json") -> Fit:
    """The Fit a run.json (as `read_run_file` returns it) records: geometry from its encoder
    config, labels and targets from its schema; the tokenizer's sha256 and vocabulary size are
    recorded by runs written since `graphattn evaluate` compared them (None in older runs)."""
    schema = schema_from_text(run["schema_text"], where)
    encoder = run["encoder"]
    sha, size = run.get("tokenizer_sha256"), run.get("tokenizer_vocab_size")
    if sha is not None and not (isinstance(sha, str) and len(sha) == SHA256_HEX):
        raise GraphattnError(
            f"expected null or a sha256 (64 hex digits), found {sha!r:.80}", file=where, path=("tokenizer_sha256",)
        )
    if size is not None and not (isinstance(size, int) and not isinstance(size, bool) and 1 <= size < 1 << 31):
        raise GraphattnError(
            f"expected null or a positive integer, found {size!r:.40}", file=where, path=("tokenizer_vocab_size",)
        )
    return Fit(
        schema_name=schema.name,
        relative_pos_max_distance=encoder["relative_pos_max_distance"],
        local_radius=encoder["local_radius"],
        labels=tuple(schema.label_vocab().names),
        targets={name: schema.targets[name] for name in run["targets"] if name in schema.targets},
        tokenizer=run.get("tokenizer") if isinstance(run.get("tokenizer"), str) else None,
        tokenizer_sha256=sha,
        tokenizer_vocab_size=size,
    )


def _first_shard(shards) -> tuple[str, Any]:
    """(path, checked footer) of the first shard of a ShardSet, a ShardInfo or a shard source."""
    from graphattn.shards.reader import ShardInfo, read_info, shard_paths

    if isinstance(shards, ShardInfo):
        return shards.path, shards
    paths = shards.paths if hasattr(shards, "paths") else shard_paths(shards)
    return paths[0], read_info(paths[0])


def _owner(name: str) -> str:
    """English possessive: "the run" -> "the run's", "the shards" -> "the shards'"."""
    return name + ("'" if name.endswith("s") else "'s")


def _tokenizer_words(fit: Fit) -> str:
    name = f"{fit.tokenizer!r}" if fit.tokenizer else "a tokenizer"
    size = f"{fit.tokenizer_vocab_size} ids" if fit.tokenizer_vocab_size is not None else "ids not recorded"
    sha = f", sha256 {fit.tokenizer_sha256[:12]}" if fit.tokenizer_sha256 else ""
    return f"{name} ({size}{sha})"


def _target_difference(
    have: Fit, trained: Mapping[str, Any], names: Sequence[str] | None, have_name: str
) -> str | None:
    """The first of the model's targets (`trained`, or only `names` of them) that `have` lacks or
    holds as another kind, types or classes; None when all are there."""
    for name in names if names is not None else list(trained):
        wanted, found = trained.get(name), have.targets.get(name)
        if wanted is None:
            continue
        if found is None or (found.kind, found.types, found.classes) != (wanted.kind, wanted.types, wanted.classes):
            listed = ", ".join(f"{n} ({t.kind})" for n, t in have.targets.items()) or "none"
            return (
                f"{_owner(have_name)} schema {have.schema_name!r} has no target {name!r} like the model's "
                f"({wanted.kind}) (its targets: {listed}); "
                "use shards compiled with the schema the model was trained on"
            )
    return None


def first_difference(
    have: Fit, want: Fit, have_name: str, want_name: str, *, model_vocab: int | None = None
) -> str | None:
    """The first way `have` (the shards) differs from `want` (the run, or the reference shards),
    as the words of a one-line refusal; None when they fit. `model_vocab`: the model's embedding
    rows, checked when neither side records the tokenizer's sha256 or size."""
    for key in ("relative_pos_max_distance", "local_radius"):
        a, b = getattr(have, key), getattr(want, key)
        if a != b:
            return f"{key} {a} in {have_name}, {b} in {want_name}: compile them with {_owner(want_name)} schema"
    if have.labels != want.labels:
        extra = [x for x in have.labels if x not in want.labels] + [x for x in want.labels if x not in have.labels]
        said = f" ({extra[0]!r} is in one only)" if extra else " (the same labels in another order)"
        return (
            f"the relative-attention labels differ: {len(have.labels)} in {have_name}, {len(want.labels)} in "
            f"{want_name}{said}: compile them with {_owner(want_name)} schema"
        )
    tokenizers_differ = (
        have.tokenizer_sha256 != want.tokenizer_sha256
        if have.tokenizer_sha256 and want.tokenizer_sha256
        else have.tokenizer_vocab_size != want.tokenizer_vocab_size
        if have.tokenizer_vocab_size is not None and want.tokenizer_vocab_size is not None
        else False
    )
    if tokenizers_differ:
        return (
            f"tokenizer {_tokenizer_words(have)} in {have_name}, {_tokenizer_words(want)} in {want_name}: "
            f"compile them with {_owner(want_name)} tokenizer"
        )
    size = have.tokenizer_vocab_size
    if model_vocab is not None and isinstance(size, int) and size > model_vocab:
        return (
            f"the tokenizer of {have_name} has {size} ids, the model's embeddings only {model_vocab}: "
            "compile them with the run's tokenizer"
        )
    return None


def check_shards_fit_run(run: Mapping[str, Any], shards, *, flag: str = "--data", where: str = "run.json") -> None:
    """Refuse shards a trained model cannot read as it was trained (see the module docstring).

    `run`: run.json as `read_run_file` (or `load_task_model`) returns it; `shards`: a `ShardSet`
    (`graphattn.train.finetune.open_shards`), a `ShardInfo`, or a shard source (directories,
    files, globs); `flag`: the argument that named them, for the message; `where`: run.json's
    path, for a run.json that does not parse. Raises a GraphattnError naming the first shard
    file: "--data: relative_pos_max_distance 4 in the shards, 3 in the run: compile them with
    the run's schema"; returns None when they fit."""
    path, info = _first_shard(shards)
    have, want = shard_fit(info), run_fit(run, where)
    settings = run.get("settings") if isinstance(run.get("settings"), Mapping) else None
    lifted = settings is None or settings.get("init_from") is not None
    model_vocab = run["encoder"].get("vocab_size")
    if not lifted and want.tokenizer_vocab_size is None:  # a random encoder has exactly the tokenizer's ids
        want = replace(want, tokenizer_vocab_size=model_vocab)
    problem = _target_difference(have, want.targets, None, "the shards") or first_difference(
        have, want, "the shards", "the run", model_vocab=model_vocab
    )
    if problem:
        raise GraphattnError(f"{flag}: {problem}", file=path)


def check_shards_match(
    reference,
    other,
    *,
    flag: str,
    reference_flag: str = "--data",
    targets: Sequence[str] | None = None,
    schema: Any = None,
) -> None:
    """Refuse `other` shards (e.g. `train --eval-data`) that a model trained on `reference`
    shards (`--data`) could not read as it was trained: the same comparison as
    `check_shards_fit_run`, before any training. `targets`: the names the model trains (default:
    all of its schema's); `schema` (a file, shipped name or Schema): the schema the model's heads
    come from when it is not the reference footer's (`train --schema`); `reference` None (raw
    records, not compiled yet): only the targets are compared, with `schema`'s."""
    from graphattn.schema import load_schema

    path, info = _first_shard(other)
    have = shard_fit(info)
    want = shard_fit(_first_shard(reference)[1]) if reference is not None else None
    if schema is not None:
        trained = dict(load_schema(schema).targets)
    else:
        trained = dict(want.targets) if want is not None else {}
    shown = f"the {flag} shards"
    problem = _target_difference(have, trained, targets, shown)
    if problem is None and want is not None:
        problem = first_difference(have, want, shown, f"the {reference_flag} shards")
    if problem:
        raise GraphattnError(f"{flag}: {problem}", file=path)
