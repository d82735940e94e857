"""The pieces of the corpus pipeline on hand-made inputs: planning, spans, dtypes, failures."""

from __future__ import annotations

import json

import numpy as np
import pytest
from corpus_helpers import TOKENIZER, make_corpus, small_schema
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn.compile import assemble_batch, compile_windows, compiler
from graphattn.corpus.pipeline import CompileOptions, plan, run_compile
from graphattn.corpus.sources import InputFile, expand_inputs, plan_file, sniff_format
from graphattn.errors import GraphattnError
from graphattn.schema import load_schema
from graphattn.shards.dataset import ShardDataset
from graphattn.shards.format import Provenance, ShardColumns, instance_row, span_columns, spans_from_columns
from graphattn.tokenize import load_tokenizer


def _file(name: str, documents: int) -> InputFile:
    return InputFile(path=name, reader="records", format="docgraph", documents=documents, size=0, mtime_ns=0)


def test_plan_cuts_document_numbers_into_shards_across_files():
    tasks = plan([_file("a", 3), _file("b", 1), _file("c", 5)], shard_size=4)
    got = [
        (t.index, t.first_document, t.documents, [(s.path, s.start, s.stop, s.first_number) for s in t.segments])
        for t in tasks
    ]
    assert got == [
        (0, 0, 4, [("a", 0, 3, 0), ("b", 0, 1, 3)]),
        (1, 4, 4, [("c", 0, 4, 4)]),
        (2, 8, 1, [("c", 4, 5, 8)]),
    ]
    assert plan([_file("a", 4)], shard_size=2)[-1].documents == 2
    assert plan([], shard_size=3) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 50), st.integers(0, 9)), max_size=40))
def test_char_spans_survive_the_gap_and_length_columns(pairs):
    spans = np.asarray([(-1, -1) if s < 0 else (s, s + n) for s, n in pairs], np.int32).reshape(-1, 2)
    columns = span_columns(spans)
    back = spans_from_columns(columns["long_char_gap"], columns["long_char_length"])
    assert back.dtype == np.int32
    np.testing.assert_array_equal(back, spans)


def test_gap_and_length_columns_by_hand():
    spans = np.array([[-1, -1], [0, 3], [4, 9], [9, 10], [-1, -1], [0, 2]], np.int32)
    columns = span_columns(spans)
    np.testing.assert_array_equal(columns["long_char_gap"], [-1, 1, 1, 0, -11, 1])
    np.testing.assert_array_equal(columns["long_char_length"], [0, 3, 5, 1, 0, 2])


def test_layout_picks_narrow_dtypes_from_schema_and_vocabulary():
    schema = load_schema("hotpotqa")
    small = ShardColumns.for_run(schema, vocab_size=30_000)
    assert (small.token, small.gpos, small.label, small.doc, small.type) == ("uint16", "int16", "int8", "int8", "int16")
    assert small.levels == ("question", "paragraph", "title", "sentence")
    assert ShardColumns.for_run(schema, vocab_size=250_002).token == "int32"


def test_values_that_do_not_fit_the_run_dtypes_are_refused(tmp_path):
    from graphattn.ingest.text import text_to_graph

    schema, tokenizer = load_schema("etc-sentences"), load_tokenizer(TOKENIZER)
    (instance,) = compile_windows(text_to_graph("One sentence here. Another one."), schema, tokenizer, compact=True)
    layout = ShardColumns.for_run(schema, tokenizer.vocab_size)
    where = Provenance([0], ["x.txt"], [None], [None])
    assert instance_row(instance, where, layout)["long_token_ids"].dtype == np.uint16
    instance.long_token_ids[1] = 70_000
    with pytest.raises(GraphattnError, match="long_token_ids holds 70000"):
        instance_row(instance, where, layout)


def test_expand_inputs_order_duplicates_and_errors(tmp_path):
    for name in ("b/2.txt", "b/1.json", "b/.hidden.txt", "b/notes.csv", "a.html", "c.dat"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    files, skipped = expand_inputs(
        [str(tmp_path / "c.dat"), str(tmp_path / "b"), str(tmp_path / "*.html"), str(tmp_path / "b" / "2.txt")]
    )
    assert files == [str(tmp_path / p) for p in ("c.dat", "b/1.json", "b/2.txt", "a.html")]
    assert skipped == [str(tmp_path / "b" / "notes.csv")]
    with pytest.raises(GraphattnError, match="no such file"):
        expand_inputs([str(tmp_path / "missing.json")])
    with pytest.raises(GraphattnError, match="matches no file"):
        expand_inputs([str(tmp_path / "*.xml")])
    unknown = plan_file(str(tmp_path / "c.dat"))
    assert unknown.reader == "broken" and "pass --format" in unknown.problem[1]


def test_json_files_are_told_apart_by_their_keys(tmp_path):
    assert sniff_format([{"text": "t", "nodes": []}]) == "docgraph"
    assert sniff_format([[1], {"question": "q", "context": []}]) == "hotpotqa"
    assert sniff_format([{"query": "q", "supports": []}]) == "wikihop"
    assert sniff_format([{"question_text": "q", "document_text": "d"}]) == "nq"
    assert sniff_format([{"title": "t"}]) is None
    path = tmp_path / "other.jsonl"
    path.write_text('{"title": "t", "body": "b"}\n\n{"title": "u"}\n')
    planned = plan_file(str(path))
    assert (
        planned.reader == "broken"
        and "cannot tell the JSON record format" in planned.problem[1]
        and "body, title" in planned.problem[1]
    )
    assert plan_file(str(path), "docgraph").documents == 2
    assert plan_file(str(path), "docgraph").lines.tolist() == [1, 3]


def test_an_unexpected_exception_rejects_one_document_and_names_the_code(tmp_path, monkeypatch):
    make_corpus(tmp_path / "docs", seed=5)
    original = assemble_batch.finish_instance  # one instance from its documents, inside compile_many's batch

    def failing(docs, *args, **kwargs):
        if docs[0].lay.graph.doc_id == "j2":
            raise ZeroDivisionError("boom")
        return original(docs, *args, **kwargs)

    monkeypatch.setattr(assemble_batch, "finish_instance", failing)
    out = tmp_path / "out"
    unpacked = small_schema(tmp_path / "one-per-instance.yaml", packing={"max_documents": 1})
    run_compile(
        CompileOptions(
            inputs=[str(tmp_path / "docs")],
            schema=unpacked,
            out=str(out),
            tokenizer=TOKENIZER,
            progress=False,
            shard_size=50,
        ),
        print_fn=None,
    )
    (entry,) = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines() if "boom" in line]
    assert (entry["error"], entry["message"], entry["doc_id"], entry["line"]) == ("ZeroDivisionError", "boom", "j2", 3)
    assert entry["at"].startswith("test_corpus_units.py:")


