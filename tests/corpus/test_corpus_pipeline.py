"""`graphattn compile` end to end on a generated corpus of valid and broken documents."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from corpus_helpers import (
    TOKENIZER,
    assert_same_instance,
    directory_bytes,
    make_corpus,
    reference_instances,
    small_schema,
)

from graphattn.cli import main
from graphattn.corpus.pipeline import THROTTLE_ENV, CompileOptions, run_compile
from graphattn.errors import GraphattnError
from graphattn.schema import load_schema
from graphattn.shards.dataset import ShardDataset
from graphattn.tokenize import load_tokenizer

SHARD_SIZE = 7


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    expected = make_corpus(root / "docs")
    schema = small_schema(root / "small.yaml")
    return root, expected, schema


def options(corpus, out: Path, **kw) -> CompileOptions:
    root, _, schema = corpus
    return CompileOptions(
        inputs=[str(root / "docs")],
        schema=schema,
        out=str(out),
        tokenizer=TOKENIZER,
        shard_size=SHARD_SIZE,
        progress=False,
        **kw,
    )


@pytest.fixture(scope="module")
def compiled(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "shards"
    summary = run_compile(options(corpus, out), print_fn=None)
    return out, summary


def test_shards_equal_the_in_memory_compile(corpus, compiled):
    _, expected, schema_path = corpus
    out, summary = compiled
    schema, tokenizer = load_schema(schema_path), load_tokenizer(TOKENIZER)
    reference = reference_instances(expected, schema, tokenizer, SHARD_SIZE)
    shard_files = sorted(out.glob("shard-*.parquet"))
    assert len(shard_files) == len(reference) == -(-len(expected) // SHARD_SIZE)
    packed = 0
    for path, want in zip(shard_files, reference):
        got = ShardDataset(path)
        assert len(got) == len(want), path.name
        for i, instance in enumerate(want):
            assert_same_instance(got[i], instance)
            packed += len(instance.doc_ids) > 1
    assert packed > 0, "the corpus should exercise packing"
    valid = sum(e.graph is not None for e in expected)
    assert summary.documents == len(expected)
    assert summary.rejected == len(expected) - valid
    assert summary.instances == sum(map(len, reference))
    assert summary.truncated == sum(i.truncation.truncated for shard in reference for i in shard) > 0


def test_every_document_is_in_exactly_one_instance_or_rejected(corpus, compiled):
    _, expected, _ = corpus
    out, _ = compiled
    dataset = ShardDataset(out)
    numbers = [n for i in range(len(dataset)) for n in dataset.provenance(i).doc_numbers]
    rejected = [json.loads(line)["document"] for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert sorted(numbers + rejected) == list(range(len(expected)))
    where = {n: dataset.provenance(i) for i in range(len(dataset)) for n in dataset.provenance(i).doc_numbers}
    for e in expected:
        if e.graph is not None:
            prov = where[e.number]
            k = prov.doc_numbers.index(e.number)
            assert (prov.sources[k], prov.lines[k], prov.records[k]) == (e.source, e.line, e.record)


def test_rejected_list_names_each_broken_document_and_why(corpus, compiled):
    _, expected, _ = corpus
    out, _ = compiled
    entries = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    broken = [e for e in expected if e.graph is None]
    assert [x["document"] for x in entries] == [e.number for e in broken]
    for entry, e in zip(entries, broken):
        assert (entry["source"], entry["line"], entry["record"]) == (e.source, e.line, e.record)
        assert entry["error"] == e.error, entry
        assert e.reason in entry["message"], entry
        assert "at" not in entry  # bad input, not a bug: no code location
    by_line = {x["line"]: x for x in entries if x["line"] is not None}
    assert by_line[5]["message"].startswith(f"{expected[0].source}:5:")  # the message says where, too


def test_byte_identical_across_runs_and_worker_counts(corpus, compiled, tmp_path):
    out, _ = compiled
    run_compile(options(corpus, tmp_path / "again"), print_fn=None)
    run_compile(options(corpus, tmp_path / "two", workers=2), print_fn=None)
    reference = directory_bytes(out)
    assert directory_bytes(tmp_path / "again") == reference
    assert directory_bytes(tmp_path / "two") == reference


def test_resume_after_a_real_kill_loses_and_duplicates_nothing(corpus, compiled, tmp_path, capsys):
    root, expected, schema = corpus
    out = tmp_path / "killed"
    command = [
        sys.executable,
        "-m",
        "graphattn.cli",
        "compile",
        str(root / "docs"),
        "--schema",
        schema,
        "--out",
        str(out),
        "--tokenizer",
        TOKENIZER,
        "--shard-size",
        "2",
        "--workers",
        "2",
        "--quiet",
    ]
    env = {**os.environ, THROTTLE_ENV: "0.4"}
    proc = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    total = -(-len(expected) // 2)
    try:
        deadline = time.monotonic() + 90
        while len(list(out.glob("*.done.json"))) < 3:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the compile never got going"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done_at_kill = len(list(out.glob("*.done.json")))
    assert 3 <= done_at_kill < total, "the kill must land mid-run"
    (out / "shard-00099.parquet.tmp-12345").write_bytes(b"half a shard")  # what a kill mid-write leaves

    assert main(command[3:]) == 2  # without --resume the directory is not touched
    assert "already holds compiled shards; pass --resume" in capsys.readouterr().err
    with pytest.raises(GraphattnError, match="shard_size"):
        run_compile(
            CompileOptions(
                inputs=[str(root / "docs")],
                schema=schema,
                out=str(out),
                tokenizer=TOKENIZER,
                shard_size=3,
                resume=True,
                progress=False,
            ),
            print_fn=None,
        )
    assert main([*command[3:], "--resume"]) == 0
    clean = tmp_path / "clean"
    assert main([*command[3:], "--out", str(clean)]) == 0  # a later --out wins in argparse
    assert directory_bytes(out) == directory_bytes(clean)
    dataset = ShardDataset(out)
    numbers = [n for i in range(len(dataset)) for n in dataset.provenance(i).doc_numbers]
    rejected = [json.loads(line)["document"] for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert sorted(numbers + rejected) == list(range(len(expected)))


def test_resume_refuses_changed_inputs_and_missing_runs(corpus, tmp_path):
    root, _, schema = corpus
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "one.txt").write_text("A first sentence. And a second one.")
    opts = CompileOptions(
        inputs=[str(docs)], schema=schema, out=str(tmp_path / "out"), tokenizer=TOKENIZER, progress=False
    )
    run_compile(opts, print_fn=None)
    (docs / "one.txt").write_text("Changed text, longer than before.")
    opts.resume = True
    with pytest.raises(GraphattnError, match="changed since the run started"):
        run_compile(opts, print_fn=None)
    opts.out = str(tmp_path / "never-started")
    with pytest.raises(GraphattnError, match="nothing to resume"):
        run_compile(opts, print_fn=None)


def test_command_line_summary_and_errors(corpus, tmp_path, capsys):
    root, expected, schema = corpus
    out = tmp_path / "cli"
    assert (
        main(
            [
                "compile",
                str(root / "docs" / "a_docs.jsonl"),
                "--schema",
                schema,
                "--out",
                str(out),
                "--tokenizer",
                TOKENIZER,
                "--quiet",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "compiled 22 of 26 documents; rejected 4 (see" in text and "tokens/s" in text
    assert (
        main(
            [
                "compile",
                str(root / "nothing-*.json"),
                "--schema",
                schema,
                "--out",
                str(tmp_path / "x"),
                "--tokenizer",
                TOKENIZER,
            ]
        )
        == 2
    )
    assert "matches no file" in capsys.readouterr().err
    assert (
        main(
            ["compile", str(root / "docs"), "--schema", schema, "--out", str(tmp_path / "y"), "--tokenizer", "spacy:en"]
        )
        == 2
    )
    assert "growing spaCy vocabulary" in capsys.readouterr().err
