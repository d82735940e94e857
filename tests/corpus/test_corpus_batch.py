"""Batch compile in the corpus workers (#16 item 2): the same bytes as one document at a time.

"One at a time" is the path the workers took before batching: every document's whole text
tokenized by its own `encode` call (`BATCH_SIZE = 1`, no early stop), then laid out, selected
and assembled. The batched path tokenizes 32 documents per `encode_batch` and stops early under
`tail`; both must write byte-identical directories (shards, markers, rejected.jsonl).
"""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_helpers import TOKENIZER, directory_bytes, make_corpus, small_schema

from graphattn.compile import compile_many, compile_windows, compiler
from graphattn.corpus.pipeline import CompileOptions, run_compile
from graphattn.tokenize import HFTokenizer, load_tokenizer

WORDS = "river mills towns grain wool stories storms ships bridges harvest markets music lanterns winter".split()


def _hotpot_lines(path, documents: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for i in range(documents):
            paragraphs = rng.choice([3, 10, 400])  # some far past max_long_length: tokenizing stops early
            context = [
                [
                    " ".join(rng.choices(WORDS, k=2)),
                    [" ".join(rng.choices(WORDS, k=rng.randint(5, 20))) + "." for _ in range(rng.randint(1, 4))],
                ]
                for _ in range(paragraphs)
            ]
            record = {
                "_id": f"h{i}",
                "question": " ".join(rng.choices(WORDS, k=8)) + "?",
                "answer": context[0][0].split()[0],  # a word of the context: no label warning
                "context": context,
                "supporting_facts": [[context[0][0], 0]],
            }
            if i == 7:
                record["question"] = "  "  # rejected: an empty question
            handle.write(json.dumps(record) + "\n")
        handle.write("{not json\n")


def _run(tmp_path, name: str, one_at_a_time: bool, monkeypatch, whole_texts: bool | None = None, **options):
    with monkeypatch.context() as patch:
        if one_at_a_time:
            patch.setattr(compiler, "BATCH_SIZE", 1)
        if one_at_a_time if whole_texts is None else whole_texts:
            patch.setattr(HFTokenizer, "prefix_exact", property(lambda self: False))
        out = tmp_path / name
        run_compile(CompileOptions(out=str(out), tokenizer=TOKENIZER, progress=False, **options), print_fn=None)
    return directory_bytes(out)


@pytest.mark.parametrize("packing", [1, 3])
def test_batched_shards_equal_one_at_a_time(tmp_path, monkeypatch, packing):
    make_corpus(tmp_path / "docs", seed=4)
    _hotpot_lines(tmp_path / "docs" / "z_hotpot.jsonl", 40)
    schema = small_schema(tmp_path / "small.yaml", packing={"max_documents": packing})
    small = dict(inputs=[str(tmp_path / "docs")], schema=schema, shard_size=9)
    assert _run(tmp_path, "batched", False, monkeypatch, **small) == _run(
        tmp_path, "single", True, monkeypatch, **small
    )
    hotpot = dict(inputs=[str(tmp_path / "docs" / "z_hotpot.jsonl")], schema="hotpotqa", shard_size=16)
    batched = _run(tmp_path, "hotpot-batched", False, monkeypatch, **hotpot)
    assert batched == _run(tmp_path, "hotpot-single", True, monkeypatch, whole_texts=False, **hotpot)
    rejected = [json.loads(line) for line in batched["rejected.jsonl"].decode().splitlines()]
    assert [entry["document"] for entry in rejected] == [7, 40]
    # Against whole texts tokenized: documents past max_long_length differ only in the report of
    # what was never tokenized (the sizes before truncation, and its message).
    whole = _run(tmp_path, "hotpot-whole", True, monkeypatch, **hotpot)
    report = {"long_tokens_before", "globals_before", "truncation_messages"}
    messages = [
        m
        for name in batched
        if name.endswith(".parquet")
        for ms in pq.read_table(pa.BufferReader(batched[name])).column("truncation_messages").to_pylist()
        for m in ms
    ]
    assert any("tokenizing stopped" in m for m in messages)
    for name in (n for n in batched if n.endswith(".parquet")):
        a, b = (pq.read_table(pa.BufferReader(d[name])) for d in (batched, whole))
        assert a.drop_columns(list(report)).equals(b.drop_columns(list(report))), name


def test_batched_shards_equal_one_at_a_time_below_the_cut(tmp_path, monkeypatch):
    make_corpus(tmp_path / "docs", seed=5)
    options = dict(inputs=[str(tmp_path / "docs")], schema="etc-sentences", shard_size=11)
    assert _run(tmp_path, "a", False, monkeypatch, **options) == _run(tmp_path, "b", True, monkeypatch, **options)


def test_compile_many_equals_compile_windows_one_by_one(tmp_path):
    from graphattn.ingest.json import hotpotqa_graph

    _hotpot_lines(tmp_path / "h.jsonl", 20, seed=3)
    records = [json.loads(line) for line in (tmp_path / "h.jsonl").read_text().splitlines()[:-1]]
    graphs = [hotpotqa_graph(r) if i != 7 else "not a graph" for i, r in enumerate(records)]
    tokenizer = load_tokenizer(TOKENIZER)
    failed = []
    many = compile_many(
        graphs, "hotpotqa", tokenizer, compact=True, on_error=lambda i, g, e: failed.append((i, type(e).__name__))
    )
    assert failed == [(7, "CompileError")] and many[7] == []
    for graph, instances in zip(graphs, many):
        if isinstance(graph, str):
            continue
        (one,) = compile_windows(graph, "hotpotqa", tokenizer, compact=True)
        (got,) = instances
        assert got.long_token_ids.tolist() == one.long_token_ids.tolist() and got.global_node_ids == one.global_node_ids
        assert got.truncation == one.truncation
    with pytest.raises(Exception, match="DocGraph"):
        compile_many(graphs, "hotpotqa", tokenizer)
