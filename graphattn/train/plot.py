"""`graphattn plot RUN [--out curves.png]`: the learning curves of a training run, as a PNG.

Reads `RUN/log.jsonl` (what `graphattn train` logs every --log-every steps) and draws, against
the step: the total loss and each target's `loss/<name>`; the learning rate; each target's
`accuracy/<name>` where its head reports one. matplotlib, headless (Agg).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from graphattn.errors import GraphattnError
from graphattn.train.runlog import LOG_FILE, read_log


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="a `graphattn train --out` directory, or its log.jsonl")
    parser.add_argument("--out", help="PNG file to write (default: RUN/curves.png)")


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [p[0] for p in points], [float(p[1]) for p in points]


def plot_run(run: str | Path, out: str | Path | None = None) -> Path:
    """Draw RUN's log.jsonl to `out` (default RUN/curves.png); returns the file written."""
    run = Path(run)
    log = run if run.is_file() else run / LOG_FILE
    records = read_log(log)
    if not records:
        raise GraphattnError("the log holds no records yet (the run logs every --log-every steps)", file=str(log))
    target = Path(out) if out else log.parent / "curves.png"
    if target.suffix.lower() != ".png":
        raise GraphattnError("--out must name a .png file", file=str(target))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for r in records for k in r})
    losses = ["loss", *[k for k in keys if k.startswith("loss/")]]
    accuracies = [k for k in keys if k.startswith("accuracy/")]
    panels = 2 + bool(accuracies)
    figure, axes = plt.subplots(panels, 1, figsize=(8, 3 * panels), sharex=True, squeeze=False)
    axes = axes[:, 0]
    for key in losses:
        steps, values = _series(records, key)
        axes[0].plot(
            steps, values, label=key, linewidth=2.0 if key == "loss" else 1.2, marker="." if len(steps) < 40 else None
        )
    axes[0].set_ylabel("loss")
    axes[0].set_title(f"{log.parent.name}: {len(records)} logged steps, last step {records[-1]['step']}")
    axes[0].legend(fontsize="small")
    steps, values = _series(records, "lr")
    axes[1].plot(steps, values, color="tab:gray")
    axes[1].set_ylabel("learning rate")
    axes[1].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    for key in accuracies:
        steps, values = _series(records, key)
        axes[2].plot(steps, values, label=key)
    if accuracies:
        axes[2].set_ylabel("accuracy")
        axes[2].set_ylim(-0.02, 1.02)
        axes[2].legend(fontsize="small")
    axes[-1].set_xlabel("step")
    for axis in axes:
        axis.grid(alpha=0.3)
    figure.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=100)
    plt.close(figure)
    return target


def run(args: argparse.Namespace) -> int:
    if not Path(args.run).exists():
        raise GraphattnError("no such run directory or log file", file=args.run)
    print(f"wrote {plot_run(args.run, args.out)}")
    return 0
