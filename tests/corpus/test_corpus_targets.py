"""Targets through the corpus: shards store them as typed columns, datasets restore them, collate
pads them; labels that match nothing land in warnings.jsonl once each (or, --strict, in
rejected.jsonl); a new layout with a new label is a schema file and nothing else."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from graphattn.cli import main
from graphattn.compile import collate, compile_windows
from graphattn.corpus.pipeline import CompileOptions, run_compile
from graphattn.ingest.formats import read_documents
from graphattn.shards.dataset import ShardDataset, ShardIterableDataset
from graphattn.tokenize import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "examples" / "data"
TOKENIZER = str(DATA / "tokenizer.json")
SAMPLES = {
    "hotpotqa": "hotpotqa_sample.json",
    "wikihop": "wikihop_sample.json",
    "nq": "nq_sample.jsonl",
    "openkp-dom": "openkp_sample.jsonl",
}


def compile_dir(inputs, schema: str, out: Path, **options):
    return run_compile(
        CompileOptions(
            inputs=[str(p) for p in inputs], schema=schema, out=str(out), tokenizer=TOKENIZER, progress=False, **options
        ),
        print_fn=None,
    )


@pytest.mark.parametrize("schema", sorted(SAMPLES))
def test_shards_store_and_restore_the_targets_of_every_bundled_sample(schema, tmp_path):
    sample = DATA / SAMPLES[schema]
    compile_dir([sample], schema, tmp_path / "out")
    tokenizer = load_tokenizer(TOKENIZER)
    expected = [inst for graph in read_documents(sample) for inst in compile_windows(graph, schema, tokenizer)]
    dataset = ShardDataset(tmp_path / "out")
    assert len(dataset) == len(expected)
    for got, want in zip(dataset, expected):
        assert got.target_axes == want.target_axes
        assert sorted(got.targets) == sorted(want.targets)
        for name in want.targets:
            np.testing.assert_array_equal(got.targets[name], want.targets[name], err_msg=name)
            assert got.targets[name].dtype == np.int32
    table = pq.read_table(sorted((tmp_path / "out").glob("*.parquet"))[0])
    columns = {f.name: str(f.type) for f in table.schema if f.name.startswith("target:")}
    assert columns == {
        f"target:{name}": _arrow_type(axis, want.targets[name]) for name, axis in want.target_axes.items()
    }


def _arrow_type(axis: str, value: np.ndarray) -> str:
    return "list<element: int16>" if axis == "global" else ("int32" if value.ndim == 0 else "list<element: int32>")


def test_collate_pads_targets_and_the_stream_carries_them(tmp_path):
    compile_dir([DATA / SAMPLES["hotpotqa"]], "hotpotqa", tmp_path / "out")
    instances = list(ShardIterableDataset(tmp_path / "out", compact=True))
    batch = collate(instances)
    G = batch.global_token_ids.shape[1]
    assert set(batch.targets) == {"supporting", "answer_start", "answer_end", "answer_type"}
    assert batch.targets["supporting"].shape == (2, G) and batch.targets["supporting"].dtype == torch.int64
    for b, inst in enumerate(instances):
        n = inst.global_length
        assert batch.targets["supporting"][b, :n].tolist() == inst.targets["supporting"].tolist()
        assert (batch.targets["supporting"][b, n:] == -100).all()
    assert batch.targets["answer_type"].tolist() == [1, 2]  # a span answer, then "yes"


def test_hugging_face_datasets_reads_the_target_columns(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    compile_dir([DATA / SAMPLES["nq"]], "nq", tmp_path / "out")
    files = sorted(str(p) for p in (tmp_path / "out").glob("*.parquet"))
    loaded = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(tmp_path / "cache"))
    expected = list(ShardDataset(tmp_path / "out"))
    assert loaded["target:answer_type"] == [int(i.targets["answer_type"]) for i in expected]
    assert loaded[0]["target:long_answer"] == expected[0].targets["long_answer"].tolist()


# -- labels that match nothing ----------------------------------------------------------------
HOTPOT = json.loads((DATA / SAMPLES["hotpotqa"]).read_text())[0]


def hotpot_cases() -> list[dict]:
    good = [{**HOTPOT, "_id": f"good-{i}"} for i in range(9)]
    title = {**HOTPOT, "_id": "bad-title", "supporting_facts": HOTPOT["supporting_facts"] + [["Nowhere", 0]]}
    index = {**HOTPOT, "_id": "bad-index", "supporting_facts": [["London", 7]]}
    answer = {**HOTPOT, "_id": "bad-answer", "answer": "Rhine"}
    return [*good[:3], title, *good[3:6], index, *good[6:], answer]  # 3 bad of 12: within the default rejected share


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_each_unmatched_hotpotqa_label_is_one_warning_counted_and_strict_rejects_it(tmp_path):
    records = tmp_path / "hotpot.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in hotpot_cases()))
    command = ["graphattn", "compile", str(records), "--schema", "hotpotqa", "--tokenizer", TOKENIZER]
    done = subprocess.run(command + ["--out", str(tmp_path / "out"), "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    warnings = read_jsonl(tmp_path / "out" / "warnings.jsonl")
    assert [(w["line"], w["doc_id"], w["label"], w["error"]) for w in warnings] == [
        (4, "bad-title", "supporting_facts", "LabelWarning"),
        (8, "bad-index", "supporting_facts", "LabelWarning"),
        (12, "bad-answer", "answer", "LabelWarning"),
    ]
    assert (
        warnings[0]["message"]
        == f"{records}:4: $.supporting_facts[3][0]: supporting fact names title 'Nowhere', which no paragraph of the "
        "context has"
    )
    assert warnings[1]["message"].endswith(
        "$.supporting_facts[0][1]: sentence index 7 is out of range: paragraph 'London' has 3 sentence(s)"
    )
    assert warnings[2]["message"].endswith("$.answer: answer 'Rhine' is not in any paragraph of the context")
    assert f"3 labels matched nothing (see {tmp_path / 'out' / 'warnings.jsonl'})" in done.stdout
    assert len(ShardDataset(tmp_path / "out")) == 12  # every document compiled, without the labels that matched nothing
    shown = subprocess.run(
        ["graphattn", "inspect", str(tmp_path / "out"), "--instance", "-1"], capture_output=True, text=True
    )
    assert "label warnings 3 (task labels that matched nothing: warnings.jsonl)" in shown.stdout

    strict = subprocess.run(
        command + ["--out", str(tmp_path / "strict"), "--quiet", "--strict"], capture_output=True, text=True
    )
    assert strict.returncode == 0, strict.stderr
    rejected = read_jsonl(tmp_path / "strict" / "rejected.jsonl")
    assert [(r["line"], r["error"], r["doc_id"]) for r in rejected] == [
        (4, "LabelError", "bad-title"),
        (8, "LabelError", "bad-index"),
        (12, "LabelError", "bad-answer"),
    ]
    assert rejected[1]["message"].startswith("--strict: 1 label matches nothing: ")
    assert read_jsonl(tmp_path / "strict" / "warnings.jsonl") == []
    assert len(ShardDataset(tmp_path / "strict")) == 9
    where = {
        "document",
        "source",
        "line",
        "record",
        "doc_id",
        "error",
        "message",
    }  # warnings have the shape of rejections
    assert where <= set(rejected[0]) and where <= set(warnings[0])


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    "schema, sample, bad, label, message",
    [
        (
            "wikihop",
            "wikihop_sample.json",
            lambda r: {**r, "answer": "atlantis"},
            "answer",
            r"\$.answer: answer 'atlantis' is not one of",
        ),
        (
            "nq",
            "nq_sample.jsonl",
            lambda r: {**r, "annotations": [{**r["annotations"][0], "long_answer": {"candidate_index": 99}}]},
            "long_answer",
            r"long answer candidate 99 is not among the 16 long-answer candidates",
        ),
        (
            "openkp-dom",
            "openkp_sample.jsonl",
            lambda r: {**r, "KeyPhrases": [["storm", "surge"], ["tide", "mill"]]},
            "keyphrases",
            r"\$.KeyPhrases\[1\]: keyphrase 'tide mill' is not in the text",
        ),
    ],
)
def test_unmatched_labels_of_the_other_formats_warn_once_and_strict_rejects(
    schema, sample, bad, label, message, tmp_path
):
    source = DATA / sample
    first = read_jsonl(source)[0] if source.suffix == ".jsonl" else json.loads(source.read_text())[0]
    records = [first] * 4 + [bad(first)]
    path = _write(tmp_path / "in.jsonl", records)
    argv = ["compile", str(path), "--schema", schema, "--tokenizer", TOKENIZER, "--quiet"]
    assert main(argv + ["--out", str(tmp_path / "out")]) == 0
    warnings = read_jsonl(tmp_path / "out" / "warnings.jsonl")
    assert [(w["line"], w["label"]) for w in warnings] == [(5, label)]
    assert re.search(message, warnings[0]["message"])
    assert main(argv + ["--out", str(tmp_path / "strict"), "--strict"]) == 0
    assert [(r["line"], r["error"]) for r in read_jsonl(tmp_path / "strict" / "rejected.jsonl")] == [(5, "LabelError")]


# -- a new layout with a new label: a schema file, no code ---------------------------------------
CLAIMS_SCHEMA = """
name: claims
description: written for this test only - a claim and its evidence paragraphs, each labelled.
local_radius: 4
relative_pos_max_distance: 2
relative_vocab_size: 16
max_long_length: 64
max_global_length: 16
special_tokens: {global: "[unused0]"}
global_prefix: [cls]
node_types:
  claim: {global: node, long: true, segment: true}
  paragraph: {global: node, long: true, segment: true}
