"""A self-contained HTML viewer: the attention pattern on a canvas with zoom, pan and hover.

One file, no network: the script (viewer.js) and style are inlined, the instance is embedded
as zlib-compressed typed arrays in base64 (the page inflates them with the browser's
DecompressionStream). A compact instance travels as its compact form (owners, documents,
segments, hard rows, links, g2g edges: O(L + G + E)) and the page derives each pair's label
as `graphattn.compact` does, so a 262,144 + 20,000 instance fits in a few megabytes. A dense
instance travels as its four pieces (l2l as its [L, 2r+1] band), for instances up to
VIEWER_MAX_PAIRS. A block summary is embedded for the zoomed-out view, and the page switches to
one cell per pair once cells are a few pixels wide.
"""

from __future__ import annotations

import base64
import html
import json
import re
import zlib
from importlib import resources
from pathlib import Path

import numpy as np

from graphattn.contract import EtcInstance
from graphattn.errors import GraphattnError
from graphattn.viz.blocks import block_summary, choose_block_size
from graphattn.viz.compact_blocks import unique_pairs
from graphattn.viz.palette import MASKED_NAME, SHADE_FLOOR, label_colors, legend_order, to_hex
from graphattn.viz.pattern import AxisRange, Pattern

ALIGN = 8  # bytes; every typed array starts on a multiple so the page can view it in place
VIEWER_MAX_BLOCKS = 512  # per axis in the zoomed-out view
VIEWER_MAX_PAIRS = 1 << 26  # G x L embedded for a dense instance; 4096 x 256 is 1M


def _label_array(labels: np.ndarray, vocab_size: int) -> np.ndarray:
    """Label + 1 with 0 = masked, in the narrowest unsigned type that holds the vocabulary."""
    dtype = np.uint8 if vocab_size < 255 else np.uint16
    return (labels.astype(np.int64) + 1).astype(dtype)


def _pack(arrays: dict[str, np.ndarray]) -> tuple[str, dict]:
    """Concatenate arrays (aligned), compress, base64; return the text and where each array is."""
    chunks, index, offset = [], {}, 0
    for name, array in arrays.items():
        data = np.ascontiguousarray(array).tobytes()
        index[name] = {
            "dtype": array.dtype.name,
            "offset": offset,
            "length": int(array.size),
            "shape": list(array.shape),
        }
        padding = (-len(data)) % ALIGN
        chunks.append(data + b"\0" * padding)
        offset += len(data) + padding
    packed = zlib.compress(b"".join(chunks), 6)
    return base64.b64encode(packed).decode("ascii"), index


def viewer_data(
    source: EtcInstance | Pattern,
    title: str | None = None,
    queries: AxisRange | None = None,
    keys: AxisRange | None = None,
) -> tuple[dict, str]:
    """(metadata, base64 payload) that the page reads; metadata also indexes the payload.

    `queries` / `keys` set the range the page opens on (default: everything).
    """
    pattern = source if isinstance(source, Pattern) else Pattern(source)
    instance, vocab = pattern.instance, pattern.vocab
    G, L = pattern.global_length, pattern.long_length
    size = choose_block_size(pattern.size, VIEWER_MAX_BLOCKS)
    summary = block_summary(pattern, block_size=size)
    levels = list(instance.long_owners)
    arrays = _compact_arrays(pattern) if pattern.compact is not None else _dense_arrays(pattern)
    arrays.update(
        {
            "owners": np.stack([np.asarray(instance.long_owners[lv], np.int32) for lv in levels])
            if levels
            else np.zeros((0, L), np.int32),
            "docIndex": np.asarray(instance.long_doc_index, np.int32),
            "blockDrawn": summary.drawn.astype(np.int16),
            # share in 1/255ths, never rounded down to 0 where some pair carries the label
            "blockShare": np.where(summary.drawn >= 0, np.maximum(1, np.round(summary.drawn_share * 255)), 0).astype(
                np.uint8
            ),
            "qStarts": np.append(summary.queries.starts, summary.queries.stops[-1]).astype(np.int32),
            "kStarts": np.append(summary.keys.starts, summary.keys.stops[-1]).astype(np.int32),
        }
    )
    payload, index = _pack(arrays)
    meta = {
        "title": title or f"graphattn: G={G} global + L={L} long, radius {pattern.radius}",
        "G": G,
        "L": L,
        "radius": pattern.radius,
        "maxDistance": vocab.max_distance,
        "form": "compact" if pattern.compact is not None else "dense",
        "belongs": vocab.belongs,
        "doesNotBelong": vocab.does_not_belong,
        "crossLabel": int(pattern.compact.cross_segment_label) if pattern.compact is not None else -1,
        "shadeFloor": SHADE_FLOOR,
        "blockSize": size,
        "labels": list(vocab.names),
        "colors": [to_hex(c) for c in label_colors(vocab)],
        "present": legend_order(vocab, summary.labels_in_region()),
        "maskedName": MASKED_NAME,
        "globals": [{"type": t, "id": i} for t, i in zip(instance.global_node_types, instance.global_node_ids)],
        "tokens": [pattern.long_text(i) for i in range(L)],
        "levels": levels,
        "docIds": [d if d is not None else f"#{n}" for n, d in enumerate(instance.doc_ids)],
        "arrays": index,
        "initial": None if queries is None and keys is None else _initial_view(pattern, queries, keys),
    }
    return meta, payload


