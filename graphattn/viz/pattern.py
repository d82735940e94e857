"""The attention pattern of one compiled instance, read piece by piece over [global ; long].

Every view indexes one square grid: position p < G is global token p, position p >= G is long
token p - G; rows are queries, columns keys. A cell holds the relative label id of the pair, or
-1 where the mask forbids it. Nothing here builds the whole [G+L, G+L] grid: callers ask for a
query range by a key range, and l2l is unrolled from its [L, 2r+1] band only inside that range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from graphattn.contract import EtcInstance, SideInputs
from graphattn.errors import BatchError, GraphattnError

MASKED = -1
PIECES = ("g2g", "g2l", "l2g", "l2l")


@dataclass(frozen=True)
class AxisRange:
    """Half-open range [start, stop) of positions on the [global ; long] axis."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def split(self, global_length: int) -> tuple[slice, slice]:
        """The part of this range in global positions and in long positions (piece-local)."""
        g = slice(min(self.start, global_length), min(self.stop, global_length))
        first_long = max(self.start, global_length) - global_length
        return g, slice(first_long, max(self.stop - global_length, first_long))


_BOUND = re.compile(r"^\s*([gGlL]?)\s*(-?\d+)?\s*$")


def parse_range(text: str | None, global_length: int, long_length: int, what: str = "range") -> AxisRange:
    """Parse `A:B` over [global ; long] positions; `g3`/`l10` count inside one part; blanks = ends.

    `l100:l200` is long tokens 100..199, `g0:g4` the first four globals, `:` everything.
    """
    total = global_length + long_length
    if text is None or text.strip() in ("", ":"):
        return AxisRange(0, total)
    parts = text.split(":")
    if len(parts) != 2:
        raise GraphattnError(f"{what} {text!r}: expected A:B (positions over [global ; long], e.g. 0:64 or l100:l200)")
    bounds = []
    for part, default in zip(parts, (0, total)):
        match = _BOUND.match(part)
        if not match:
            raise GraphattnError(
                f"{what} {text!r}: {part!r} is not a position (an integer, optionally prefixed g or l)"
            )
        prefix, number = match.group(1).lower(), match.group(2)
        if number is None:
            if prefix:
                raise GraphattnError(f"{what} {text!r}: {part!r} has a prefix but no number")
            bounds.append(default)
            continue
        value = int(number)
        bounds.append(value + (global_length if prefix == "l" else 0))
    start, stop = bounds
    if not 0 <= start < stop <= total:
        raise GraphattnError(
            f"{what} {text!r}: expected 0 <= A < B <= {total} "
            f"(G={global_length} globals, L={long_length} long tokens), got {start}:{stop}"
        )
    return AxisRange(start, stop)


