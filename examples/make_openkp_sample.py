"""Build examples/data/openkp_sample.jsonl: two records in OpenKP's own format (url, text, VDOM,
KeyPhrases), so that the OpenKP task runs end to end without the dataset.

    python examples/make_openkp_sample.py [--out PATH]

Record 1 is the bundled page examples/data/openkp_page.html as OpenKP's pipeline would give it:
its visible text as words without punctuation, one VDOM element per text run (flags and font
sizes from the HTML reader; geometry made up from the reading position, since nothing renders
the page), and three keyphrases chosen by hand. Record 2 is a short page written here.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
WORD = re.compile(r"\w+(?:['\u2019-]\w+)*")
FLAGS = ("is_block", "is_inline", "is_heading", "is_leaf")


def _features(attrs: dict, prefix: str, y: float, height: float) -> list[float]:
    flags = [float(bool(attrs[f"{prefix}{name}"])) for name in FLAGS]
    return [40.0, 800.0, y, height, *flags, float(attrs[f"{prefix}font_size"]), float(bool(attrs[f"{prefix}is_bold"]))]


def page_record() -> dict:
    from graphattn.ingest.html import read_html

    graph = read_html(DATA / "openkp_page.html")
    words: list[str] = []
    vdom = []
    for node in graph.nodes_of_type("text"):
        run = WORD.findall(graph.span_text(node.id))
        if not run:
            continue
        y = round(node.attrs["reading_position"] * 4000.0, 1)
        height = 20.0 * (1 + len(run) // 12)
        feature = _features(node.attrs, "", y, height) + _features(node.attrs, "parent_", y, height + 20.0)
        vdom.append(
            {
                "Id": 0,
                "text": " ".join(run),
                "feature": feature,
                "start_idx": len(words),
                "end_idx": len(words) + len(run),
            }
        )
        words.extend(run)
    phrases = [["storm", "surge", "barriers"], ["Thames", "Barrier"], ["Maeslantkering"]]
    return {
        "url": "https://example.org/coastal/storm-surge-barriers",
        "text": " ".join(words),
        "VDOM": json.dumps(vdom),
        "KeyPhrases": json.dumps(phrases),
    }


def short_record() -> dict:
    blocks = [
        ("Canal locks explained", 32.0, True),
        ("How a lock lifts a boat", 22.0, True),
        ("A canal lock is a chamber with gates at both ends", 16.0, False),
        ("The lock keeper fills the chamber and the boat rises with the water", 16.0, False),
        ("Flights of canal locks climb steep hills in a few hundred metres", 16.0, False),
    ]
    words: list[str] = []
    vdom = []
    for i, (text, size, heading) in enumerate(blocks):
        run = text.split()
        own = [40.0, 800.0, 60.0 * i, 30.0, 1.0, 0.0, float(heading), 1.0, size, float(heading)]
        parent = [40.0, 800.0, 0.0, 320.0, 1.0, 0.0, 0.0, 0.0, 16.0, 0.0]
        vdom.append(
            {"Id": 0, "text": text, "feature": own + parent, "start_idx": len(words), "end_idx": len(words) + len(run)}
        )
        words.extend(run)
    return {
        "url": "https://example.org/waterways/canal-locks",
        "text": " ".join(words),
        "VDOM": json.dumps(vdom),
        "KeyPhrases": json.dumps([["canal", "locks"], ["lock", "keeper"]]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DATA / "openkp_sample.jsonl")
    args = parser.parse_args(argv)
    records = [page_record(), short_record()]
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    print(f"wrote {len(records)} OpenKP records to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
