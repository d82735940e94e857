"""What a browser's default style sheet says about an element, without a browser.

OpenKP's VDOM features come from a rendered page: computed `display`, font size and weight.
We do not render, so we compute the same properties from what the HTML itself fixes: the
user-agent defaults of each tag (HTML Living Standard, "Rendering") overridden by the element's
inline ``style`` attribute and the legacy ``<font size>``. Style sheets and classes are not
applied; that is the documented limit of the approximation.
"""

from __future__ import annotations

import re

import numpy as np

# -- display ---------------------------------------------------------------------------------
BLOCK_TAGS = frozenset(
    """address article aside blockquote body center dd details dialog dir div dl dt fieldset
    figcaption figure footer form h1 h2 h3 h4 h5 h6 header hgroup hr html legend li listing main
    menu nav ol p plaintext pre search section summary ul xmp table caption thead tbody tfoot tr
    td th optgroup option""".split()
)
TABLE_CELL_TAGS = frozenset({"td", "th"})
HEADING_TAGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
# Never rendered: their content is not part of the visible text.
INVISIBLE_TAGS = frozenset(
    {
        "head",
        "title",
        "script",
        "style",
        "template",
        "noscript",
        "iframe",
        "object",
        "embed",
        "meta",
        "link",
        "base",
        "param",
        "source",
        "track",
        "datalist",
    }
)
# white-space: pre (the parser already dropped the one newline right after <pre>).
PREFORMATTED_TAGS = frozenset({"pre", "listing", "xmp", "plaintext", "textarea"})
BOLD_TAGS = frozenset({"b", "strong", "th", "h1", "h2", "h3", "h4", "h5", "h6", "dt"})

BLOCK_DISPLAYS = frozenset(
    {
        "block",
        "list-item",
        "table",
        "flex",
        "grid",
        "flow-root",
        "table-row",
        "table-row-group",
        "table-header-group",
        "table-footer-group",
        "table-caption",
        "table-cell",
    }
)
INLINE_DISPLAYS = frozenset({"inline", "inline-block", "inline-flex", "inline-grid", "inline-table"})

# -- font size -------------------------------------------------------------------------------
DEFAULT_FONT_PX = 16.0
MONOSPACE_FONT_PX = 13.0  # browsers' default monospace size
# Tag defaults as a factor of the parent's size (h1 2em, h2 1.5em, ... small "smaller").
TAG_FONT_SCALE = {
    "h1": 2.0,
    "h2": 1.5,
    "h3": 1.17,
    "h4": 1.0,
    "h5": 0.83,
    "h6": 0.67,
    "small": 1 / 1.2,
    "big": 1.2,
    "sub": 0.83,
    "sup": 0.83,
}
MONOSPACE_TAGS = frozenset({"pre", "code", "kbd", "samp", "tt", "listing", "xmp", "plaintext"})
KEYWORD_FONT_PX = {
    "xx-small": 9.0,
    "x-small": 10.0,
    "small": 13.0,
    "medium": 16.0,
    "large": 18.0,
    "x-large": 24.0,
    "xx-large": 32.0,
    "xxx-large": 48.0,
}
LEGACY_FONT_SIZE_PX = {1: 10.0, 2: 13.0, 3: 16.0, 4: 18.0, 5: 24.0, 6: 32.0, 7: 48.0}

# ETC's OpenKP font-size ids: each cutoff is the largest size (px, rounded) of its bucket;
# sizes above the last cutoff get the final id. 23 cutoffs -> 24 buckets.
FONT_SIZE_CUTOFFS = np.array([0, *range(8, 25), 29, 34, 39, 44, 49])
FONT_SIZE_BUCKETS = len(FONT_SIZE_CUTOFFS) + 1


def font_size_bucket(font_px: float | np.ndarray) -> int | np.ndarray:
    """OpenKP's font id: the first bucket whose cutoff is >= the rounded size (vectorized)."""
    bucket = np.searchsorted(FONT_SIZE_CUTOFFS, np.rint(font_px), side="left")
    return int(bucket) if np.ndim(bucket) == 0 else bucket


_DECLARATION = re.compile(r"([a-zA-Z-]+)\s*:\s*([^;]+)")
_LENGTH = re.compile(r"^([0-9]*\.?[0-9]+)\s*(px|pt|em|rem|%|pc|in|cm|mm)?$")
_UNIT_PX = {"px": 1.0, "pt": 4 / 3, "pc": 16.0, "in": 96.0, "cm": 96 / 2.54, "mm": 96 / 25.4}


def inline_style(style: str | None) -> dict[str, str]:
    """``"display:none; Font-Size: 2em"`` -> ``{"display": "none", "font-size": "2em"}``."""
    if not style:
        return {}
    return {
        name.lower(): value.strip().lower().removesuffix("!important").strip()
        for name, value in _DECLARATION.findall(style)
    }


def computed_font_px(tag: str, style: dict[str, str], size_attr: str | None, parent_px: float) -> float:
    """The element's font size in px: inherited, scaled by the tag default, then overridden."""
    px = MONOSPACE_FONT_PX if tag in MONOSPACE_TAGS and parent_px == DEFAULT_FONT_PX else parent_px
    px *= TAG_FONT_SCALE.get(tag, 1.0)
    if tag == "font" and size_attr:
        px = _legacy_font_size(size_attr.strip(), px)
    value = style.get("font-size")
    if value:
        px = _css_font_size(value, parent_px, px)
    return px


def _legacy_font_size(value: str, current: float) -> float:
    try:
        level = int(value) if value[0] not in "+-" else 3 + int(value)
    except ValueError:
        return current
    return LEGACY_FONT_SIZE_PX[min(max(level, 1), 7)]


def _css_font_size(value: str, parent_px: float, current: float) -> float:
    if value in KEYWORD_FONT_PX:
        return KEYWORD_FONT_PX[value]
    if value == "smaller":
        return parent_px / 1.2
    if value == "larger":
        return parent_px * 1.2
    match = _LENGTH.match(value)
    if not match:
        return current  # calc(), var(), ... : what a style sheet would need to resolve
    number, unit = float(match.group(1)), match.group(2) or "px"
    if unit == "em":
        return number * parent_px
    if unit == "%":
        return number * parent_px / 100
    if unit == "rem":
        return number * DEFAULT_FONT_PX
    return number * _UNIT_PX[unit]


def is_bold_style(tag: str, style: dict[str, str], parent_bold: bool) -> bool:
    weight = style.get("font-weight")
    if weight is None:
        return parent_bold or tag in BOLD_TAGS
    if weight in ("bold", "bolder"):
        return True
    if weight == "lighter":
        return False
    return weight.isdigit() and int(weight) >= 600


def display_of(tag: str, style: dict[str, str]) -> str:
    display = style.get("display")
    if display:
        return display.split()[0]
    if tag in TABLE_CELL_TAGS:
        return "table-cell"
    return "block" if tag in BLOCK_TAGS else "inline"


def is_hidden(tag: str, element, style: dict[str, str]) -> bool:
    """Not rendered: invisible tags, the `hidden` attribute, display:none, visibility:hidden."""
    return (
        tag in INVISIBLE_TAGS
        or element.get("hidden") is not None
        or style.get("display") == "none"
        or style.get("visibility") in ("hidden", "collapse")
        or (tag == "input" and (element.get("type") or "").lower() == "hidden")
        or (tag == "dialog" and element.get("open") is None)
    )
