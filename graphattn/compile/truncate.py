"""Pass 2: choose which long tokens of each document go into an instance.

Policies (schema `truncation.policy`), all deciding on whole tokens and reporting in words:
- tail: keep the first tokens that fit;
- drop_longest_first: drop whole `unit` nodes (sentences), last first, from whichever context
  currently holds the most unit tokens (ETC's WikiHop recipe), then fall back to tail;
- windows: the pinned nodes (question) plus a window of the remaining tokens, moved by
  `stride`: several selections per document (NQ);
- error: refuse with a CompileError when the long tokens or the globals do not fit.
Under the other policies, globals that still do not fit are cut at assembly (last in global order first).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from graphattn.compile.layout import DocLayout, document_error
from graphattn.compile.ranges import count_in_ranges, coverage
from graphattn.errors import CompileError
from graphattn.schema import Schema


@dataclass
class Selection:
    """Tokens kept from one document (bool over its tokens, a subset of `is_long`)."""

    keep: np.ndarray
    messages: list[str] = field(default_factory=list)
    window: tuple[int, int] | None = None  # (first, stop) among the document's unpinned long tokens


def doc_sizes(layout: DocLayout, schema: Schema, keep: np.ndarray, *, whole: bool = False) -> tuple[int, int]:
    """(long length, global count) one document takes with these tokens kept.

    With `whole`, also the text past where tokenizing stopped (`DocLayout.cut_short`) counts as
    kept: its nodes as present, its tokens not at all (they were never counted), so the sizes
    are then lower bounds of the whole document's.
    """
    kept = layout.is_long & keep
    rows = layout.token_rows()
    has_kept = np.zeros(layout.n_nodes, dtype=bool)
    has_kept[rows] = count_in_ranges(kept, layout.ranges[rows, 0], layout.ranges[rows, 1]) > 0
    if whole and layout.long_past_cut is not None:
        has_kept |= layout.long_past_cut
    alive = ~layout.in_long | has_kept
    seps = int(np.count_nonzero(layout.type_flag("sep_after") & has_kept))
    long_len = len(schema.long_prefix) + int(np.count_nonzero(kept)) + seps
    globals_ = layout.selected & alive
    per_token = layout.of_types([n for n, t in schema.node_types.items() if t.global_mode == "per_token"])
    n_globals = len(schema.global_prefix) + int(np.count_nonzero(globals_ & ~per_token))
    expanded = np.flatnonzero(globals_ & per_token)
    n_globals += int((layout.ranges[expanded, 1] - layout.ranges[expanded, 0]).sum())
    if schema.fixed_blocks is not None:
        n_globals += -(-long_len // schema.fixed_blocks.tokens_per_block)
    return long_len, n_globals


def whole_sizes(layout: DocLayout, schema: Schema) -> tuple[int, int]:
    """`doc_sizes` of the whole document (every long token kept, `whole`), made once per layout
    and schema: selection, assembly's truncation report and packing each ask for it."""
    cached = layout._whole_sizes
    if cached is None or cached[0] is not schema:
        cached = layout._whole_sizes = (schema, doc_sizes(layout, schema, layout.is_long, whole=True))
    return cached[1]


def _sizes(layouts: list[DocLayout], schema: Schema, keeps: list[np.ndarray], whole: bool = False) -> tuple[int, int]:
    sizes = [doc_sizes(lay, schema, keep, whole=whole) for lay, keep in zip(layouts, keeps)]
    return sum(s[0] for s in sizes), sum(s[1] for s in sizes)


