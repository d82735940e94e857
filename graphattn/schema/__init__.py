"""Relation schemas: the typed `Schema` and `load_schema` (`core`), node types (`node_type`),
the `targets:` section (`targets`) and bounded, line-aware reading of the files (`io`).

Names load on first use, so that a reader of shards that needs only `targets` (the shard format)
does not pull in the YAML and JSON Schema loader.
"""

from graphattn.lazy import lazy_exports

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
    "load_effective_schema",
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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
