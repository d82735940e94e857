"""What a run learned, step by step: `log.jsonl` in the run directory, and TensorBoard when installed.

Each line of `log.jsonl` is one logged step (every `--log-every` steps, and the last):

    {"step": 20, "epoch": 0, "lr": 4.2e-05, "grad_norm": 1.3, "loss": 2.1, "loss/answer": 1.4, ...}

`loss` is the mean total loss since the previous line, `loss/<target>` each target's share,
`accuracy/<target>` where the head has one, `lr` the learning rate of the last step. A resumed
run first drops the lines past the checkpoint it resumes from, so the file always tells one
history. When the `tensorboard` package is importable the same numbers also go to
`<run>/tensorboard/` through `torch.utils.tensorboard` (as HF Trainer does); it is not a
dependency. `graphattn plot RUN` draws the file (`graphattn.train.plot`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from graphattn.errors import GraphattnError

LOG_FILE = "log.jsonl"
TENSORBOARD_DIR = "tensorboard"
MAX_LOG_BYTES = 512 << 20  # a run logging every step for millions of steps stays under this


class RunLog:
    """Appends records to `directory/log.jsonl` (flushed per line) and to TensorBoard if present."""

    def __init__(self, directory: str | os.PathLike, resumed_step: int | None = None):
        self.path = Path(directory) / LOG_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_log(self.path, missing_ok=True) if r["step"] <= resumed_step] if resumed_step else []
        tmp = self.path.with_name(LOG_FILE + ".tmp")
        tmp.write_text("".join(_line(r) for r in kept), encoding="utf-8")
        os.replace(tmp, self.path)
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held for the whole fit
        self._board = _tensorboard_writer(Path(directory) / TENSORBOARD_DIR, resumed_step)

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(_line(record))
        self._handle.flush()
        if self._board is not None:
            step = int(record["step"])
            for name, value in record.items():
                if name not in ("step", "epoch") and isinstance(value, (int, float)):
                    self._board.add_scalar(name, value, step)

    def close(self) -> None:
        self._handle.close()
        if self._board is not None:
            self._board.close()


def _line(record: dict[str, Any]) -> str:
    clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in record.items()}
    if float(clean.get("step") or 0).is_integer():
        clean["step"] = int(record["step"])
    if isinstance(clean.get("epoch"), float) and clean["epoch"].is_integer():
        clean["epoch"] = int(clean["epoch"])
    return json.dumps(clean, sort_keys=True) + "\n"


def _tensorboard_writer(directory: Path, resumed_step: int | None):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is not installed: log.jsonl alone
        return None
    return SummaryWriter(str(directory), purge_step=resumed_step + 1 if resumed_step else None)


def read_log(path: str | os.PathLike, missing_ok: bool = False) -> list[dict[str, Any]]:
    """The records of a log.jsonl, each checked to be an object with an integer `step`; a bad
    line is one error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        if missing_ok:
            return []
        raise GraphattnError(
            f"no {LOG_FILE} here: name a `graphattn train --out` directory (runs log every --log-every steps)",
            file=str(path.parent),
        )
    if path.stat().st_size > MAX_LOG_BYTES:
        raise GraphattnError(f"{LOG_FILE} is larger than {MAX_LOG_BYTES >> 20} MB", file=str(path))
    records = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as err:
                if not text.endswith("\n"):  # the last line of a run killed mid-write: not a record yet
                    break
                raise GraphattnError(f"not a JSON record ({err.msg})", file=str(path), line=number) from None
            step = record.get("step") if isinstance(record, dict) else None
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                raise GraphattnError(
                    "expected an object with a non-negative integer 'step'", file=str(path), line=number
                )
            records.append(record)
    return records
