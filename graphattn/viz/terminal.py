"""A text view of an instance's attention pattern, for a quick look without leaving the shell.

One character per cell (then a space, so cells look square): ■ allowed, □ masked in the plain
style; the label's letter in the `letters` style; a ■ in the label's color in the `color` style
(24-bit ANSI). Rows are queries named by token; a │ and a ─ line split global from long. Views
wider than a terminal fall back to blocks shaded by the share of allowed pairs.
"""

from __future__ import annotations

import os
import string
import sys

import numpy as np

from graphattn.contract import EtcInstance
from graphattn.errors import GraphattnError
from graphattn.viz.blocks import block_summary, choose_block_size
from graphattn.viz.palette import label_colors, legend_order, to_uint8
from graphattn.viz.pattern import MASKED, AxisRange, Pattern

STYLES = ("plain", "letters", "color")
LETTERS = string.ascii_lowercase + string.ascii_uppercase + string.digits
MAX_TOKEN_COLUMNS = 100
MAX_TOKEN_ROWS = 200
MAX_BLOCKS = 64
NAME_WIDTH = 18
SHADES = "░▒▓█"  # (0, 1/4], (1/4, 1/2], (1/2, 3/4], (3/4, 1] of pairs allowed


class _Glyphs:
    def __init__(self, ascii_only: bool):
        if ascii_only:
            self.filled, self.empty, self.dot, self.bar, self.rule, self.cross, self.shades = (
                "#",
                ".",
                ".",
                "|",
                "-",
                "+",
                ".:x#",
            )
        else:
            self.filled, self.empty, self.dot, self.bar, self.rule, self.cross, self.shades = (
                "■",
                "□",
                "·",
                "│",
                "─",
                "┼",
                SHADES,
            )


def label_letter(label: int) -> str:
    return LETTERS[label] if 0 <= label < len(LETTERS) else "*"


def pick_style(stream=None) -> tuple[str, bool]:
    """(style, ascii_only) that `stream` (default stdout) can show: color on a terminal that
    allows it (NO_COLOR unset, TERM not dumb), letters otherwise; ASCII where ■ cannot be encoded."""
    stream = stream or sys.stdout
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        "■□│─┼░▒▓█…".encode(encoding)
        ascii_only = False
    except (UnicodeEncodeError, LookupError):
        ascii_only = True
    tty = hasattr(stream, "isatty") and stream.isatty()
    color = tty and "NO_COLOR" not in os.environ and os.environ.get("TERM", "") not in ("", "dumb")
    return ("color" if color else "letters"), ascii_only


def terminal_view(
    source: EtcInstance | Pattern,
    queries: AxisRange | None = None,
    keys: AxisRange | None = None,
    *,
    style: str = "letters",
    ascii_only: bool = False,
    name_width: int = NAME_WIDTH,
) -> str:
    """The pattern of `queries` x `keys` (default: everything) as text lines; row names are
    cut at `name_width` characters."""
    if style not in STYLES:
        raise GraphattnError(f"terminal style {style!r}: expected one of {', '.join(STYLES)}")
    pattern = source if isinstance(source, Pattern) else Pattern(source)
    queries, keys = pattern.checked(queries, "queries"), pattern.checked(keys, "keys")
    glyphs = _Glyphs(ascii_only)
    colors = to_uint8(label_colors(pattern.vocab))
    if len(keys) <= MAX_TOKEN_COLUMNS and len(queries) <= MAX_TOKEN_ROWS:
        labels = pattern.labels(queries, keys)
        cells = _token_cells(labels, style, glyphs, colors)
        row_names = [pattern.position_name(p, name_width) for p in range(queries.start, queries.stop)]
        row_starts, col_starts = np.arange(queries.start, queries.stop), np.arange(keys.start, keys.stop)
        present = np.unique(labels[labels != MASKED])
        note = None
    else:
        size = choose_block_size(max(len(queries), len(keys)), MAX_BLOCKS)
        summary = block_summary(pattern, queries, keys, size)
        # plain shows how much is allowed; letters and color the drawn label and its share
        share = summary.share if style == "plain" else summary.drawn_share
        cells = _block_cells(summary.drawn, share, style, glyphs, colors)
        row_starts, col_starts = summary.queries.starts, summary.keys.starts
        row_names = [_block_name(pattern, a, b) for a, b in zip(summary.queries.starts, summary.queries.stops)]
        present = summary.labels_present()
        s = glyphs.shades
        shading = f"{s[0]} <=25% {s[1]} <=50% {s[2]} <=75% {s[3]} >75% of pairs allowed"
        what = "structure label (schema label, belongs) if any pair has one, else most common label"
        explained = {
            "plain": shading,
            "letters": f"letter = {what}",
            "color": f"color = {what}; {shading.replace('allowed', 'with it')}",
        }
        note = f"blocks of up to {size} tokens; {explained[style]}"
    if ascii_only:  # token text and the cut mark may be anything; keep every line ASCII
        row_names = [name.replace("…", "~").encode("ascii", "replace").decode("ascii") for name in row_names]
    lines = _grid_lines(pattern, cells, row_names, row_starts, col_starts, glyphs)
    legend = _legend(pattern, present, style, glyphs, colors)
    return "\n".join([*legend, *([note] if note else []), *lines]) + "\n"


