"""The run directory of `graphattn train --out DIR`: who may write it, what it holds, and run.json.

    DIR/.graphattn.lock    held (flock) by the one `graphattn train` writing DIR
    DIR/run.json           the encoder config, the schema, the targets and the settings of the run
    DIR/log.jsonl          the logged steps (graphattn.train.runlog)
    DIR/step-NNNNNNNN/     checkpoints; DIR/latest names the newest (graphattn.train.checkpoint)
    DIR/compiled/          raw --data compiled into shards (kept by --overwrite)

`claim_run_directory` runs before torch is imported or any data read: it takes the lock, then
refuses a directory that holds a run unless --resume (continue it: every setting that shapes the
model or the data order must be the same, each difference named) or --overwrite (its checkpoints,
run.json and log are removed first). `read_run_file` checks run.json's keys, types and sizes
before anything is built from it. No torch here.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from graphattn.corpus.lock import DirectoryLock
from graphattn.errors import GraphattnError

RUN_FILE = "run.json"
RUN_FORMAT = "graphattn-train/1"
MAX_RUN_BYTES = 16 << 20
COMPILE_FORMAT = "graphattn-run/1"  # graphattn.corpus.output's run.json

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
ENCODER_BOUNDS = {
    "vocab_size": (1, 4_000_000),
    "type_vocab_size": (1, 65_536),
    "hidden_size": (1, 16_384),
    "num_hidden_layers": (1, 256),
    "num_attention_heads": (1, 1_024),
    "intermediate_size": (1, 65_536),
    "local_radius": (1, 65_536),
    "relative_pos_max_distance": (1, 65_536),
    "relative_vocab_size": (1, 65_536),
    "max_absolute_position_embeddings": (0, 1_048_576),
}
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


def _complete_steps(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("step-*") if (p / "digest.json").is_file() and p.name[5:].isdigit())


def claim_run_directory(
    out: str | os.PathLike, *, resume: bool, overwrite: bool, settings: dict[str, Any]
) -> DirectoryLock:
    """Lock `out` for this run and check that it may be used as asked; the caller releases the
    lock when the run ends (the process exiting releases it too)."""
    directory = Path(out)
    if directory.exists() and not directory.is_dir():
        raise GraphattnError("--out must be a directory, but a file of that name exists", file=str(directory))
    try:
        lock = DirectoryLock(directory, "graphattn train").acquire()
    except OSError as err:
        raise GraphattnError(f"cannot write the run directory here: {err.strerror or err}", file=str(out)) from None
    try:
        if any(directory.glob("shard-*.parquet")) or _run_format(directory) == COMPILE_FORMAT:
            raise GraphattnError(
                "this directory holds the output of `graphattn compile` (shards, run.json); give it as --data and "
                "choose another --out",
                file=str(directory),
            )
        if resume:
            steps = _complete_steps(directory)
            if not steps:
                raise GraphattnError(
                    "--resume: nothing to resume here (no complete checkpoint); run without --resume to start",
                    file=str(directory),
                )
            check_same_settings(read_run_file(directory / RUN_FILE).get("settings"), settings, directory)
            for partial in directory.glob("step-*.partial"):  # saves of a killed run; the lock says none runs
                shutil.rmtree(partial, ignore_errors=True)
        elif holds_run(directory):
            if not overwrite:
                steps = _complete_steps(directory)
                held = f"a training run (checkpoint {steps[-1]})" if steps else "a training run (no checkpoint yet)"
                raise GraphattnError(
                    f"this directory already holds {held}; pass --resume to continue it, --overwrite to replace it, "
                    "or choose another --out",
                    file=str(directory),
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
    for name in (RUN_FILE, "latest", "latest.tmp", "log.jsonl", "log.jsonl.tmp"):
        (directory / name).unlink(missing_ok=True)
    for path in [*directory.glob("step-*"), directory / "tensorboard"]:
        if path.is_dir():
            shutil.rmtree(path)


def check_same_settings(old: Any, new: dict[str, Any], directory: Path) -> None:
    """--resume refused, with every difference named, when the settings that shape the model or
    the data order are not those of the run being resumed."""
    if not isinstance(old, dict):
        raise GraphattnError(
            f"{RUN_FILE} records no settings to compare with (written by an older graphattn?); start a new run "
            "with --overwrite or another --out",
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
    if run.get("format") == COMPILE_FORMAT:
        raise GraphattnError(
            "this directory is the output of `graphattn compile`, not a training run; name a `graphattn train "
            "--out` directory",
            file=where,
        )
    if run.get("format") != RUN_FORMAT:
        raise GraphattnError(f"{RUN_FILE} has format {run.get('format')!r:.60}, expected {RUN_FORMAT!r}", file=where)
    check_encoder(run.get("encoder"), where)
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_encoder(encoder: Any, where: str) -> None:
    """The encoder section's sizes are integers within ENCODER_BOUNDS, and together small
    enough to build (checked before EtcConfig, let alone a model, exists)."""
    if not isinstance(encoder, dict):
        raise GraphattnError("expected the encoder config (an object)", file=where, path=("encoder",))
    for key, (low, high) in ENCODER_BOUNDS.items():
        if key not in encoder and key == "max_absolute_position_embeddings":
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
