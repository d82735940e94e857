"""The run directory of `graphattn train --out DIR`: who may write it, what it holds, and run.json.

    DIR/.graphattn.lock    held (flock) by the one `graphattn train` writing DIR
    DIR/run.json           the encoder config, the schema, the targets and the settings of the run
    DIR/log.jsonl          the logged steps (graphattn.train.runlog)
    DIR/tokenizer.json     the tokenizer the shards were compiled with, when found (`graphattn predict` reads it)
    DIR/step-NNNNNNNN/     checkpoints; DIR/latest names the newest (graphattn.train.checkpoint)
    DIR/compiled/          raw --data compiled into shards (kept by --overwrite)

`claim_run_directory` runs before torch is imported or any data read: it takes the lock, then
refuses a directory that holds a run unless --resume (continue it: every setting that shapes the
model or the data order must be the same, each difference named) or --overwrite (its checkpoints,
run.json and log are removed first). `read_run_file` checks run.json's keys, types and sizes
before anything is built from it. No torch here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from graphattn.corpus.lock import DirectoryLock
from graphattn.errors import GraphattnError
from graphattn.nn.config_fields import INT_BOUNDS
from graphattn.shards.runfile import format_version
from graphattn.train.checkpoint_dirs import (
    DIGEST_FILE,
    TRUST_FLAG,
    step_directories,
    undigested_message,
    undigested_newest,
)

RUN_FILE = "run.json"
RUN_FORMAT_NAME = "graphattn-train"
RUN_FORMAT_VERSION = 2  # what `graphattn train` writes now (version 1: settings and max_ngram could be absent)
RUN_FORMAT = f"{RUN_FORMAT_NAME}/{RUN_FORMAT_VERSION}"
MAX_RUN_BYTES = 16 << 20

# What `train` records in run.json's "settings" and a --resume must repeat: the model's shape and
# the data order. The length (--steps / --epochs), --checkpoint-every, --log-every, --eval-data,
# --workers and verbosity may change between a run and its resume.
RESUME_SETTINGS = (
    "data",
    "targets",
    "schema",
    "tokenizer",
    "init_from",
    "hidden_size",
    "layers",
    "heads",
    "dropout",
    "batch_size",
    "lr",
    "optimizer",
    "warmup_ratio",
    "accumulate",
    "precision",
    "buffer_size",
    "seed",
)

# Bounds on what run.json may ask a model to be (a damaged or hostile file must not allocate
# gigabytes): ETC-large is hidden 1024, 24 layers, 16 heads.
ENCODER_BOUNDS = {name: bounds for name, bounds in INT_BOUNDS.items() if name != "embedding_size"}
ENCODER_PARAMETERS_MAX = 20_000_000_000  # floats the encoder's largest matrices may hold together


def settings_of(values: dict[str, Any]) -> dict[str, Any]:
    """The RESUME_SETTINGS of a parsed command line (paths made absolute, so that a resume from
    another working directory compares equal)."""
    out = {}
    for key in RESUME_SETTINGS:
        value = values.get(key)
        if key == "data":
            value = [os.path.abspath(v) for v in value or []]
        elif key in ("schema", "tokenizer", "init_from") and value and os.path.exists(value):
            value = os.path.abspath(value)
        out[key] = value
    return out


def holds_run(directory: Path) -> bool:
    """A directory some `graphattn train` wrote: run.json, a checkpoint, `latest` or a log."""
    return directory.is_dir() and (
        any((directory / name).exists() for name in (RUN_FILE, "latest", "log.jsonl")) or any(directory.glob("step-*"))
    )


def claim_run_directory(
    out: str | os.PathLike, *, resume: bool, overwrite: bool, settings: dict[str, Any], trust_undigested: bool = False
) -> DirectoryLock:
    """Lock `out` for this run and check that it may be used as asked; the caller releases the
    lock when the run ends (the process exiting releases it too). A newest checkpoint without
    digest.json is named as such (never passed over for an older one); `trust_undigested` lets
    --resume go on to check it and record its digest (graphattn.train.checkpoint)."""
    directory = Path(out)
    if directory.exists() and not directory.is_dir():
        raise GraphattnError("--out must be a directory, but a file of that name exists", file=str(directory))
    try:
        lock = DirectoryLock(directory, "graphattn train").acquire()
    except OSError as err:
        raise GraphattnError(f"cannot write the run directory here: {err.strerror or err}", file=str(out)) from None
    try:
        if any(directory.glob("shard-*.parquet")) or format_version(_run_format(directory)) is not None:
            raise GraphattnError(
                "this directory holds the output of `graphattn compile` (shards, run.json); give it as --data and "
                "choose another --out",
                file=str(directory),
            )
        steps = step_directories(directory)
        undigested = undigested_newest(directory)
        if resume:
            if not steps:
                why = (
                    "no checkpoint: the run stopped before its first save); start it again with --overwrite"
                    if holds_run(directory)
                    else "no checkpoint); run without --resume to start"
                )
                raise GraphattnError(f"--resume: nothing to resume here ({why}", file=str(directory))
            if undigested is not None and not trust_undigested:
                raise GraphattnError(undigested_message(*undigested), file=str(undigested[0]))
            check_same_settings(read_run_file(directory / RUN_FILE).get("settings"), settings, directory)
            for partial in directory.glob("step-*.partial"):  # saves of a killed run; the lock says none runs
                shutil.rmtree(partial, ignore_errors=True)
        elif holds_run(directory):
            if not overwrite:
                if undigested is not None:
                    held = f"a training run (its newest checkpoint {undigested[0].name} has no {DIGEST_FILE})"
                    ways = f"pass --resume {TRUST_FLAG} to check it and continue from it, --overwrite to replace it"
                elif steps:
                    held = f"a training run (checkpoint {steps[-1].name})"
                    ways = "pass --resume to continue it, --overwrite to replace it"
                else:
                    held = "a training run that stopped before its first checkpoint (nothing to resume)"
                    ways = "pass --overwrite to start it again"
                raise GraphattnError(
                    f"this directory already holds {held}; {ways}, or choose another --out", file=str(directory)
                )
            remove_run(directory)
    except BaseException:
        lock.release()
        raise
    return lock


def _run_format(directory: Path) -> Any:
    try:
        return json.loads((directory / RUN_FILE).read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, AttributeError):
        return None


def remove_run(directory: Path) -> None:
    """--overwrite: the files a training run wrote (not DIR/compiled, not other files)."""
    for name in (RUN_FILE, "latest", "latest.tmp", "log.jsonl", "log.jsonl.tmp", TOKENIZER_FILE):
        (directory / name).unlink(missing_ok=True)
    for path in [*directory.glob("step-*"), directory / "tensorboard"]:
        if path.is_dir():
            shutil.rmtree(path)


TOKENIZER_FILE = "tokenizer.json"


def save_run_tokenizer(directory: str | os.PathLike, spec: str | None, sha256: str | None) -> bool:
    """Keep the tokenizer the shards were compiled with as DIR/tokenizer.json, so that `graphattn
    predict` compiles new documents with it wherever the run is moved. Only a tokenizer found
    here whose sha256 is the one the shards record is kept; False when there is none such (the
    run then names the tokenizer by its path only, and predict asks for it when it is gone)."""
    from graphattn.tokenize import HFTokenizer, load_tokenizer

    if not spec or not sha256 or (spec != "default" and not os.path.exists(spec)):
        return False
    try:
        tokenizer = load_tokenizer(spec)
    except (GraphattnError, OSError, ValueError):
        return False
    if not isinstance(tokenizer, HFTokenizer):
        return False
    text = tokenizer.tokenizer.to_str()
    if hashlib.sha256(text.encode()).hexdigest() != sha256:
        return False
    target = Path(directory) / TOKENIZER_FILE
    tmp = target.with_name(TOKENIZER_FILE + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    return True


def check_same_settings(old: Any, new: dict[str, Any], directory: Path) -> None:
    """--resume refused, with every difference named, when the settings that shape the model or
    the data order are not those of the run being resumed."""
    if not isinstance(old, dict):
        raise GraphattnError(
            f"{RUN_FILE} records no settings to compare with (format version 1, written before runs recorded "
            "them), so --resume cannot tell whether this run's settings are the same; start a new run with "
            "--overwrite or another --out",
            file=str(directory / RUN_FILE),
        )
    differ = [key for key in RESUME_SETTINGS if old.get(key) != new.get(key)]
    if differ:
        detail = "; ".join(
            f"--{k.replace('_', '-')} was {_short(old.get(k))}, now {_short(new.get(k))}" for k in differ
        )
        raise GraphattnError(
            f"--resume refused: the settings differ from the run being resumed ({detail}); use the run's own "
            "settings, or start a new run with --overwrite or another --out",
            file=str(directory / RUN_FILE),
        )


def _short(value: Any, width: int = 100) -> str:
    text = json.dumps(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def read_run_file(path: str | os.PathLike) -> dict[str, Any]:
    """run.json, checked before anything is built from it: size, JSON, format, the encoder's
    fields (types and bounds), the targets and the schema text."""
    path = Path(path)
    where = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_RUN_BYTES:
            raise GraphattnError(f"{RUN_FILE} is {size:,} bytes, more than any run writes", file=where)
        run = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GraphattnError(f"no {RUN_FILE} in the run directory", file=where) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise GraphattnError(f"{RUN_FILE} is damaged: {err}", file=where) from None
    if not isinstance(run, dict):
        raise GraphattnError(f"{RUN_FILE} must hold a JSON object, found {type(run).__name__}", file=where)
    if format_version(run.get("format")) is not None:  # any version of a compile's run.json
        raise GraphattnError(
            "this directory is the output of `graphattn compile`, not a training run; name a `graphattn train "
            "--out` directory",
            file=where,
        )
    version = run_format_version(run.get("format"))
    if version is None:
        raise GraphattnError(
            f"{RUN_FILE} has format {run.get('format')!r:.60}, expected {RUN_FORMAT_NAME}/<version> (a `graphattn "
            "train` run)",
            file=where,
        )
    if version not in (1, RUN_FORMAT_VERSION):
        raise GraphattnError(
            f"{RUN_FILE} has format {run['format']!r}, written by a newer graphattn; this one reads versions 1 and "
            f"{RUN_FORMAT_VERSION}: use the graphattn that wrote it",
            file=where,
        )
    if version == RUN_FORMAT_VERSION:  # every key is written: none may be missing
        missing = [key for key in RUN_KEYS if key not in run]
        if missing:
            raise GraphattnError(
                f"missing from {RUN_FILE} (format version {version} records it)", file=where, path=(missing[0],)
            )
        check_settings(run["settings"], where)
        for key, ok, expected in (
            ("schema_name", isinstance(run["schema_name"], str), "the schema's name"),
            ("data", isinstance(run["data"], list) and all(isinstance(p, str) for p in run["data"]), "shard paths"),
            ("tokenizer", run["tokenizer"] is None or isinstance(run["tokenizer"], str), "null or a tokenizer"),
        ):
            if not ok:
                raise GraphattnError(f"expected {expected}, found {run[key]!r:.60}", file=where, path=(key,))
    else:  # version 1 was written without settings (before --resume compared them) and without max_ngram at first
        run = {**run, "settings": run.get("settings"), "max_ngram": run.get("max_ngram")}
    check_encoder(run.get("encoder"), where, version)
    targets = run.get("targets")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise GraphattnError("expected a non-empty list of target names", file=where, path=("targets",))
    if not isinstance(run.get("schema_text"), str):
        raise GraphattnError("expected the schema's text", file=where, path=("schema_text",))
    ngram = run.get("max_ngram")
    if ngram is not None and not (_is_int(ngram) and 1 <= ngram <= 64):
        raise GraphattnError(
            f"expected null or an integer in [1, 64], found {ngram!r:.40}", file=where, path=("max_ngram",)
        )
    return run


RUN_KEYS = ("encoder", "targets", "schema_name", "schema_text", "data", "tokenizer", "max_ngram", "settings")


def run_format_version(value: Any) -> int | None:
    """The version in a train run.json's `format` ("graphattn-train/2" -> 2); None when it names
    no train run format."""
    if not isinstance(value, str) or not value.startswith(RUN_FORMAT_NAME + "/"):
        return None
    digits = value[len(RUN_FORMAT_NAME) + 1 :]
    return int(digits) if digits.isdigit() and len(digits) <= 6 and not digits.startswith("0") else None


def check_settings(settings: Any, where: str) -> None:
    """Version 2's settings: an object with every RESUME_SETTINGS key (null where not given)."""
    if not isinstance(settings, dict):
        raise GraphattnError("expected the run's settings (an object)", file=where, path=("settings",))
    missing = [key for key in RESUME_SETTINGS if key not in settings]
    if missing:
        raise GraphattnError(
            f"missing from the settings (format version {RUN_FORMAT_VERSION} records every one)",
            file=where,
            path=("settings", missing[0]),
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_encoder(encoder: Any, where: str, version: int = RUN_FORMAT_VERSION) -> None:
    """The encoder section's sizes are integers within ENCODER_BOUNDS, and together small
    enough to build (checked before EtcConfig, let alone a model, exists). run.json version 1
    may predate max_absolute_position_embeddings; version 2 writes every size."""
    if not isinstance(encoder, dict):
        raise GraphattnError("expected the encoder config (an object)", file=where, path=("encoder",))
    for key, (low, high) in ENCODER_BOUNDS.items():
        if key not in encoder and key == "max_absolute_position_embeddings" and version == 1:
            continue
        value = encoder.get(key)
        if not _is_int(value) or not low <= value <= high:
            raise GraphattnError(
                f"expected an integer in [{low:,}, {high:,}], found {value!r:.40}", file=where, path=("encoder", key)
            )
    for key in ("hidden_dropout_prob", "layer_norm_eps", "initializer_range"):
        value = encoder.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise GraphattnError(f"expected a number, found {value!r:.40}", file=where, path=("encoder", key))
    for key in [k for k in encoder if k.startswith("share_")] + [
        "global_token_projections",
        "relative_bias",
        "gradient_checkpointing",
    ]:
        value = encoder.get(key)
        if value is not None and not isinstance(value, bool):
            raise GraphattnError(f"expected true or false, found {value!r:.40}", file=where, path=("encoder", key))
    for key in ("hidden_act", "attention_backend"):
        value = encoder.get(key)
        if value is not None and not isinstance(value, str):
            raise GraphattnError(f"expected a name, found {value!r:.40}", file=where, path=("encoder", key))
    embedding = encoder.get("embedding_size")
    if embedding is not None and not (_is_int(embedding) and 1 <= embedding <= ENCODER_BOUNDS["hidden_size"][1]):
        raise GraphattnError(
            f"expected null or an integer in [1, {ENCODER_BOUNDS['hidden_size'][1]:,}], found {embedding!r:.40}",
            file=where,
            path=("encoder", "embedding_size"),
        )
    hidden = encoder["hidden_size"]
    weights = (  # an upper bound: every sharing switch off doubles the layer's matrices at most
        encoder["vocab_size"] * (embedding or hidden)
        + encoder.get("max_absolute_position_embeddings", 0) * hidden
        + encoder["num_hidden_layers"] * 2 * hidden * (4 * hidden + 2 * encoder["intermediate_size"])
    )
    if weights > ENCODER_PARAMETERS_MAX:
        raise GraphattnError(
            f"the encoder it describes would hold about {weights:,} weights, more than {ENCODER_PARAMETERS_MAX:,}",
            file=where,
            path=("encoder",),
        )