def _block_name(pattern: Pattern, start: int, stop: int) -> str:
    G = pattern.global_length
    part, origin = ("G", 0) if start < G else ("L", G)
    first, last = start - origin, stop - 1 - origin
    return f"{part}{first}" if first == last else f"{part}{first}-{last}"


def _colored(symbol: str, rgb: np.ndarray) -> str:
    return f"\x1b[38;2;{rgb[0]};{rgb[1]};{rgb[2]}m{symbol}\x1b[0m"


def _token_cells(labels: np.ndarray, style: str, glyphs: _Glyphs, colors: np.ndarray) -> np.ndarray:
    """One string per cell; a lookup table per label keeps this one fancy-index, no cell loop."""
    if style == "plain":
        table = [glyphs.filled] * len(colors)
    elif style == "letters":
        table = [label_letter(i) for i in range(len(colors))]
    else:
        table = [_colored(glyphs.filled, c) for c in colors]
    masked = glyphs.empty if style == "plain" else glyphs.dot
    return np.array([*table, masked], dtype=object)[labels]


def _block_cells(
    dominant: np.ndarray, share: np.ndarray, style: str, glyphs: _Glyphs, colors: np.ndarray
) -> np.ndarray:
    level = np.clip(np.ceil(share * 4).astype(int) - 1, -1, 3)  # -1 = nothing allowed
    shades = np.array([*glyphs.shades, " "], dtype=object)[level]
    if style == "plain":
        return shades
    if style == "letters":
        letters = np.array([label_letter(i) for i in range(len(colors))] + [" "], dtype=object)
        return letters[dominant]
    table = np.array([[_colored(s, c) for s in glyphs.shades] for c in colors] + [[" "] * 4], dtype=object)
    return np.where(level >= 0, table[dominant, np.maximum(level, 0)], " ")


def _column_header(pattern: Pattern, col_starts: np.ndarray) -> list[str]:
    """Piece letter (G/L) over each part's first column, then its local index in digits, stacked."""
    G = pattern.global_length
    local = np.where(col_starts < G, col_starts, col_starts - G)
    marks = np.where(col_starts < G, "G", "L")
    first = np.r_[True, marks[1:] != marks[:-1]]
    digits = max(len(str(int(x))) for x in local)
    columns = [str(int(x)).rjust(digits) for x in local]
    rows = [[m if f else " " for m, f in zip(marks, first)]]
    rows += [[c[d] for c in columns] for d in range(digits)]
    return rows


def _grid_lines(pattern, cells, row_names, row_starts, col_starts, glyphs: _Glyphs) -> list[str]:
    G = pattern.global_length
    width = max(len(name) for name in row_names)
    split_col = int(np.searchsorted(col_starts, G))  # first long column
    split_row = int(np.searchsorted(row_starts, G))
    has_split_col = 0 < split_col < len(col_starts)

    def join(items, bar: str) -> str:
        items = list(items)
        if has_split_col:
            items = items[:split_col] + [bar] + items[split_col:]
        return " ".join(items)

    lines = [" " * width + "   " + join(row, " ") for row in _column_header(pattern, col_starts)]
    for r, name in enumerate(row_names):
        if r == split_row and 0 < split_row < len(row_names):
            rule = join([glyphs.rule] * len(col_starts), glyphs.cross).replace(" ", glyphs.rule)
            lines.append(glyphs.rule * (width + 3) + rule)
        lines.append(name.ljust(width) + " " + glyphs.bar + " " + join(cells[r], glyphs.bar))
    return [line.rstrip() for line in lines]


def _legend(pattern: Pattern, present: np.ndarray, style: str, glyphs: _Glyphs, colors: np.ndarray) -> list[str]:
    if style == "plain":
        return [f"{glyphs.filled} allowed  {glyphs.empty} masked"]
    lines, line, visible = [], "labels:", len("labels:")
    for label in legend_order(pattern.vocab, present):
        name = pattern.vocab.name(int(label))
        if style == "letters":
            entry = shown = f"{label_letter(int(label))}={name}"
        else:
            entry, shown = f"{_colored(glyphs.filled, colors[label])} {name}", f"{glyphs.filled} {name}"
        if visible + 2 + len(shown) > 100:  # wrap on what the terminal shows, not on escape codes
            lines.append(line)
            line, visible = " " * len("labels:"), len("labels:")
        line, visible = line + "  " + entry, visible + 2 + len(shown)
    return [*lines, line]
