"""Schema `features:` of one document of an instance: attr values of its nodes as per-global and
per-long-token arrays (a long token takes the value of the innermost live node holding the attr),
each value checked against the feature's dtype and range."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphattn.compile.layout import DocLayout, schema_ref
from graphattn.compile.ranges import take_or
from graphattn.errors import CompileError, format_path
from graphattn.schema import Feature, Schema, feature_value_problem


def doc_features(doc: Any, schema: Schema) -> dict[str, np.ndarray]:
    """`global:<name>` [Gd] from each global's node, `long:<name>` [Ld] from the innermost holder
    (`doc`: an `assemble._Doc`, one document of the instance).

    Values live only on the holders (a page's nodes are mostly cut away), and the features of
    one set of holders (an ingester's nodes carry all its features) share one innermost lookup."""
    lay = doc.lay
    out = {}
    alive = np.flatnonzero(doc.alive)  # globals and long tokens come from live nodes only
    lookups: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
    for i, feat in enumerate(schema.features):
        dtype = np.float32 if feat.dtype == "float32" else np.int32
        present, column = lay.graph.attr_column(feat.attr, alive)
        holders = alive[present]
        values = np.zeros(0, dtype=np.float64)
        if holders.size:
            raw = column[present]  # a bulk builder's numeric column stays an array: checked with numpy
            raw = raw if raw.dtype != object else raw.tolist()
            values = feature_values(raw, feat, lay, holders, schema, i)
        key = present.tobytes()
        if key not in lookups:
            lookups[key] = (_holder_of(holders, doc.g_node), doc.innermost_of(holders))
        of_global, of_body = lookups[key]
        out[f"global:{feat.name}"] = take_or(values, of_global, feat.default).astype(dtype)
        out[f"long:{feat.name}"] = doc.with_prefix(take_or(values, of_body, feat.default).astype(dtype), feat.default)
    return out


def _holder_of(holders: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Per entry of `nodes` (-1: none): its index in the sorted `holders`, -1 if not one."""
    at = np.minimum(np.searchsorted(holders, nodes), max(holders.size - 1, 0))
    return np.where((nodes >= 0) & (take_or(holders, at, -1) == nodes), at, -1)


def feature_values(
    raw: list | np.ndarray, feat: Feature, lay: DocLayout, holders: np.ndarray, schema: Schema, index: int
) -> np.ndarray:
    """The attr values of one feature as float64, each checked against the feature's dtype and range
    (`feature_value_problem`): a bad value is a CompileError naming the node and the attr."""
    if isinstance(raw, np.ndarray):  # a typed column: bool, int or float values need no check of their type
        values = raw.astype(np.float64) if raw.dtype.kind in "biuf" else None
    else:
        plain = all(type(v) in (int, float, bool) for v in raw)
        values = np.array(raw, dtype=np.float64) if plain and all(abs(v) < 2**63 for v in raw) else None
    if values is not None:
        ok = np.isfinite(values) & (values >= feat.minimum) & (values <= feat.maximum)
        if feat.dtype == "int32":
            ok &= values == np.round(values)
        if ok.all():
            return values
    raw = raw.tolist() if isinstance(raw, np.ndarray) else raw
    for h, value in zip(holders, raw):  # only on failure (or unusual types): find the first bad value
        problem = feature_value_problem(value, feat.dtype, feat.minimum, feat.maximum)
        if problem:
            raise CompileError(
                f"attr {feat.attr!r}: {problem} "
                f"(feature {feat.name!r} of {schema_ref(schema)}, {format_path(('features', index))})",
                file=lay.graph.source,
                node=lay.node_ids[h],
            )
    return np.array([float(v) for v in raw], dtype=np.float64)


__all__ = ["doc_features", "feature_values"]
