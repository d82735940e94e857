"""Draw one compiled instance as a picture (PNG or SVG through matplotlib's Agg backend).

Rows are queries and columns keys over [global ; long]; each allowed cell is colored by its
relative label, masked cells stay background, and the four pieces are framed and named. Up to
`token_limit` positions per axis every pair gets its own cell; past that the picture is a block
summary (see blocks.py: a block shows its structure label when it has one), and `queries=` /
`keys=` zoom to a range drawn at token level. The legend lists the labels drawn in one fixed
reading order (`palette.legend_order`) and what white means; the title wraps to the figure's
width and tick labels that would overlap (at the global/long boundary, say) are thinned.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.transforms import blended_transform_factory

from graphattn.contract import EtcInstance
from graphattn.errors import GraphattnError
from graphattn.viz.blocks import BlockSummary, block_summary
from graphattn.viz.palette import BACKGROUND, MASKED_NAME, label_colors, legend_order, shade
from graphattn.viz.pattern import MASKED, AxisRange, Pattern

DEFAULT_TOKEN_LIMIT = 384  # positions per axis drawn one cell per pair
DPI = 100
NAME_WIDTH = 22  # characters of a tick label before it is cut
TICKS_PER_AXIS = 64  # token-level ticks beyond this are thinned
LEGEND_ROWS = 26
PIECE_NAMES_IN = 0.7  # inches right of the grid kept for the row parts' piece names
TITLE_POINTS = 9
TICK_GAP = 1.4  # tick labels at least this many font heights apart


@dataclass
class Rendering:
    """A drawn figure plus what it shows; `cell_pixel` finds any cell in `rgba()`."""

    figure: Figure
    axes: object
    pattern: Pattern
    queries: AxisRange
    keys: AxisRange
    level: str  # "tokens" or "blocks"
    legend_labels: list[str]
    summary: BlockSummary | None = None

    def rgba(self) -> np.ndarray:
        """The picture as an [H, W, 4] uint8 array, exactly what a PNG of it holds."""
        canvas = self.figure.canvas
        canvas.draw()
        return np.asarray(canvas.buffer_rgba()).copy()

    def cell_pixel(self, query: int, key: int) -> tuple[int, int]:
        """(row, column) in `rgba()` of the center of the cell for positions (query, key)."""
        return self.point_pixel(query + 0.5, key + 0.5)

    def point_pixel(self, query: float, key: float) -> tuple[int, int]:
        """(row, column) in `rgba()` of a point in position coordinates (cell edges at integers)."""
        x, y = self.axes.transData.transform((key, query))
        height = self.figure.canvas.get_width_height()[1]
        return int(height - y), int(x)

    def save(self, path: str | Path) -> Path:
        """Write PNG or SVG, chosen by the suffix."""
        path = Path(path)
        if path.suffix.lower() not in (".png", ".svg"):
            raise GraphattnError(
                f"{path}: cannot write a picture with suffix {path.suffix!r}; "
                "use .png or .svg (or .html for the viewer)"
            )
        self.figure.savefig(path, format=path.suffix[1:].lower(), dpi=DPI)
        return path


def render(
    source: EtcInstance | Pattern,
    queries: AxisRange | None = None,
    keys: AxisRange | None = None,
    *,
    token_limit: int = DEFAULT_TOKEN_LIMIT,
    block_size: int | None = None,
    title: str | None = None,
) -> Rendering:
    """Draw `queries` x `keys` (default: the whole instance) at token level or as blocks."""
    pattern = source if isinstance(source, Pattern) else Pattern(source)
    queries, keys = pattern.checked(queries, "queries"), pattern.checked(keys, "keys")
    colors = label_colors(pattern.vocab)
    as_tokens = block_size is None and max(len(queries), len(keys)) <= token_limit
    summary = None
    if as_tokens:
        labels = pattern.labels(queries, keys)
        shown = np.unique(labels[labels != MASKED])
        image = np.vstack([colors, BACKGROUND])[labels]  # MASKED = -1 picks the background row
    else:
        summary = block_summary(pattern, queries, keys, block_size)
        shown = summary.labels_present()
        image = shade(np.vstack([colors, BACKGROUND])[summary.drawn], summary.drawn_share)
    shown = np.asarray(legend_order(pattern.vocab, shown), dtype=np.int64)

    title = title or _default_title(pattern, summary)
    figure, axes, font, title_lines = _figure(pattern, queries, keys, as_tokens, len(shown) + 1, title)
    if as_tokens:
        axes.imshow(
            image, extent=(keys.start, keys.stop, queries.stop, queries.start), interpolation="nearest", aspect="auto"
        )
    else:
        axes.pcolormesh(
            summary.keys.edges, summary.queries.edges, image, shading="flat", antialiased=False, rasterized=True
        )
    axes.set_xlim(keys.start, keys.stop)
    axes.set_ylim(queries.stop, queries.start)
    _frame_pieces(axes, pattern, queries, keys)
    _ticks(axes, pattern, queries, keys, as_tokens, font)
    names = [pattern.vocab.name(int(label)) for label in shown]
    _legend(axes, names, colors[shown])
    axes.set_title("\n".join(title_lines), fontsize=TITLE_POINTS, loc="left", pad=24)  # above the piece names
    return Rendering(figure, axes, pattern, queries, keys, "tokens" if as_tokens else "blocks", names, summary)


def _default_title(pattern: Pattern, summary: BlockSummary | None) -> str:
    head = (
        f"G={pattern.global_length} global + L={pattern.long_length} long, radius {pattern.radius}; "
        "rows = queries, columns = keys"
    )
    if summary is None:
        return head
    size = int(summary.queries.sizes.max())
    return (
        f"{head}\nblocks of up to {size} tokens: color = the block's structure label (a schema label, else "
        "belongs) if any pair has one, else its most common label; shade = share of the block's pairs with "
        "that label"
    )


# -- layout --------------------------------------------------------------------------------
def _figure(pattern: Pattern, queries: AxisRange, keys: AxisRange, as_tokens: bool, n_legend: int, title: str):
    """A figure whose margins fit tick labels, legend and the wrapped title, with the grid at a
    readable size; also the tick font and the title's lines."""
    longest = max(len(queries), len(keys))
    cell = float(np.clip(7.0 / longest, 0.06, 0.32)) if as_tokens else 8.0 / longest
    grid_w, grid_h = len(keys) * cell, len(queries) * cell
    name_chars = NAME_WIDTH if as_tokens else 6
    font = _tick_font(cell, longest, as_tokens)
    label_in = name_chars * font * 0.62 / 72 + 0.15
    legend_cols = max(1, math.ceil(n_legend / LEGEND_ROWS))
    left, bottom, right = label_in + 0.1, label_in + 0.1, PIECE_NAMES_IN + 0.3 + 1.6 * legend_cols
    width = left + grid_w + right
    # the title starts at the grid's left edge and may run to the figure's right edge
    chars = max(20, int((width - left - 0.1) * 72 / (TITLE_POINTS * 0.6)))
    title_lines = [line for part in title.split("\n") for line in (textwrap.wrap(part, chars) or [""])]
    top = (24 + 8 + len(title_lines) * TITLE_POINTS * 1.3) / 72 + 0.1  # piece names, pad, the title
    height = bottom + grid_h + top
    height = max(height, bottom + top + 0.22 * min(n_legend, LEGEND_ROWS) + 0.4)  # room for the legend
    figure = Figure(figsize=(width, height), dpi=DPI, facecolor=BACKGROUND)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((left / width, (height - top - grid_h) / height, grid_w / width, grid_h / height))
    axes.set_facecolor(BACKGROUND)
    return figure, axes, font, title_lines


