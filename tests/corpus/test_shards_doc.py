"""docs/SHARDS.md lists every column a shard can have, and the format version the code writes."""

from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import Path

from graphattn.schema import load_schema
from graphattn.shards.format import FORMAT, ShardColumns

DOC = Path(__file__).resolve().parents[2] / "docs" / "SHARDS.md"


def documented_columns() -> list[str]:
    """Names in backquotes in the table rows under ## Columns (patterns with <...> placeholders)."""
    text = DOC.read_text().split("## Columns", 1)[1].split("## Footer", 1)[0]
    names = [n for row in re.findall(r"^\|.*\|$", text, flags=re.M) for n in re.findall(r"`([^`]+)`", row)]
    return [n if not n.startswith("_") else "target:<name>" + n for n in names]  # `_end`, `_type` continue a span row


def test_every_column_of_every_shipped_schema_is_documented():
    patterns = [re.sub(r"<[^>]+>", "*", name) for name in documented_columns()]
    for name in ("hotpotqa", "wikihop", "nq", "openkp-dom", "etc-sentences", "fixed-blocks"):
        columns = ShardColumns.for_run(load_schema(name), 3000).arrow_schema().names
        missing = [c for c in columns if not any(fnmatch(c, p) for p in patterns)]
        assert not missing, f"{name}: columns missing from docs/SHARDS.md: {missing}"


def test_the_documented_version_is_the_one_written():
    assert f"# The shard format (`{FORMAT}`)" in DOC.read_text()
