"""The names inside a run directory's checkpoints, and what a checkpoint without its digest is
told: torch-free, so that `graphattn train`'s run-directory checks (graphattn.train.rundir)
answer before torch loads, with the very words the loader (graphattn.train.checkpoint) uses.

    step-00000100/          one complete checkpoint: digest.json is written last
    step-00000100.partial/  a save under way (or killed): never read
    latest                  names the newest complete checkpoint
"""

from __future__ import annotations

import re
from pathlib import Path

TRAINER_FILE = "trainer.pt"
DIGEST_FILE = "digest.json"
LATEST_FILE = "latest"
PARTIAL_SUFFIX = ".partial"
TRUST_FLAG = "--trust-undigested"  # train and evaluate: check a checkpoint without digest.json, then record it
STEP_NAME = re.compile(r"step-\d{8}")


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def step_directories(root: Path) -> list[Path]:
    """Every `step-N` directory under `root` (complete or not; never a `.partial`), oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if STEP_NAME.fullmatch(p.name) and p.is_dir())


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root` (their digest.json is in), oldest first."""
    return [p for p in step_directories(root) if (p / DIGEST_FILE).is_file()]


def undigested_message(directory: Path, previous: Path | None = None) -> str:
    """The one message a checkpoint without digest.json gets, wherever it is met: what it lacks,
    why, and the ways on (trust it; or set it aside for `previous`, the newest one with a digest)."""
    back = (
        f", or move it out of the run directory to use {previous.name} (the newest checkpoint with a {DIGEST_FILE})"
        if previous is not None
        else ""
    )
    return (
        f"checkpoint {directory.name} has no {DIGEST_FILE} (written by a graphattn from before checkpoint digests, "
        f"or its digest was removed), so its files cannot be checked; pass {TRUST_FLAG} to check that it loads and "
        f"record its {DIGEST_FILE}{back}"
    )


def undigested_newest(root: Path) -> tuple[Path, Path | None] | None:
    """(the newest step directory, the newest complete one before it) when the newest has no
    digest.json; None when it has one or there is none."""
    steps = step_directories(root)
    if not steps or (steps[-1] / DIGEST_FILE).is_file():
        return None
    complete = [p for p in steps[:-1] if (p / DIGEST_FILE).is_file()]
    return steps[-1], (complete[-1] if complete else None)
