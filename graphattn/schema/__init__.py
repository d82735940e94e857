"""Relation schemas: the typed `Schema` and `load_schema` (`core`), node types (`node_type`),
the `targets:` section (`targets`) and bounded, line-aware reading of the files (`io`).

Names load on first use, so that a reader of shards that needs only `targets` (the shard format)
does not pull in the YAML and JSON Schema loader.
"""

from importlib import import_module
from typing import Any

_CORE = (
    "DEFAULT_ROLE_TOKENS",
    "FEATURE_RANGES",
    "GLOBAL_MODES",
    "LINK_KINDS",
    "Feature",
    "FixedBlocks",
    "Masks",
    "Relation",
    "Schema",
    "Segments",
    "Truncation",
    "feature_value_problem",
    "load_schema",
    "shipped_schemas",
)
_EXPORTS = {
    **dict.fromkeys(_CORE, "graphattn.schema.core"),
    "JSON_SCHEMA_PATH": "graphattn.schema.io",
    "SCHEMA_DIR": "graphattn.schema.io",
    "NodeType": "graphattn.schema.node_type",
    "TargetSpec": "graphattn.schema.targets",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'graphattn.schema' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