def _tail(layouts: list[DocLayout], schema: Schema, keeps: list[np.ndarray], messages: list[str]) -> list[np.ndarray]:
    """Keep the longest prefix of the (concatenated) long tokens that fits max_long_length."""
    positions, sep_firsts, offset = [], [], 0
    for lay, keep in zip(layouts, keeps):
        kept = np.flatnonzero(lay.is_long & keep)
        positions.append(kept)
        seps = np.flatnonzero(lay.type_flag("sep_after") & lay.in_long)
        first = np.searchsorted(kept, lay.ranges[seps, 0])
        last = np.searchsorted(kept, lay.ranges[seps, 1])
        sep_firsts.append(offset + first[last > first])
        offset += kept.size
    budget = schema.max_long_length - len(schema.long_prefix) * len(layouts)
    sep_first = np.sort(np.concatenate(sep_firsts)) if sep_firsts else np.zeros(0, np.int64)
    c = np.arange(offset + 1)
    fits = c + np.searchsorted(sep_first, c, side="left") <= budget
    cut = int(np.flatnonzero(fits).max(initial=0))
    if cut >= offset:
        return keeps
    out, start = [], 0
    for keep, kept in zip(keeps, positions):
        new = np.zeros_like(keep)
        take = kept[: max(0, min(kept.size, cut - start))]
        new[take] = True
        start += kept.size
        out.append(new)
    cut_short = [lay for lay in layouts if lay.cut_short]
    if cut_short:
        stopped = ", ".join(f"character {lay.tokenized_chars:,} of {len(lay.graph.text):,}" for lay in cut_short)
        messages.append(
            f"tail: kept the first {cut} of at least {offset} long tokens to fit max_long_length "
            f"{schema.max_long_length}; tokenizing stopped at {stopped} (nothing past it can be kept), "
            "so the sizes before truncation count the tokens up to there only"
        )
    else:
        limit = f"max_long_length {schema.max_long_length}"
        messages.append(f"tail: kept the first {cut} of {offset} long tokens to fit {limit}")
    return out