def _tick_font(cell: float, longest: int, as_tokens: bool) -> float:
    """Token names as large as the spacing between ticks allows (points), 4 to 8."""
    if not as_tokens:
        return 7.0
    spacing = 1 if longest <= TICKS_PER_AXIS else _round_step(longest / TICKS_PER_AXIS)
    return float(np.clip(cell * spacing * 72 * 0.8, 4.0, 8.0))


def _frame_pieces(axes, pattern: Pattern, queries: AxisRange, keys: AxisRange) -> None:
    """Frame each piece in view and name it from the margins, so no name hides a cell: above
    each column part the pieces in it (top to bottom), right of each row part the pieces in it
    (left to right); a piece sits where its two mentions cross."""
    bounds = {"g": (0, pattern.global_length), "l": (pattern.global_length, pattern.size)}

    def visible(part: str, span: AxisRange) -> tuple[int, int] | None:
        lo, hi = max(bounds[part][0], span.start), min(bounds[part][1], span.stop)
        return (lo, hi) if hi > lo else None

    rows = {part: visible(part, queries) for part in "gl"}
    cols = {part: visible(part, keys) for part in "gl"}
    for q0, q1 in (span for span in rows.values() if span):
        for k0, k1 in (span for span in cols.values() if span):
            axes.add_patch(
                Rectangle((k0, q0), k1 - k0, q1 - q0, fill=False, edgecolor="black", linewidth=1.0, zorder=3)
            )
    style = dict(textcoords="offset points", fontsize=7, fontweight="bold")
    above = blended_transform_factory(axes.transData, axes.transAxes)
    for c, span in cols.items():
        if span:
            names = "\n".join(f"{r}2{c}" for r in "gl" if rows[r])
            axes.annotate(names, (sum(span) / 2, 1.0), xycoords=above, xytext=(0, 3), ha="center", va="bottom", **style)
    beside = blended_transform_factory(axes.transAxes, axes.transData)
    for r, span in rows.items():
        if span:
            names = "  ".join(f"{r}2{c}" for c in "gl" if cols[c])
            axes.annotate(names, (1.0, sum(span) / 2), xycoords=beside, xytext=(4, 0), ha="left", va="center", **style)


