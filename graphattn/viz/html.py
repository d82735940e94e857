"""A self-contained HTML viewer: the attention pattern on a canvas with zoom, pan and hover.

One file, no network: the script (viewer.js) and style are inlined, the instance is embedded
as zlib-compressed typed arrays in base64 (the page inflates them with the browser's
DecompressionStream). The four pieces travel as stored, l2l as its [L, 2r+1] band, so a
4096 + 256 instance stays small; a block summary is embedded for the zoomed-out view, and the
page switches to one cell per pair once cells are a few pixels wide.
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
from graphattn.viz.blocks import block_summary, choose_block_size
from graphattn.viz.palette import label_colors, to_hex
from graphattn.errors import GraphattnError
from graphattn.viz.pattern import AxisRange, Pattern

ALIGN = 8  # bytes; every typed array starts on a multiple so the page can view it in place
VIEWER_MAX_BLOCKS = 512  # per axis in the zoomed-out view
VIEWER_MAX_PAIRS = 1 << 26  # G x L embedded; 4096 x 256 is 1M


def _label_array(labels: np.ndarray, vocab_size: int) -> np.ndarray:
    """Label + 1 with 0 = masked, in the narrowest unsigned type that holds the vocabulary."""
    dtype = np.uint8 if vocab_size < 255 else np.uint16
    return (labels.astype(np.int64) + 1).astype(dtype)


def _pack(arrays: dict[str, np.ndarray]) -> tuple[str, dict]:
    """Concatenate arrays (aligned), compress, base64; return the text and where each array is."""
    chunks, index, offset = [], {}, 0
    for name, array in arrays.items():
        data = np.ascontiguousarray(array).tobytes()
        index[name] = {"dtype": array.dtype.name, "offset": offset, "length": int(array.size), "shape": list(array.shape)}
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
    if G * L > VIEWER_MAX_PAIRS:
        raise GraphattnError(
            f"the viewer embeds l2g and g2l whole, and G x L = {G} x {L} is past {VIEWER_MAX_PAIRS} pairs; "
            "draw a block summary (.png/.svg) or zoom with --queries/--keys there instead"
        )
    size = choose_block_size(pattern.size, VIEWER_MAX_BLOCKS)
    summary = block_summary(pattern, block_size=size)
    levels = list(instance.long_owners)
    arrays = {
        "g2g": _label_array(pattern.piece("g2g", slice(None), slice(None)), len(vocab)),
        "g2l": _label_array(pattern.piece("g2l", slice(None), slice(None)), len(vocab)),
        "l2g": _label_array(pattern.piece("l2g", slice(None), slice(None)), len(vocab)),
        "band": _label_array(pattern.band(slice(None)), len(vocab)),
        "owners": np.stack([np.asarray(instance.long_owners[lv], np.int32) for lv in levels]) if levels else np.zeros((0, L), np.int32),
        "docIndex": np.asarray(instance.long_doc_index, np.int32),
        "blockDominant": summary.dominant.astype(np.int16),
        # share in 1/255ths, never rounded down to 0 where some pair is allowed
        "blockShare": np.where(summary.allowed > 0, np.maximum(1, np.round(summary.share * 255)), 0).astype(np.uint8),
        "qStarts": np.append(summary.queries.starts, summary.queries.stops[-1]).astype(np.int32),
        "kStarts": np.append(summary.keys.starts, summary.keys.stops[-1]).astype(np.int32),
    }
    payload, index = _pack(arrays)
    present = summary.labels_in_region()
    meta = {
        "title": title or f"graphattn: G={G} global + L={L} long, radius {pattern.radius}",
        "G": G,
        "L": L,
        "radius": pattern.radius,
        "blockSize": size,
        "labels": list(vocab.names),
        "colors": [to_hex(c) for c in label_colors(vocab)],
        "present": [int(x) for x in present],
        "globals": [{"type": t, "id": i} for t, i in zip(instance.global_node_types, instance.global_node_ids)],
        "tokens": [pattern.long_text(i) for i in range(L)],
        "levels": levels,
        "docIds": [d if d is not None else f"#{n}" for n, d in enumerate(instance.doc_ids)],
        "arrays": index,
        "initial": None if queries is None and keys is None else _initial_view(pattern, queries, keys),
    }
    return meta, payload


def _initial_view(pattern: Pattern, queries: AxisRange | None, keys: AxisRange | None) -> list[int]:
    queries, keys = queries or pattern.full_range(), keys or pattern.full_range()
    return [queries.start, queries.stop, keys.start, keys.stop]


def _json_for_script(value: dict) -> str:
    """JSON that cannot end its <script> element early."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


def viewer_html(source: EtcInstance | Pattern, title: str | None = None, queries: AxisRange | None = None, keys: AxisRange | None = None) -> str:
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