def test_a_pack_that_fails_falls_back_to_single_documents(tmp_path, monkeypatch):
    make_corpus(tmp_path / "docs", seed=6)
    original = compiler.assemble

    def failing(layouts, *args, **kwargs):
        if len(layouts) > 1 and any(lay.graph.doc_id == "j1" for lay in layouts):
            raise RuntimeError("cannot assemble j1")
        return original(layouts, *args, **kwargs)

    monkeypatch.setattr(compiler, "assemble", failing)
    out = tmp_path / "out"
    run_compile(
        CompileOptions(
            inputs=[str(tmp_path / "docs" / "a_docs.jsonl")],
            schema=small_schema(tmp_path / "s.yaml"),
            out=str(out),
            tokenizer=TOKENIZER,
            progress=False,
        ),
        print_fn=None,
    )
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert "j1" not in {e["doc_id"] for e in rejected}  # alone, j1 compiles
    dataset = ShardDataset(out)
    groups = [dataset[i].doc_ids for i in range(len(dataset))]
    assert ["j1"] in groups and ["j0"] in groups  # its pack-mates were compiled on their own too
    assert any(len(g) > 1 for g in groups)


def test_shards_store_the_hard_mask_flags_per_query_row(tmp_path):
    """Format 2: one hard-mask flag per query row (long_hard_l2g [L], global_hard_g2l [G]); rows
    read back give the compiler's compact form and dense tensors; format 1 shards are refused."""
    import pyarrow.parquet as pq
    import yaml

    from graphattn.compile import compile_instance
    from graphattn.ingest.json import hotpotqa_graph
    from graphattn.schema import SCHEMA_DIR
    from graphattn.shards.format import encode_shard, rows_to_table, shard_metadata
    from graphattn.shards.reader import DecodedRows, read_info
    from graphattn.shards.verify import ShardFormatError

    data = yaml.safe_load((SCHEMA_DIR / "hotpotqa.yaml").read_text())
    data["masks"] = {"hard_g2l": True, "hard_l2g": True}
    schema, tokenizer = load_schema(data), load_tokenizer(TOKENIZER)
    graph = hotpotqa_graph({"question": "Who won?", "context": [["A", ["a b.", "c."]], ["B", ["d e."]]]})
    instance = compile_instance(graph, schema, tokenizer, compact=True)
    layout = ShardColumns.for_run(schema, tokenizer.vocab_size)
    table = rows_to_table([instance_row(instance, Provenance([0], ["h.json"], [1], [0]), layout)], layout)
    assert "long_hard_l2g" in table.column_names and "global_hard_g2l" in table.column_names
    assert "long_hard_g2l" not in table.column_names and "global_hard_l2g" not in table.column_names
    metadata = shard_metadata({}, "", schema.label_vocab(), layout, {"index": 0})
    path = tmp_path / "shard.parquet"
    path.write_bytes(encode_shard(table, metadata))
    back = DecodedRows(pq.read_table(path), read_info(path)).instance(0, compact=True).side
    side = instance.side
    question_tokens = instance.long_owners["question"] >= 0
    np.testing.assert_array_equal(back.long_hard_l2g, side.long_hard_l2g)
    np.testing.assert_array_equal(side.long_hard_l2g, ~question_tokens)  # question rows ignore hard masks
    np.testing.assert_array_equal(back.global_hard_g2l, side.global_hard_g2l)
    for name, value in side.to_dense().as_dict().items():
        np.testing.assert_array_equal(getattr(back.to_dense(), name), value, err_msg=name)
    old = tmp_path / "old.parquet"
    old.write_bytes(encode_shard(table, {**metadata, b"graphattn.format": b"graphattn-shards/1"}))
    with pytest.raises(ShardFormatError, match="format 'graphattn-shards/1', expected 'graphattn-shards/3'"):
        read_info(old)