def _dense_arrays(pattern: Pattern) -> dict[str, np.ndarray]:
    """The four stored pieces, label + 1 (0 = masked)."""
    G, L, V = pattern.global_length, pattern.long_length, len(pattern.vocab)
    if G * L > VIEWER_MAX_PAIRS:
        raise GraphattnError(
            f"the viewer embeds a dense instance's l2g and g2l whole, and G x L = {G} x {L} is past "
            f"{VIEWER_MAX_PAIRS} pairs; "
            "compile it with compact=True (graphattn viz and shards do) or draw a block summary (.png/.svg)"
        )
    everything = slice(None)
    return {
        "g2g": _label_array(pattern.piece("g2g", everything, everything), V),
        "g2l": _label_array(pattern.piece("g2l", everything, everything), V),
        "l2g": _label_array(pattern.piece("l2g", everything, everything), V),
        "band": _label_array(pattern.band(everything), V),
    }


def _compact_arrays(pattern: Pattern) -> dict[str, np.ndarray]:
    """The compact form, from which the page derives every pair (viewer.js, compactCode).

    Links and g2g edges are sorted by their pair's key (query * G + key, exact in float64) for
    a binary search; a pair listed twice keeps its last label, as the dense derivation does."""
    c, G, L = pattern.compact, max(pattern.global_length, 1), pattern.long_length
    as64 = lambda a: np.asarray(a, np.int64)  # noqa: E731
    link_long, link_global, link_label = unique_pairs(as64(c.link_long), as64(c.link_global), as64(c.link_label), G)
    src, dst, edge_label = unique_pairs(as64(c.g2g_src), as64(c.g2g_dst), as64(c.g2g_label), G)
    return {
        "longDoc": np.asarray(c.long_doc, np.int32),
        "longSegment": np.asarray(c.long_segment, np.int32),
        "longHard": np.asarray(c.long_hard_l2g, np.uint8),
        "globalDoc": np.asarray(c.global_doc, np.int32),
        "globalSegment": np.asarray(c.global_segment, np.int32),
        "globalBlockable": np.asarray(c.global_blockable, np.uint8),
        "globalHard": np.asarray(c.global_hard_g2l, np.uint8),
        **({} if _same_owners(pattern) else {"compactOwners": np.asarray(c.owners, np.int32).reshape(-1, L)}),
        "linkKey": (link_long * G + link_global).astype(np.float64),
        "linkLabel": link_label.astype(np.int32),
        "edgeKey": (src * G + dst).astype(np.float64),
        "edgeLabel": edge_label.astype(np.int32),
    }


def _same_owners(pattern: Pattern) -> bool:
    """The compact owners are the instance's `long_owners` (then the page reads those for both)."""
    owners = list(pattern.instance.long_owners.values())
    compact = np.asarray(pattern.compact.owners)
    return len(owners) == compact.shape[0] and all(np.array_equal(a, b) for a, b in zip(owners, compact))


def _initial_view(pattern: Pattern, queries: AxisRange | None, keys: AxisRange | None) -> list[int]:
    queries, keys = queries or pattern.full_range(), keys or pattern.full_range()
    return [queries.start, queries.stop, keys.start, keys.stop]


def _json_for_script(value: dict) -> str:
    """JSON that cannot end its <script> element early."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


def viewer_html(
    source: EtcInstance | Pattern,
    title: str | None = None,
    queries: AxisRange | None = None,
    keys: AxisRange | None = None,
) -> str:
    """The whole page as a string."""
    meta, payload = viewer_data(source, title, queries, keys)
    template = resources.files("graphattn.viz").joinpath("viewer.html").read_text(encoding="utf-8")
    script = resources.files("graphattn.viz").joinpath("viewer.js").read_text(encoding="utf-8")
    replacements = {
        "{{TITLE}}": html.escape(meta["title"]),
        "{{META}}": _json_for_script(meta),
        "{{DATA}}": payload,
        "{{SCRIPT}}": script.replace("</script", "<\\/script"),
    }
    # one pass, so that token text that happens to read "{{DATA}}" is left alone
    return re.sub(r"\{\{(?:TITLE|META|DATA|SCRIPT)\}\}", lambda m: replacements[m.group(0)], template)


def write_viewer(
    source: EtcInstance | Pattern,
    path: str | Path,
    title: str | None = None,
    queries: AxisRange | None = None,
    keys: AxisRange | None = None,
) -> Path:
    """Write the viewer page; it opens on `queries` x `keys` when given."""
    path = Path(path)
    path.write_text(viewer_html(source, title, queries, keys), encoding="utf-8")
    return path
