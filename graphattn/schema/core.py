"""Relation-schema files: load, validate, and turn into typed dataclasses.

A relation schema (YAML or JSON; format documented in ``schemas/relation-schema.json``) says how
a DocGraph lowers into ETC inputs. `load_schema` validates a file against that JSON Schema and
then checks what JSON Schema cannot (names that refer to each other, label budget), so that the
compiler only ever sees a consistent `Schema`. Every problem is a `SchemaError` that reads
``schemas/x.yaml:12: $.node_types.sentence.global: expected one of ...``: YAML nodes carry their
line numbers, which the loader keeps per key path.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from graphattn.errors import SchemaError
from graphattn.labels import LabelVocab, first_schema_label_id
from graphattn.schema.io import (
    JSON_SCHEMA_PATH,
    SCHEMA_DIR,
    Path_,
    line_of,
    read_bounded_text,
    read_schema_file,
    validate,
)
from graphattn.schema.node_type import NodeType
from graphattn.schema.targets import TargetSpec, build_targets

__all__ = [
    "JSON_SCHEMA_PATH",
    "SCHEMA_DIR",
    "Schema",
    "NodeType",
    "Relation",
    "load_effective_schema",
    "load_schema",
    "shipped_schemas",
]

GLOBAL_MODES = ("none", "node", "per_token")
LINK_KINDS = ("l2g", "g2l", "g2g")
DEFAULT_ROLE_TOKENS = {"cls": "[CLS]", "sep": "[SEP]"}


# ------------------------------------------------------------------------------------------
# The typed schema
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Relation:
    name: str
    hierarchy: bool = False
    link: str | None = None  # l2g | g2l | g2g
    label: str | None = None
    reverse_label: str | None = None


@dataclass(frozen=True)
class Masks:
    hard_g2l: bool = False
    hard_l2g: bool = False


@dataclass(frozen=True)
class Segments:
    block_g2g: bool | tuple[str, ...] = False
    cross_segment_label: str | None = None

    def blocks(self, type_a: str, type_b: str) -> bool:
        if isinstance(self.block_g2g, bool):
            return self.block_g2g
        return type_a in self.block_g2g and type_b in self.block_g2g


@dataclass(frozen=True)
class FixedBlocks:
    tokens_per_block: int
    name: str = "block"
    global_token: str | int | None = None
    type_id: int = 0
    hard_g2l: bool | None = None
    hard_l2g: bool | None = None


@dataclass(frozen=True)
class Truncation:
    policy: str = "tail"  # tail | drop_longest_first | windows | error
    unit: str | None = None
    context: str | None = None
    stride: int | None = None
    pin: tuple[str, ...] = ()


FEATURE_RANGES = {"int32": (-(2**31), 2**31 - 1), "float32": (-3.4028234663852886e38, 3.4028234663852886e38)}


@dataclass(frozen=True)
class Feature:
    """A node attr carried as a per-global / per-long array. Values read must be finite numbers in
    [minimum, maximum] (the dtype's range unless the schema narrows it), whole for int32."""

    name: str
    attr: str
    default: float = 0
    dtype: str = "int32"
    minimum: float = FEATURE_RANGES["int32"][0]
    maximum: float = FEATURE_RANGES["int32"][1]


@dataclass(frozen=True)
class Schema:
    """A validated relation schema. `source` is the file it came from (for error messages)."""

    name: str
    node_types: Mapping[str, NodeType]
    relations: Mapping[str, Relation]
    local_radius: int = 84
    relative_pos_max_distance: int = 12
    relative_vocab_size: int = 32
    max_long_length: int = 4096
    max_global_length: int = 256
    special_tokens: Mapping[str, str | int] = field(default_factory=lambda: dict(DEFAULT_ROLE_TOKENS))
    long_prefix: tuple[str, ...] = ()
    global_prefix: tuple[str, ...] = ()
    masks: Masks = Masks()
    segments: Segments = Segments()
    global_order: tuple[tuple[str, ...], ...] = ()
    max_documents: int = 1
    fixed_blocks: FixedBlocks | None = None
    truncation: Truncation = Truncation()
    features: tuple[Feature, ...] = ()
    description: str = ""
    targets: Mapping[str, TargetSpec] = field(default_factory=dict)  # task labels (graphattn.schema.targets)
    source: str | None = field(default=None, compare=False)
    lines: Mapping[Path_, int] = field(default_factory=dict, repr=False, compare=False)

    # -- derived views --------------------------------------------------------------------
    @property
    def labels(self) -> list[str]:
        """Schema labels in declaration order (relations, then the cross-segment label)."""
        names: list[str] = []
        for rel in self.relations.values():
            for label in (rel.label, rel.reverse_label):
                if label is not None and label not in names:
                    names.append(label)
        label = self.segments.cross_segment_label
        if label is not None and label not in names:
            names.append(label)
        return names

    def label_vocab(self):
        """The LabelVocab every instance compiled with this schema carries."""
        return LabelVocab(self.relative_pos_max_distance, self.labels)

    @property
    def hierarchy_relations(self) -> tuple[str, ...]:
        return tuple(name for name, rel in self.relations.items() if rel.hierarchy)

    @property
    def global_types(self) -> tuple[str, ...]:
        """Types that yield globals, fixed-block level included, in global order."""
        return tuple(t for group in self.global_order for t in group)

    @property
    def long_types(self) -> tuple[str, ...]:
        return tuple(name for name, t in self.node_types.items() if t.long)

    def where(self, *path: str | int) -> dict[str, Any]:
        """Location kwargs (file, line, path) of a key, for errors about this schema."""
        return {"file": self.source, "line": self.lines.get(tuple(path)), "path": tuple(path)}


# ------------------------------------------------------------------------------------------
# Building the typed schema, with the checks JSON Schema cannot express
# ------------------------------------------------------------------------------------------
class _Checker:
    """Raises SchemaError at a key path, with the line of that key."""

    def __init__(self, lines: Mapping, source: str | None):
        self.lines, self.source = lines, source

    def fail(self, message: str, *path: str | int) -> None:
        raise SchemaError(message, file=self.source, line=line_of(self.lines, path), path=path)

    def known(self, name: str, choices, what: str, *path: str | int) -> None:
        if name not in choices:
            close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (declared: {', '.join(choices) or 'none'})"
            self.fail(f"unknown {what} {name!r}{hint}", *path)


def _node_type(name: str, raw: Mapping, check: _Checker) -> NodeType:
    ignore_all = raw.get("ignore_hard_masks", False)
    where = {k: tuple(v) if isinstance(v, list) else (v,) for k, v in raw.get("where", {}).items()}
    mode = raw.get("global", "none")
    if where and mode == "none":
        check.fail(
            "`where` selects which nodes become globals, but this type has global: none", "node_types", name, "where"
        )
    if mode == "per_token" and "global_token" in raw:
        check.fail(
            "per_token globals use their wordpiece ids; global_token does not apply", "node_types", name, "global_token"
        )
    type_id = raw.get("type_id")
    return NodeType(
        name=name,
        global_mode=mode,
        long=raw.get("long", False),
        type_id=type_id,
        global_type_id=raw.get("global_type_id", type_id if type_id is not None else 0),
        global_token=raw.get("global_token"),
        segment=raw.get("segment", False),
        sep_after=raw.get("sep_after", False),
        ignore_hard_g2l=raw.get("ignore_hard_g2l", ignore_all),
        ignore_hard_l2g=raw.get("ignore_hard_l2g", ignore_all),
        where=where,
    )


def _relation(name: str, raw: Mapping, check: _Checker) -> Relation:
    link, label, reverse = raw.get("link"), raw.get("label"), raw.get("reverse_label")
    if label is not None and link is None:
        check.fail(
            "a label needs `link: l2g | g2l | g2g` to say which attention pieces it labels", "relations", name, "label"
        )
    if link == "g2g" and label is None:
        check.fail("a g2g link needs a `label` (without one it would change nothing)", "relations", name, "link")
    if reverse is not None and link != "g2g":
        check.fail("reverse_label applies to g2g links only", "relations", name, "reverse_label")
    if raw.get("hierarchy") and link in ("l2g", "g2l"):
        message = (
            "a hierarchy relation already lowers to belongs/does_not_belong; "
            "use link: g2g to label parent/child globals"
        )
        check.fail(message, "relations", name, "link")
    return Relation(name, raw.get("hierarchy", False), link, label, reverse)


def _global_order(data: Mapping, node_types: Mapping[str, NodeType], blocks: FixedBlocks | None, check: _Checker):
    global_types = [n for n, t in node_types.items() if t.is_global] + ([blocks.name] if blocks else [])
    if "global_order" not in data:
        return (tuple(global_types),) if global_types else ()
    groups, seen = [], {}
    for i, group in enumerate(data["global_order"]):
        names = [group] if isinstance(group, str) else list(group)
        for j, name in enumerate(names):
            where = ("global_order", i) if isinstance(group, str) else ("global_order", i, j)
            check.known(name, global_types, "global node type", *where)
            if name in seen:
                check.fail(f"{name!r} is listed twice (first at global_order[{seen[name]}])", *where)
            seen[name] = i
        groups.append(tuple(names))
    missing = [t for t in global_types if t not in seen]
    if missing:
        check.fail(f"global types missing from global_order: {', '.join(missing)}", "global_order")
    return tuple(groups)


def _features(raw: list, check: _Checker) -> tuple[Feature, ...]:
    out: list[Feature] = []
    for i, item in enumerate(raw):
        item = {"name": item} if isinstance(item, str) else item
        dtype = item.get("dtype", "int32")
        low, high = FEATURE_RANGES[dtype]
        minimum, maximum = item.get("minimum", low), item.get("maximum", high)
        for key, value in (("minimum", minimum), ("maximum", maximum)):
            if not low <= value <= high:
                message = f"{key} {value!r} is outside the {dtype} range [{_number(low)}, {_number(high)}]"
                check.fail(message, "features", i, key)
        if minimum > maximum:
            check.fail(f"minimum {minimum!r} is larger than maximum {maximum!r}", "features", i, "minimum")
        default = item.get("default", 0)
        problem = feature_value_problem(default, dtype, minimum, maximum)
        if problem:
            check.fail(f"default {problem}", "features", i, "default")
        if any(f.name == item["name"] for f in out):
            check.fail(f"feature {item['name']!r} is listed twice", "features", i)
        out.append(Feature(item["name"], item.get("attr", item["name"]), default, dtype, minimum, maximum))
    return tuple(out)


def feature_value_problem(value: Any, dtype: str, minimum: float, maximum: float) -> str | None:
    """Why `value` cannot be a value of this feature (None when it can): the one rule that the
    schema's defaults and the compiler's attr values both follow."""
    if isinstance(value, (bool, np.bool_)):
        value = int(value)
    if not isinstance(value, (numbers.Real, np.number)) or isinstance(value, np.complexfloating):
        return f"{value!r} is not a number"
    if not isinstance(value, (numbers.Integral, np.integer)) and not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if dtype == "int32" and not isinstance(value, (numbers.Integral, np.integer)) and not float(value).is_integer():
        return f"{value!r} is not a whole number (the feature is int32)"
    if not minimum <= value <= maximum:
        return f"{value!r} is outside [{_number(minimum)}, {_number(maximum)}] (dtype {dtype})"
    return None


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else f"{value:.9g}"


def _build(data: Mapping, lines: Mapping, source: str | None) -> Schema:
    check = _Checker(lines, source)
    node_types = {name: _node_type(name, raw, check) for name, raw in data.get("node_types", {}).items()}
    relations = {name: _relation(name, raw, check) for name, raw in data.get("relations", {}).items()}
    special = {**DEFAULT_ROLE_TOKENS, **data.get("special_tokens", {})}
    for key in ("long_prefix", "global_prefix"):
        for i, name in enumerate(data.get(key, [])):
            check.known(name, special, "special token", key, i)
    needs_global_token = any(t.global_mode == "node" and t.global_token is None for t in node_types.values())

    blocks = None
    if "fixed_blocks" in data:
        raw = data["fixed_blocks"]
        blocks = FixedBlocks(
            raw["tokens_per_block"],
            raw.get("name", "block"),
            raw.get("global_token"),
            raw.get("type_id", 0),
            raw.get("hard_g2l"),
            raw.get("hard_l2g"),
        )
        if blocks.name in node_types:
            check.fail(f"block level name {blocks.name!r} clashes with a declared node type", "fixed_blocks", "name")
        needs_global_token |= blocks.global_token is None
        hard_l2g = data.get("masks", {}).get("hard_l2g", False)
        if blocks.hard_l2g not in (None, hard_l2g) and any(t.is_global for t in node_types.values()):
            check.fail(
                "hard l2g restricts long query tokens, whichever global they look at (etcmodel's rule per row), so a "
                "block-only value cannot apply beside node globals: "
                f"set masks.hard_l2g: {str(blocks.hard_l2g).lower()} instead",
                "fixed_blocks",
                "hard_l2g",
            )
    if needs_global_token and "global" not in special:
        message = "global nodes without their own global_token need special_tokens.global (a token string or id)"
        check.fail(message, "special_tokens")
    if any(t.sep_after for t in node_types.values()) and "sep" not in special:
        check.fail("sep_after needs special_tokens.sep", "special_tokens")

    segments_raw = data.get("segments", {})
    block_g2g = segments_raw.get("block_g2g", False)
    if isinstance(block_g2g, list):
        for i, name in enumerate(block_g2g):
            check.known(
                name, [n for n, t in node_types.items() if t.is_global], "global node type", "segments", "block_g2g", i
            )
        block_g2g = tuple(block_g2g)
    if segments_raw and not any(t.segment for t in node_types.values()):
        check.fail("segments are configured but no node type has `segment: true`", "segments")

    trunc_raw = data.get("truncation", {})
    truncation = Truncation(
        trunc_raw.get("policy", "tail"),
        trunc_raw.get("unit"),
        trunc_raw.get("context"),
        trunc_raw.get("stride"),
        tuple(trunc_raw.get("pin", [])),
    )
    _check_truncation(truncation, node_types, data, check)

    schema = Schema(
        name=data["name"],
        node_types=node_types,
        relations=relations,
        local_radius=data.get("local_radius", 84),
        relative_pos_max_distance=data.get("relative_pos_max_distance", 12),
        relative_vocab_size=data.get("relative_vocab_size", 32),
        max_long_length=data.get("max_long_length", 4096),
        max_global_length=data.get("max_global_length", 256),
        special_tokens=special,
        long_prefix=tuple(data.get("long_prefix", [])),
        global_prefix=tuple(data.get("global_prefix", [])),
        masks=Masks(**data.get("masks", {})),
        segments=Segments(block_g2g, segments_raw.get("cross_segment_label")),
        global_order=_global_order(data, node_types, blocks, check),
        max_documents=data.get("packing", {}).get("max_documents", 1),
        fixed_blocks=blocks,
        truncation=truncation,
        features=_features(data.get("features", []), check),
        description=data.get("description", ""),
        source=source,
        lines=dict(lines),
    )
    _check_labels(schema, check)
    if len(schema.long_prefix) >= schema.max_long_length:
        n = len(schema.long_prefix)
        check.fail(
            f"long_prefix ({n} tokens) leaves no room in max_long_length {schema.max_long_length}", "max_long_length"
        )
    if len(schema.global_prefix) > schema.max_global_length:
        n = len(schema.global_prefix)
        check.fail(
            f"global_prefix ({n} tokens) exceeds max_global_length {schema.max_global_length}", "max_global_length"
        )
    return _with_targets(schema, data, check)


def _with_targets(schema: Schema, data: Mapping, check: _Checker) -> Schema:
    """The schema with its `targets:` section (task labels), checked against its node types."""
    if "targets" not in data:
        return schema
    targets = build_targets(data["targets"], schema.node_types, schema.global_prefix, schema.max_documents, check)
    return replace(schema, targets=targets)


def _check_truncation(trunc: Truncation, node_types: Mapping[str, NodeType], data: Mapping, check: _Checker) -> None:
    if trunc.policy == "drop_longest_first":
        if trunc.unit is None:
            check.fail("drop_longest_first needs `unit` (the node type dropped whole, e.g. sentence)", "truncation")
        check.known(trunc.unit, node_types, "node type", "truncation", "unit")
        if trunc.context is not None:
            check.known(trunc.context, node_types, "node type", "truncation", "context")
    elif trunc.unit is not None or trunc.context is not None:
        key = "unit" if trunc.unit is not None else "context"
        check.fail(f"`{key}` applies to policy drop_longest_first only (policy is {trunc.policy!r})", "truncation", key)
    if trunc.policy == "windows":
        if trunc.stride is None:
            check.fail("windows needs `stride` (long tokens between window starts)", "truncation")
        for i, name in enumerate(trunc.pin):
            check.known(name, node_types, "node type", "truncation", "pin", i)
    elif trunc.stride is not None or trunc.pin:
        key = "stride" if trunc.stride is not None else "pin"
        check.fail(f"`{key}` applies to policy windows only (policy is {trunc.policy!r})", "truncation", key)
    if trunc.policy == "windows" and trunc.stride > data.get("max_long_length", 4096):
        check.fail("stride is longer than max_long_length: windows would skip text", "truncation", "stride")


def _check_labels(schema: Schema, check: _Checker) -> None:
    k = schema.relative_pos_max_distance
    builtin = set(LabelVocab(k).names)
    for name, rel in schema.relations.items():
        for key in ("label", "reverse_label"):
            label = getattr(rel, key)
            if label in builtin:
                check.fail(f"label {label!r} clashes with a built-in label", "relations", name, key)
    if schema.segments.cross_segment_label in builtin:
        check.fail("cross_segment_label clashes with a built-in label", "segments", "cross_segment_label")
    needed = first_schema_label_id(k) + len(schema.labels)
    if schema.relative_vocab_size < needed:
        check.fail(
            f"relative_vocab_size {schema.relative_vocab_size} is too small: "
            f"2k+3 = {first_schema_label_id(k)} built-in labels "
            f"plus {len(schema.labels)} schema label(s) need {needed}",
            "relative_vocab_size",
        )


def load_schema(spec: str | os.PathLike | Mapping | Schema, overrides: Sequence[str] = ()) -> Schema:
    """Load and validate a relation schema from a YAML/JSON file, a shipped name, or a dict.

    ``load_schema("etc-sentences")`` finds ``schemas/etc-sentences.yaml`` shipped with the
    package. `overrides` are ``KEY=VALUE`` texts as ``--set`` takes them
    (`graphattn.schema.overrides`), applied before the whole is validated. Raises `SchemaError`
    naming file, line and key path on any problem.
    """
    if overrides:
        if isinstance(spec, Schema):
            raise SchemaError("overrides apply to a schema file, name or dict, not to a loaded Schema")
        return load_effective_schema(spec, overrides)[0]
    if isinstance(spec, Schema):
        return spec
    data, lines, source = read_schema_file(spec)
    validate(data, lines, source)
    return _build(data, lines, source)


def load_effective_schema(spec: str | os.PathLike | Mapping, overrides: Sequence[str] = ()) -> tuple[Schema, str]:
    """(Schema, its text) of `spec` with the ``KEY=VALUE`` `overrides` of ``--set`` applied and the
    whole validated. The text is what a run records (shard footers, run.json): the file as written
    when nothing is overridden, else the effective schema (`graphattn.schema.overrides`)."""
    from graphattn.schema.overrides import blamed, effective_text, with_sets

    data, lines, source = read_schema_file(spec)
    if not overrides:
        validate(data, lines, source)
        schema = _build(data, lines, source)
        text = read_bounded_text(Path(source), source, "schema file") if source is not None else repr(schema)
        return schema, text
    data, lines, applied = with_sets(data, lines, source, overrides)
    try:
        validate(data, lines, source)
        schema = _build(data, lines, source)
    except SchemaError as err:
        raise blamed(err, applied, source) from None
    return schema, effective_text(data, source, overrides)


def shipped_schemas() -> Iterator[Path]:
    """The schema files that ship with graphattn."""
    return iter(sorted(SCHEMA_DIR.glob("*.yaml")))
