"""`graphattn inspect` on a small compiled directory and on one shard."""

from __future__ import annotations

import re

import pytest
from corpus_helpers import TOKENIZER, make_corpus, small_schema

from graphattn.cli import main
from graphattn.corpus.pipeline import CompileOptions, run_compile
from graphattn.shards.dataset import ShardDataset


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect")
    make_corpus(root / "docs", seed=4)
    out = root / "shards"
    run_compile(
        CompileOptions(
            inputs=[str(root / "docs")],
            schema=small_schema(root / "small.yaml"),
            out=str(out),
            tokenizer=TOKENIZER,
            shard_size=20,
            progress=False,
        ),
        print_fn=None,
    )
    return out


def test_directory_report(out, capsys):
    assert main(["inspect", str(out), "--instance", "1", "--tokens", "5"]) == 0
    text = capsys.readouterr().out
    dataset = ShardDataset(out)
    lengths = [dataset[i].long_length for i in range(len(dataset))]
    documents = sum(len(dataset[i].doc_ids) for i in range(len(dataset)))
    assert f"2 shard(s) from {out}" in text
    counts = f"compiled {documents} of {documents + 7} documents; rejected 7 (see {out / 'rejected.jsonl'})\n"
    assert f"{counts}instances {len(dataset)}\n" in text
    assert f"long length: min {min(lengths)}, mean {sum(lengths) / len(lengths):.1f}, max {max(lengths)}" in text
    bars = [int(m) for m in re.findall(r"^  \[\s*\d+,\s*\d+\)\s+(\d+)", text.split("global length")[0], re.M)]
    assert sum(bars) == len(dataset)  # the long-length histogram counts every instance once
    assert re.search(r"truncation: [1-9]\d* instance\(s\) truncated", text)
    labels = text.split("relative labels attended")[1]
    for name in ("dist:0", "dist:+4", "dist:-1", "belongs", "does_not_belong"):
        assert re.search(rf"^  {re.escape(name)}\s+[\d,]+", labels, re.M), name
    instance = dataset[1]
    assert f"instance 1: L={instance.long_length}, G={instance.global_length}, documents {instance.doc_ids}" in text
    assert f"{instance.global_node_ids[0]} ({instance.global_node_types[0]})" in text
    assert "global tokens (first 5 of" in text and "long tokens (first 5 of" in text
    first_word = instance.long_token_text(0)
    assert re.search(rf"^\s+0\s+{int(instance.long_token_ids[0])}\s+\d+\s+\d+\s+{re.escape(first_word)}\s", text, re.M)


def test_single_shard_takes_the_rejected_count_from_its_footer(out, capsys):
    shard = sorted(out.glob("*.parquet"))[1]
    assert main(["inspect", str(shard), "--instance", "-1", "--label-instances", "0"]) == 0
    text = capsys.readouterr().out
    assert "1 shard(s)" in text and "(from shard footers)" in text
    assert "relative labels" not in text and "instance 0:" not in text
    assert main(["inspect", str(shard), "--instance", "999"]) == 2
    assert "out of range" in capsys.readouterr().err