def _masked_labels(mask: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return np.where(np.asarray(mask) != 0, np.asarray(ids, dtype=np.int32), MASKED).astype(np.int32)


class _DenseReader:
    """Slices of the eight stored arrays."""

    def __init__(self, side: SideInputs, global_length: int, long_length: int):
        self.side = side.to_numpy()
        self.radius = self.side.local_radius
        G, L = global_length, long_length
        width = self.side.l2l_att_mask.shape[-1]
        if width % 2 == 0:
            raise BatchError(f"l2l_att_mask has {width} columns, expected an odd 2r+1")
        expected = {"l2l": (L, width), "g2g": (G, G), "l2g": (L, G), "g2l": (G, L)}
        for piece, shape in expected.items():
            for kind in ("att_mask", "relative_att_ids"):
                name = f"{piece}_{kind}"
                actual = tuple(getattr(self.side, name).shape)
                if actual != shape:
                    raise BatchError(
                        f"side input {name} has shape {actual}, expected {shape} for G={G}, L={L}, r={self.radius}"
                    )

    def piece(self, name: str, rows: slice, cols: slice) -> tuple[np.ndarray, np.ndarray]:
        return getattr(self.side, f"{name}_att_mask")[rows, cols], getattr(self.side, f"{name}_relative_att_ids")[
            rows, cols
        ]

    def band(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        return self.side.l2l_att_mask[rows], self.side.l2l_relative_att_ids[rows]


class _CompactReader:
    """Ranges derived on demand from a CompactSideInputs: nothing bigger than the range asked for
    (a zoom into a 262K x 20K instance never builds a whole [L, G] or [G, G])."""

    def __init__(self, compact, global_length: int, long_length: int):
        if (compact.global_length, compact.long_length) != (global_length, long_length):
            raise BatchError(
                f"compact side inputs are for G={compact.global_length}, L={compact.long_length}, "
                f"but the instance has G={global_length}, L={long_length}"
            )
        self.compact = compact
        self.radius = int(compact.local_radius)

    def piece(self, name: str, rows: slice, cols: slice) -> tuple[np.ndarray, np.ndarray]:
        return getattr(self.compact, f"{name}_rows")(rows, cols)

    def band(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        return self.compact.l2l_rows(rows)


COMPACT_API = ("l2g_rows", "g2l_rows", "g2g_rows", "l2l_rows")


def side_reader(side, global_length: int, long_length: int):
    """A reader for dense SideInputs, a CompactSideInputs, or anything with `to_dense()`."""
    if all(hasattr(side, name) for name in COMPACT_API):
        return _CompactReader(side, global_length, long_length)
    if not isinstance(side, SideInputs) and hasattr(side, "to_dense"):
        side = side.to_dense()
    if not isinstance(side, SideInputs):
        raise BatchError(f"instance.side must be SideInputs or CompactSideInputs, got {type(side).__name__}")
    return _DenseReader(side, global_length, long_length)


class Pattern:
    """Label-or-masked lookups over [global ; long] for one instance; shapes checked once."""

    def __init__(self, instance: EtcInstance):
        self.instance = instance
        self.vocab = instance.label_vocab
        self.global_length = instance.global_length
        self.long_length = instance.long_length
        self.reader = side_reader(instance.side, self.global_length, self.long_length)
        self.radius = self.reader.radius
        # blocks.py counts a compact instance by class, straight from its arrays
        self.compact = self.reader.compact if isinstance(self.reader, _CompactReader) else None

    @property
    def size(self) -> int:
        return self.global_length + self.long_length

    def full_range(self) -> AxisRange:
        return AxisRange(0, self.size)

    def checked(self, span: AxisRange | None, what: str = "range") -> AxisRange:
        """`span` (default: everything), refused unless it is a non-empty range inside [0, G + L)."""
        if span is None:
            return self.full_range()
        if not 0 <= span.start < span.stop <= self.size:
            raise GraphattnError(
                f"{what} {span.start}:{span.stop} is not inside the instance's 0:{self.size} "
                f"(G={self.global_length} globals, L={self.long_length} long tokens)"
            )
        return span

    # -- pieces ------------------------------------------------------------------------------
    def piece(self, name: str, rows: slice, cols: slice) -> np.ndarray:
        """Labels of g2g, g2l or l2g in piece-local rows x cols (MASKED where not allowed)."""
        return _masked_labels(*self.reader.piece(name, rows, cols))

    def band(self, rows: slice) -> np.ndarray:
        """l2l labels of long queries `rows` as the [n, 2r+1] band; keys off the sequence masked."""
        labels = _masked_labels(*self.reader.band(rows))
        queries = np.arange(self.long_length)[rows]
        keys = queries[:, None] + np.arange(-self.radius, self.radius + 1)[None, :]
        labels[(keys < 0) | (keys >= self.long_length)] = MASKED
        return labels

    def l2l(self, rows: slice, cols: slice) -> np.ndarray:
        """l2l at true positions: long queries `rows` x long keys `cols`, unrolled from the band."""
        queries = np.arange(self.long_length)[rows]
        keys = np.arange(self.long_length)[cols]
        out = np.full((len(queries), len(keys)), MASKED, dtype=np.int32)
        if not len(queries) or not len(keys):
            return out
        # Only band columns that can land inside `cols` are read.
        offsets = keys[None, :] - queries[:, None] + self.radius
        inside = (offsets >= 0) & (offsets <= 2 * self.radius)
        band = self.band(rows)
        rows_at, cols_at = np.nonzero(inside)
        out[rows_at, cols_at] = band[rows_at, offsets[rows_at, cols_at]]
        return out

    def labels(self, queries: AxisRange, keys: AxisRange) -> np.ndarray:
        """[len(queries), len(keys)] label ids (MASKED where not allowed), built piece by piece."""
        G = self.global_length
        out = np.full((len(queries), len(keys)), MASKED, dtype=np.int32)
        qg, ql = queries.split(G)
        kg, kl = keys.split(G)
        n_qg, n_kg = qg.stop - qg.start, kg.stop - kg.start
        out[:n_qg, :n_kg] = self.piece("g2g", qg, kg)
        out[:n_qg, n_kg:] = self.piece("g2l", qg, kl)
        out[n_qg:, :n_kg] = self.piece("l2g", ql, kg)
        out[n_qg:, n_kg:] = self.l2l(ql, kl)
        return out

    # -- names -------------------------------------------------------------------------------
    def global_name(self, g: int) -> str:
        return f"{self.instance.global_node_types[g]}:{self.instance.global_node_ids[g]}"

    def long_text(self, i: int) -> str:
        """The token's text, or <id N> for a token the compiler inserted (such as [CLS])."""
        text = self.instance.long_token_text(i)
        return text if text else f"<id {int(self.instance.long_token_ids[i])}>"

    def position_name(self, p: int, width: int | None = None) -> str:
        """`G3 sentence:s1` or `L17 fox`, cut to `width` characters when given."""
        G = self.global_length
        name = f"G{p} {self.global_name(p)}" if p < G else f"L{p - G} {self.long_text(p - G)}"
        name = " ".join(name.split())  # newlines and tabs inside token text would break a tick
        if width is not None and len(name) > width:
            name = name[: max(width - 1, 1)] + "…"
        return name

    def owner_names(self, i: int) -> list[str]:
        """The graph nodes that own long token i, one per hierarchy level (outermost first)."""
        names = []
        for _level, owners in self.instance.long_owners.items():
            g = int(owners[i])
            if g >= 0:
                names.append(f"{self.global_name(g)} (G{g})")
        return names
