"""Other inputs through the same pipeline: HTML with OpenKP's visual features, HotpotQA JSON lines
(format told by the records' keys), gzip, and a windowed schema (several instances per document)."""

from __future__ import annotations

import gzip
import json

import yaml
from corpus_helpers import TOKENIZER, WORDS, assert_same_instance

from graphattn.compile import compile_windows
from graphattn.corpus.pipeline import CompileOptions, run_compile
from graphattn.ingest.html import read_html
from graphattn.ingest.json import Record, hotpotqa_graph
from graphattn.schema import SCHEMA_DIR, load_schema
from graphattn.shards.dataset import ShardDataset, read_table
from graphattn.tokenize import load_tokenizer

PAGE = """<html><head><title>t</title><style>p {{}}</style></head><body>
<h1>{title}</h1><div><p>{a} <b>{b}</b></p><p style="font-size: 2em">{c}</p></div>
<script>ignored()</script><ul><li>{d}</li></ul></body></html>"""


def _words(i: int, n: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(n))


def _compiled(tmp_path, inputs, schema, **kw):
    out = tmp_path / "out"
    run_compile(
        CompileOptions(inputs=inputs, schema=schema, out=str(out), tokenizer=TOKENIZER, progress=False, **kw),
        print_fn=None,
    )
    return out


def test_html_pages_keep_their_visual_features(tmp_path):
    pages = tmp_path / "pages"
    pages.mkdir()
    for i in range(3):
        (pages / f"page{i}.html").write_text(
            PAGE.format(title=_words(i, 3), a=_words(i, 5), b=_words(i + 1, 2), c=_words(i + 2, 4), d=_words(i + 3, 3))
        )
    out = _compiled(tmp_path, [str(pages / "*.html")], "openkp-dom", workers=2, shard_size=2)
    schema, tokenizer = load_schema("openkp-dom"), load_tokenizer(TOKENIZER)
    dataset = ShardDataset(out)
    assert len(dataset) == 3
    for i in range(3):
        (want,) = compile_windows(read_html(pages / f"page{i}.html"), schema, tokenizer)
        got = dataset[i]
        assert_same_instance(got, want)
        assert "global:font_size_bucket" in got.features and got.features["long:is_bold"].any()
    table = read_table(out, ["doc_ids", "feature:global:font_size_bucket", "long_length"])
    assert table.column("doc_ids").to_pylist() == [["page0"], ["page1"], ["page2"]]


def test_hotpotqa_records_in_gzip_json_lines_are_recognised_by_their_keys(tmp_path):
    records = [
        {
            "_id": f"h{i}",
            "question": _words(i, 6) + "?",
            "answer": "yes",
            "context": [[_words(i + p, 2), [_words(i + p + s, 7) + "." for s in range(2)]] for p in range(3)],
            "supporting_facts": [[_words(i, 2), 0]],
        }
        for i in range(4)
    ]
    path = tmp_path / "hotpot.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(json.dumps(r) for r in records) + "\n")
    out = _compiled(tmp_path, [str(path)], "hotpotqa", shard_size=3)
    schema, tokenizer = load_schema("hotpotqa"), load_tokenizer(TOKENIZER)
    dataset = ShardDataset(out)
    assert len(dataset) == 4
    for i, record in enumerate(records):
        (want,) = compile_windows(hotpotqa_graph(Record(record, str(path), i + 1)), schema, tokenizer)
        assert_same_instance(dataset[i], want)
        assert dataset.provenance(i).lines == [i + 1]
    assert (out / "rejected.jsonl").read_text() == ""


def test_windowed_schema_stores_every_window_of_a_document(tmp_path):
    data = yaml.safe_load((SCHEMA_DIR / "nq.yaml").read_text())
    data.update({"max_long_length": 40, "local_radius": 4, "truncation": {**data["truncation"], "stride": 16}})
    schema_path = tmp_path / "nq-small.yaml"
    schema_path.write_text(yaml.safe_dump(data))
    tokens = ["<P>"] + " ".join(_words(i, 6) + " ." for i in range(8)).split() + ["</P>"]
    record = {
        "example_id": 7,
        "question_text": "what runs past the mills",
        "document_text": " ".join(tokens),
        "long_answer_candidates": [{"start_token": 0, "end_token": len(tokens), "top_level": True}],
        "annotations": [],
    }
    path = tmp_path / "nq.jsonl"
    path.write_text(json.dumps(record) + "\n")
    out = _compiled(tmp_path, [str(path)], str(schema_path))
    from graphattn.ingest.json import nq_graph

    want = compile_windows(
        nq_graph(Record(record, str(path), 1)), load_schema(str(schema_path)), load_tokenizer(TOKENIZER)
    )
    dataset = ShardDataset(out)
    assert len(want) > 1 and len(dataset) == len(want)
    for i, instance in enumerate(want):
        assert_same_instance(dataset[i], instance)
        assert (dataset.provenance(i).window, dataset.provenance(i).windows) == (i, len(want))
