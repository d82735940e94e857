"""One color per relative label, shared by every view (PNG/SVG, HTML, terminal).

Distances read as a ramp (keys to the right in reds, to the left in blues, darker = farther),
ownership as grey/green, and schema labels as distinct hues, so that a picture can be read
without the legend once one has seen a few. Every legend lists labels in one reading order
(`legend_order`): structure first, then distances from far left to far right, then masked.
"""

from __future__ import annotations

import colorsys

import numpy as np

from graphattn.labels import BELONGS, DOES_NOT_BELONG, LabelVocab, distance_id_count, first_schema_label_id

BACKGROUND = np.array([1.0, 1.0, 1.0])  # masked cells: nothing drawn
MASKED_NAME = "masked: may not attend"  # the legend's entry for the background
SHADE_FLOOR = 0.4  # a block with any pair of its label keeps at least this much of the color
SAME_POSITION = np.array([0.25, 0.25, 0.25])
NOT_OWNED = np.array([0.78, 0.78, 0.78])
OWNED = np.array([0.17, 0.63, 0.17])
# Hues far from the red/blue/green/grey used above, for labels that a schema declares.
SCHEMA_HUES = [
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#f0c000",
    "#7f3c8d",
    "#a05d00",
    "#00a19a",
    "#d62790",
    "#6b6b00",
]


def _hex_to_rgb(code: str) -> np.ndarray:
    return np.array([int(code[i : i + 2], 16) / 255.0 for i in (1, 3, 5)])


def _ramp(base_hue: float, steps: int) -> np.ndarray:
    """`steps` shades of one hue from light to dark (farther distances darker)."""
    lightness = np.linspace(0.72, 0.30, steps) if steps > 1 else np.array([0.5])
    return np.array([colorsys.hls_to_rgb(base_hue, light, 0.75) for light in lightness])


def _schema_color(index: int) -> np.ndarray:
    if index < len(SCHEMA_HUES):
        return _hex_to_rgb(SCHEMA_HUES[index])
    hue = (0.618033988749895 * index) % 1.0  # golden-ratio steps keep many hues apart
    return np.array(colorsys.hls_to_rgb(hue, 0.45, 0.65))


def label_colors(vocab: LabelVocab) -> np.ndarray:
    """[len(vocab), 3] RGB in 0..1, indexed by label id."""
    k = vocab.max_distance
    colors = np.zeros((len(vocab), 3))
    colors[0] = SAME_POSITION
    colors[1 : k + 1] = _ramp(0.0, k)  # dist:+1..+k, reds
    colors[k + 1 : distance_id_count(k)] = _ramp(0.6, k)  # dist:-1..-k, blues
    colors[vocab.id(DOES_NOT_BELONG)] = NOT_OWNED
    colors[vocab.id(BELONGS)] = OWNED
    for index in range(len(vocab.extra)):
        colors[first_schema_label_id(k) + index] = _schema_color(index)
    return colors


def to_uint8(colors: np.ndarray) -> np.ndarray:
    """The 0..255 value a PNG (or a canvas) stores for a 0..1 color."""
    return np.round(np.asarray(colors) * 255).astype(np.uint8)


def to_hex(color: np.ndarray) -> str:
    return "#" + "".join(f"{int(c):02x}" for c in to_uint8(color))


def shade(colors: np.ndarray, share: np.ndarray) -> np.ndarray:
    """Blend label colors toward the background by share of pairs (0 = background).

    A block with any such pair keeps at least SHADE_FLOOR of its color so it stays visible
    (the viewer's script blends with the same rule).
    """
    share = np.asarray(share, dtype=float)[..., None]
    alpha = np.where(share > 0, SHADE_FLOOR + (1 - SHADE_FLOOR) * share, 0.0)
    return BACKGROUND * (1 - alpha) + colors * alpha


def legend_order(vocab: LabelVocab, labels) -> list[int]:
    """`labels` (ids) in the reading order every legend uses: belongs, does_not_belong, the
    schema's labels, then distances from the farthest left through dist:0 to the farthest right."""
    k = vocab.max_distance
    order = [
        vocab.id(BELONGS),
        vocab.id(DOES_NOT_BELONG),
        *range(first_schema_label_id(k), len(vocab)),
        *range(2 * k, k, -1),
        0,
        *range(1, k + 1),
    ]
    present = {int(label) for label in labels}
    return [label for label in order if label in present]