relations:
  contains: {hierarchy: true}
targets:
  stance:
    kind: global_labels
    node_types: paragraph
    attr: stance
    classes: [supports, refutes, unrelated]
  verdict:
    kind: choice
    node_types: paragraph
    attr: decisive
    null_global: cls
"""


def claims_record(i: int) -> dict:
    text = f"The bridge opened in {1900 + i}. It opened in {1900 + i} says the city. Bridges are made of stone."
    first, second = text.index("It opened"), text.index("Bridges")
    return {
        "doc_id": f"claim-{i}",
        "text": text,
        "nodes": [
            {"id": "c", "type": "claim", "span": [0, first - 1]},
            {
                "id": "p0",
                "type": "paragraph",
                "span": [first, second - 1],
                "attrs": {"stance": "supports", "decisive": True},
            },
            {"id": "p1", "type": "paragraph", "span": [second, len(text)], "attrs": {"stance": "unrelated"}},
        ],
        "edges": [],
    }


def test_a_schema_written_for_a_new_layout_is_all_a_new_label_needs(tmp_path):
    schema = tmp_path / "claims.yaml"
    schema.write_text(CLAIMS_SCHEMA)
    _write(tmp_path / "claims.jsonl", [claims_record(i) for i in range(3)])
    compile_dir([tmp_path / "claims.jsonl"], str(schema), tmp_path / "out")
    instance = ShardDataset(tmp_path / "out")[1]
    assert instance.global_node_ids == ["<cls>", "c", "p0", "p1"]
    assert instance.targets["stance"].tolist() == [-100, -100, 0, 2]
    assert instance.targets["verdict"].tolist() == [0, -100, 1, 0]
    table = pq.read_table(sorted((tmp_path / "out").glob("*.parquet"))[0], columns=["target:stance", "target:verdict"])
    assert table.column("target:stance").to_pylist()[0] == [-100, -100, 0, 2]
