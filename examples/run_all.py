"""Run every layout example on the bundled data: python examples/run_all.py

Each example ingests a sample from examples/data/ (JSON records, an HTML page or plain text),
compiles it with its schema from schemas/ and prints a summary. Exits non-zero if any fails.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from pathlib import Path

EXAMPLES = ("etc_sentences", "fixed_blocks", "hotpotqa", "wikihop", "nq", "openkp")


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    failed = []
    for name in EXAMPLES:
        start = time.perf_counter()
        try:
            importlib.import_module(name).main()
        except Exception:  # report every failing example, then fail once at the end
            traceback.print_exc()
            failed.append(name)
        print(f"   ({name}: {time.perf_counter() - start:.2f} s)\n")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"all {len(EXAMPLES)} examples ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
