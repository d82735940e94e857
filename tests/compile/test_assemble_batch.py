"""`assemble_many` (the batch path of compile_many and the corpus workers) equals `assemble` of
each instance alone, array for array, on a mixed batch: truncated documents, cut globals,
windows, targets, and documents that fail (each with its own exception, the others compiled)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from compile_helpers import WordTokenizer, schema_dict, sentences_doc

from graphattn.compile import compile_many, compile_windows
from graphattn.compile.assemble import _doc_nodes, _global_part, _long_part, assemble, begin_instance, token_lookups
from graphattn.compile.assemble_batch import assemble_many, batch_lookups, global_parts, long_parts
from graphattn.compile.compiler import _prepare
from graphattn.compile.layout import build_layout
from graphattn.compile.truncate import select, window_selections
from graphattn.errors import CompileError
from graphattn.graph import DocGraph
from graphattn.schema import load_schema


def assert_identical(got, want, where="instance"):
    """Every field equal; arrays also in dtype and shape."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape, where
        np.testing.assert_array_equal(got, want, err_msg=where)
    elif dataclasses.is_dataclass(want):
        assert type(got) is type(want), where
        for f in dataclasses.fields(want):
            assert_identical(getattr(got, f.name), getattr(want, f.name), f"{where}.{f.name}")
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for key in want:
            assert_identical(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            assert_identical(a, b, f"{where}[{i}]")
    else:
        assert got == want, where


RICH = dict(
    node_types={
        "document": {},
        "question": {"global": "per_token", "long": True, "segment": True, "type_id": 3, "ignore_hard_masks": True},
        "paragraph": {"global": "node", "segment": True, "sep_after": True, "global_type_id": 2},
        "sentence": {"global": "node", "long": True, "type_id": 1},
    },
    masks={"hard_g2l": True, "hard_l2g": True},
    global_prefix=["cls"],
    long_prefix=["cls"],
    special_tokens={"global": "[unused0]", "cls": "[CLS]"},
    targets={"support": {"kind": "global_labels", "node_types": "sentence", "attr": "label", "classes": ["no", "yes"]}},
)


def _doc(doc_id: str, paragraphs, question_words: int = 0, label: str = "yes") -> DocGraph:
    graph = sentences_doc(paragraphs, doc_id)
    data = graph.to_dict()
    if question_words:
        question = " ".join(f"q{i}" for i in range(question_words))
        shift = len(question) + 1
        data["text"] = question + " " + data["text"]
        for node in data["nodes"]:
            if node.get("span") is not None:
                node["span"] = [node["span"][0] + shift, node["span"][1] + shift]
        data["nodes"][0]["span"] = [0, len(data["text"])]
        data["nodes"].append({"id": "q", "type": "question", "span": [0, len(question)]})
        data["edges"].append({"src": "doc", "dst": "q", "relation": "contains"})
    for node in data["nodes"]:
        if node["type"] == "sentence":
            node.setdefault("attrs", {})["label"] = label
    return DocGraph.from_dict(data)


def _mixed_batch() -> list[DocGraph]:
    return [
        _doc("a", [[3, 2], [4]], question_words=2),
        _doc("b", [[2]]),
        _doc("long", [[6, 5, 4], [7, 3], [5, 5, 5]], question_words=3),  # past max_long_length: truncated
        _doc("bad-label", [[2, 2]], label="maybe"),  # fails in assembly (target class)
        DocGraph("   ", doc_id="blank"),  # fails in layout
        _doc("wide", [[1] * 9, [1] * 6]),  # many sentence globals: cut to max_global_length
        _doc("c", [[4, 1], [2, 2]], question_words=1),
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        dict(max_long_length=24, max_global_length=10),
        dict(max_long_length=18, max_global_length=12, truncation={"policy": "drop_longest_first", "unit": "sentence"}),
        dict(max_long_length=12, truncation={"policy": "windows", "stride": 5, "pin": ["question"]}),
        dict(max_long_length=512, max_global_length=64),
    ],
    ids=["tail", "drop_longest_first", "windows", "fits"],
)
@pytest.mark.parametrize("compact", [True, False])
def test_batch_equals_one_instance_at_a_time(overrides, compact):
    schema, tokenizer, table = _prepare(load_schema(schema_dict(**RICH, **overrides)), WordTokenizer())
    items, failures = [], 0
    for graph in _mixed_batch():
        try:
            layout = build_layout(graph, schema, tokenizer)
        except CompileError:
            failures += 1
            continue
        if schema.truncation.policy == "windows":
            items.extend(([layout], [sel]) for sel in window_selections(layout, schema))
        else:
            items.append(([layout], select([layout], schema)))
    assert failures == 1 and len(items) >= 6
    batched = assemble_many(items, schema, table, compact=compact)
    truncated = 0
    for (layouts, selections), got in zip(items, batched):
        try:
            want = assemble(layouts, selections, schema, table, compact=compact)
        except CompileError as err:
            assert isinstance(got, CompileError) and str(got) == str(err)
            assert layouts[0].graph.doc_id == "bad-label"
            continue
        assert_identical(got, want, layouts[0].graph.doc_id)
        truncated += want.truncation.truncated
    assert (truncated >= 2) == (schema.max_long_length < 512)
    # the batched steps themselves (assemble_many would fall back to each document alone)
    pairs = [(lay, sel) for lays, sels in items for lay, sel in zip(lays, sels)]
    batched = long_parts(pairs, schema)
    global_parts(batched, schema)
    for (lay, sel), got in zip(pairs, batched):
        want = _long_part(lay, sel, schema)
        _global_part(want, schema)
        assert_identical(got, want, lay.graph.doc_id)
    begun = [begin_instance(lays, sels, schema)[0] for lays, sels in items if lays[0].graph.doc_id != "bad-label"]
    for got, docs in zip(batch_lookups(begun, schema, table), begun):
        want = token_lookups(docs, schema, table)
        offsets = np.cumsum([0] + [doc.long_length for doc in docs])
        want.targets = [_doc_nodes(doc, schema, int(offset)) for doc, offset in zip(docs, offsets)]
        assert_identical(got, want)