def _nearest_of_type(parent: np.ndarray, start: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each start node, its nearest proper ancestor whose `wanted` holds (-1: none)."""
    cur = parent[start].copy()
    found = np.full(start.shape[0], -1, dtype=np.int64)
    todo = cur >= 0
    while todo.any():  # one vectorized step per hierarchy level
        hit = todo.copy()
        hit[todo] = wanted[cur[todo]]
        found[hit] = cur[hit]
        todo &= ~hit
        cur[todo] = parent[cur[todo]]
        todo &= cur >= 0
    return found


def _drop_longest_first(layouts, schema: Schema, keeps, messages: list[str]) -> list[np.ndarray]:
    unit_type, ctx_type = schema.truncation.unit, schema.truncation.context
    long_len, n_globals = _sizes(layouts, schema, keeps)
    need_long = long_len - schema.max_long_length
    need_global = n_globals - schema.max_global_length if schema.node_types[unit_type].is_global else 0
    if need_long <= 0 and need_global <= 0:
        return keeps

    units_by_ctx: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    unit_tokens: dict[tuple[int, int], int] = {}
    for d, (lay, keep) in enumerate(zip(layouts, keeps)):
        kept = lay.is_long & keep
        units = np.flatnonzero(lay.of_types([unit_type]))
        lengths = count_in_ranges(kept, lay.ranges[units, 0], lay.ranges[units, 1])
        units, lengths = units[lengths > 0], lengths[lengths > 0]
        if ctx_type is not None:
            ctx = _nearest_of_type(lay.parent, units, lay.of_types([ctx_type]))
        else:
            ctx = lay.parent[units]
        # Globals that go with a unit: selected nodes starting inside it (itself included).
        gstarts = np.sort(lay.ranges[lay.selected & (lay.ranges[:, 1] > lay.ranges[:, 0]), 0])
        n_glob = np.searchsorted(gstarts, lay.ranges[units, 1]) - np.searchsorted(gstarts, lay.ranges[units, 0])
        for u, c, length, g in sorted(zip(units, ctx, lengths, n_glob), key=lambda x: lay.rank[x[0]]):
            key = (d, int(c))
            units_by_ctx.setdefault(key, []).append((int(u), int(length), int(g)))
            unit_tokens[key] = unit_tokens.get(key, 0) + int(length)
    heap = [(-size, -d, -c, (d, c)) for (d, c), size in unit_tokens.items()]
    heapq.heapify(heap)
    dropped: list[list[int]] = [[] for _ in layouts]
    count = 0
    remaining = sum(len(units) for units in units_by_ctx.values())
    while heap and (need_long > 0 or need_global > 0) and remaining > 1:  # never the last unit
        remaining -= 1
        neg_size, a, b, key = heapq.heappop(heap)
        unit, length, n_glob = units_by_ctx[key].pop()
        dropped[key[0]].append(unit)
        count += 1
        need_long -= length
        need_global -= n_glob
        if units_by_ctx[key]:
            heapq.heappush(heap, (neg_size + length, a, b, key))
    out = []
    for lay, keep, units in zip(layouts, keeps, dropped):
        units = np.asarray(units, dtype=np.int64)
        gone = coverage(lay.n_tokens, lay.ranges[units, 0], lay.ranges[units, 1]) if units.size else np.zeros_like(keep)
        out.append(keep & ~gone)
    if count:
        messages.append(
            f"drop_longest_first: dropped {count} {unit_type} node(s), last first, "
            "from the contexts with the most tokens "
            f"(max_long_length {schema.max_long_length}, max_global_length {schema.max_global_length})"
        )
    return out


def select(layouts: list[DocLayout], schema: Schema) -> list[Selection]:
    """One selection per document for a single instance (windows: the first window)."""
    keeps = [lay.is_long.copy() for lay in layouts]
    sizes = [whole_sizes(lay, schema) for lay in layouts]
    long_len, n_globals = sum(s[0] for s in sizes), sum(s[1] for s in sizes)
    policy = schema.truncation.policy
    messages: list[str] = []
    fits_long, fits_global = long_len <= schema.max_long_length, n_globals <= schema.max_global_length
    if policy == "error" and not (fits_long and fits_global):  # globals too: nothing is cut under 'error'
        what = "document needs" if len(layouts) == 1 else f"the {len(layouts)} packed documents need"
        raise document_error(
            layouts[0].graph,
            f"{what} {long_len} long and {n_globals} global tokens; the schema allows {schema.max_long_length} "
            f"and {schema.max_global_length} and its truncation policy is 'error'",
        )
    if fits_long and (fits_global or policy != "drop_longest_first"):
        return [Selection(k, messages if i == 0 else []) for i, k in enumerate(keeps)]
    if policy == "windows":
        if len(layouts) != 1:
            message = "the windows policy splits one document into several instances; it does not pack documents"
            raise CompileError(message, **schema.where("truncation", "policy"))
        windows = window_selections(layouts[0], schema)
        if len(windows) > 1:
            windows[0].messages.append(f"this is window 1 of {len(windows)}; compile_windows() returns all of them")
        return windows[:1]
    if policy == "drop_longest_first":
        keeps = _drop_longest_first(layouts, schema, keeps, messages)
    keeps = _tail(layouts, schema, keeps, messages)
    return [Selection(k, messages if i == 0 else []) for i, k in enumerate(keeps)]


def window_selections(layout: DocLayout, schema: Schema) -> list[Selection]:
    """Pinned nodes plus windows over the other long tokens, `stride` apart, covering all text."""
    trunc = schema.truncation
    pinned_nodes = layout.of_types(trunc.pin)
    pinned = layout.is_long & coverage(layout.n_tokens, layout.ranges[pinned_nodes, 0], layout.ranges[pinned_nodes, 1])
    rest = np.flatnonzero(layout.is_long & ~pinned)

    def keep_for(start: int, width: int) -> np.ndarray:
        keep = pinned.copy()
        keep[rest[start : start + width]] = True
        return keep

    def fits(start: int, width: int) -> bool:
        return doc_sizes(layout, schema, keep_for(start, width))[0] <= schema.max_long_length

    selections: list[Selection] = []
    start = 0
    while True:
        lo, hi = 0, max(0, rest.size - start)  # the widest window that fits, by bisection
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(start, mid) else (lo, mid - 1)
        width = lo
        if width == 0 and (rest.size > start or not fits(start, 0)):  # pinned text alone must fit too
            raise document_error(
                layout.graph,
                f"the pinned nodes ({', '.join(trunc.pin)}) leave no room for a window "
                f"in max_long_length {schema.max_long_length}",
            )
        selections.append(Selection(keep_for(start, width), window=(start, start + width)))
        if start + width >= rest.size:
            break
        if trunc.stride > width:
            raise CompileError(
                f"stride {trunc.stride} is longer than the {width} tokens a window holds here: "
                "text between windows would be skipped",
                **schema.where("truncation", "stride"),
            )
        start += trunc.stride
    for i, sel in enumerate(selections):
        a, b = sel.window
        where = f"long tokens [{a}, {b}) of the {rest.size} unpinned ones (stride {trunc.stride})"
        sel.messages.append(f"window {i + 1} of {len(selections)}: {where}")
    return selections