def _ticks(axes, pattern: Pattern, queries: AxisRange, keys: AxisRange, as_tokens: bool, font: float) -> None:
    figure = axes.figure
    box = axes.get_position()
    for span, inches, set_ticks, set_labels, rotation in (
        (keys, box.width * figure.get_figwidth(), axes.set_xticks, axes.set_xticklabels, 90),
        (queries, box.height * figure.get_figheight(), axes.set_yticks, axes.set_yticklabels, 0),
    ):
        points_per_position = inches * 72 / max(len(span), 1)
        positions = _tick_positions(pattern, span, as_tokens, min_gap=TICK_GAP * font / points_per_position)
        if as_tokens:
            labels = [pattern.position_name(int(p), NAME_WIDTH) for p in positions]
            set_ticks(positions + 0.5)
        else:
            G = pattern.global_length
            labels = [f"G{p}" if p < G else f"L{p - G}" for p in positions]
            set_ticks(positions)
        set_labels(labels, fontsize=font, rotation=rotation)
    axes.tick_params(length=2, pad=1)
    if as_tokens and axes.transData.transform((1, 0))[0] - axes.transData.transform((0, 0))[0] >= 8:
        # thin white lines between cells so neighbours read apart; cell centers are untouched
        axes.set_xticks(np.arange(keys.start, keys.stop + 1), minor=True)
        axes.set_yticks(np.arange(queries.start, queries.stop + 1), minor=True)
        axes.grid(which="minor", color="white", linewidth=0.6)
        axes.tick_params(which="minor", length=0)


def _tick_positions(pattern: Pattern, span: AxisRange, as_tokens: bool, min_gap: float = 0.0) -> np.ndarray:
    """Every position when few; otherwise the start of each part plus round steps inside it.

    Ticks closer than `min_gap` positions to a tick already kept are left out, the long part's
    start first, then the global part's, then the round steps: labels never overlap, and the
    global/long boundary keeps its name.
    """
    if as_tokens and len(span) <= TICKS_PER_AXIS:
        return np.arange(span.start, span.stop)
    step = _round_step(max(len(span) / (TICKS_PER_AXIS if as_tokens else 12), min_gap))
    G = pattern.global_length
    starts, steps = [], []
    for lo, hi, origin in ((max(span.start, G), span.stop, G), (span.start, min(span.stop, G), 0)):
        if hi > lo:
            starts.append(lo)
            first = origin + math.ceil((lo - origin) / step) * step
            steps.extend(range(first, hi, step))
    kept: list[int] = []
    for tick in [*starts, *steps]:
        if all(abs(tick - other) >= min_gap for other in kept):
            kept.append(tick)
    return np.unique(kept)


def _round_step(raw: float) -> int:
    """1, 2, 5, 10, 20, 50, ... at least `raw`."""
    magnitude = 10 ** max(0, math.floor(math.log10(max(raw, 1))))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def _legend(axes, names: list[str], colors: np.ndarray) -> None:
    """The labels drawn, in legend order, then what white means."""
    handles = [
        Patch(facecolor=color, edgecolor="black", linewidth=0.3, label=name) for name, color in zip(names, colors)
    ]
    handles.append(Patch(facecolor=BACKGROUND, edgecolor="black", linewidth=0.3, label=MASKED_NAME))
    grid_width = axes.get_position().width * axes.figure.get_figwidth()
    axes.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.0 + PIECE_NAMES_IN / grid_width, 1.0),
        borderaxespad=0.0,
        fontsize=7,
        title="relative label",
        title_fontsize=7,
        ncol=max(1, math.ceil(len(handles) / LEGEND_ROWS)),
        frameon=False,
    )