def test_compile_many_reports_each_failing_document_and_compiles_the_others():
    schema = load_schema(schema_dict(**RICH, max_long_length=24, max_global_length=10))
    graphs = _mixed_batch()
    failed = []
    many = compile_many(graphs, schema, WordTokenizer(), on_error=lambda i, g, e: failed.append((i, str(e))))
    assert [i for i, _ in failed] == [3, 4]
    assert "'maybe' is not one of ['no', 'yes']" in failed[0][1] and "empty document" in failed[1][1]
    tokenizer = WordTokenizer()
    for i, (graph, instances) in enumerate(zip(graphs, many)):
        if i in (3, 4):
            assert instances == []
            continue
        assert_identical(instances, compile_windows(graph, schema, tokenizer), graph.doc_id)
    with pytest.raises(CompileError, match="'maybe'"):  # without on_error the first failure raises
        compile_many(graphs, schema, WordTokenizer())


def test_an_assembly_batch_of_packed_instances_equals_each_alone():
    schema, tokenizer, table = _prepare(load_schema(schema_dict(**RICH, packing={"max_documents": 3})), WordTokenizer())
    layouts = [build_layout(g, schema, tokenizer) for g in _mixed_batch() if g.doc_id not in ("blank", "bad-label")]
    items = [(layouts[:3], select(layouts[:3], schema)), (layouts[3:], select(layouts[3:], schema))]
    for (lays, sels), got in zip(items, assemble_many(items, schema, table, compact=True)):
        assert_identical(got, assemble(lays, sels, schema, table, compact=True))


def test_a_layout_keeps_its_nodes_when_its_graph_grows_later():
    """A layout indexes its graph's own id list (no copy of a large page's ids): nodes added to
    the graph afterwards are not the layout's, and the instance from it is unchanged."""
    schema = load_schema(schema_dict())
    graph = sentences_doc([[2, 3], [4]])
    tokenizer = WordTokenizer()
    layout = build_layout(graph, schema, tokenizer)
    want = assemble([layout], select([layout], schema), schema, _prepare(schema, tokenizer)[2], compact=True)
    before = list(layout.node_ids)
    graph.add_node("late", "sentence", (0, 2))
    assert layout.n_nodes == len(before) == len(layout.node_type)
    got = assemble([layout], select([layout], schema), schema, _prepare(schema, tokenizer)[2], compact=True)
    assert_identical(got, want)
    assert graph.node_ids[: len(before)] == before
