"""Issue 15 at compile time: schema values across their documented ranges and beyond (item 1), the
packed global_prefix cut (item 4), feature values (item 5), document text that spells special tokens
or holds lone surrogates (item 6), the `error` truncation policy (item 9). Property tests generate
each kind; memory is bounded with tracemalloc (no test allocates more than the bound it checks)."""

import json
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from compile_helpers import WordTokenizer, schema_dict, sentences_doc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compiler_properties import documents

from graphattn import compile_instance, load_schema
from graphattn.compile.assemble import DENSE_LIMIT_BYTES
from graphattn.errors import CompileError, SchemaError
from graphattn.graph import DocGraph
from graphattn.schema import JSON_SCHEMA_PATH
from graphattn.tokenize import HFTokenizer, SpacyWordTokenizer

TOKENIZER = Path(__file__).resolve().parents[2] / "examples" / "data" / "tokenizer.json"
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- item 1: every numeric key, across its documented range and beyond ---------------------------
def _maximum(path: tuple[str, ...]) -> int:
    """The documented maximum of a key, read from relation-schema.json (the test follows the file)."""
    root = json.loads(JSON_SCHEMA_PATH.read_text())

    def resolve(node):
        return {**root["$defs"][node["$ref"].split("/")[-1]], **node} if "$ref" in node else node

    node = root
    for key in path:
        node = resolve(node["properties"][key] if key in node.get("properties", {}) else node["additionalProperties"])
    if "maximum" in node:
        return node["maximum"]
    return next(branch["maximum"] for branch in node["oneOf"] if branch.get("type") == "integer")


NUMERIC_KEYS = [
    ("local_radius",),
    ("relative_pos_max_distance",),
    ("relative_vocab_size",),
    ("max_long_length",),
    ("max_global_length",),
    ("packing", "max_documents"),
    ("fixed_blocks", "tokens_per_block"),
    ("fixed_blocks", "type_id"),
    ("truncation", "stride"),
    ("node_types", "sentence", "type_id"),
    ("node_types", "sentence", "global_type_id"),
    ("special_tokens", "global"),
    ("node_types", "sentence", "global_token"),
]


@st.composite
def numeric_overrides(draw):
    """A schema with 1-3 numeric keys set to values near, at and past their documented bounds."""
    raw = schema_dict()
    for path in draw(st.lists(st.sampled_from(NUMERIC_KEYS), min_size=1, max_size=3, unique=True)):
        top = _maximum(path)
        value = draw(
            st.one_of(
                st.integers(1, 64),
                st.sampled_from([top, top - 1, top + 1, 2**31, 2**32 + 7, 2**63 - 1, 10**30]),
                st.integers(top - 1000, top + 1000),
                st.integers(-5, 0),
            )
        )
        value = float(value) if draw(st.booleans()) and abs(value) < 2**53 else value
        node = raw
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
        if path[0] == "fixed_blocks":
            node.setdefault("tokens_per_block", 4)
        if path[0] == "truncation":
            node["policy"] = "windows"
    return raw


@SETTINGS
@given(numeric_overrides(), st.booleans())
def test_any_numeric_value_compiles_or_is_a_schema_error_within_a_memory_bound(raw, compact):
    tok = WordTokenizer()
    graph = sentences_doc([[2, 3]])  # five tokens: nothing here needs more than a few MB
    tracemalloc.start()
    try:
        schema = load_schema(raw)
        inst = compile_instance(graph, schema, tok, compact=compact)
    except SchemaError as err:
        assert err.location.path, str(err)  # a key path names the value
    except CompileError as err:
        assert err.location.path or err.location.node, str(err)  # a token id past the vocabulary, ...
    else:
        assert inst.long_length == min(5, schema.max_long_length)
        assert (inst.long_type_ids >= 0).all() and (inst.global_type_ids >= 0).all()  # nothing wrapped in int32
        assert inst.side.local_radius == schema.local_radius
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 64 << 20


def test_the_largest_radius_costs_only_what_a_five_token_document_needs():
    schema = load_schema(schema_dict(local_radius=16384, relative_pos_max_distance=16384, relative_vocab_size=40000))
    tracemalloc.start()
    inst = compile_instance(sentences_doc([[2, 3]]), schema, WordTokenizer())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert inst.side.l2l_att_mask.shape == (5, 32769)
    assert peak < 16 << 20  # 5 x 32769 x int32 x 2 tensors = 1.3 MB, plus 32771 label names


def test_dense_side_inputs_past_the_limit_are_refused_before_allocating():
    schema = load_schema(schema_dict(local_radius=16384, max_long_length=1 << 24))
    n = DENSE_LIMIT_BYTES // (8 * (2 * 16384 + 1)) + 1  # long tokens whose l2l tensors pass the limit
    graph = DocGraph(" ".join(["w"] * n), doc_id="big")
    graph.add_node("doc", "document", (0, len(graph.text)))
    graph.add_child("doc", "p", "paragraph", (0, len(graph.text)))
    graph.add_child("p", "s", "sentence", (0, len(graph.text)))
    with pytest.raises(CompileError, match=r"would take 4\.0 GiB, over graphattn\.compile\.assemble\.DENSE") as err:
        compile_instance(graph, schema, WordTokenizer())
    assert tuple(err.value.location.path) == ("local_radius",)
    assert compile_instance(graph, schema, WordTokenizer(), compact=True).long_length == n


# -- item 4: packed documents with global prefixes and tight global budgets ----------------------
@st.composite
def packed_cases(draw):
    n_docs = draw(st.integers(2, 3))
    graphs = [draw(documents(d, False, 0)) for d in range(n_docs)]
    prefix = draw(st.sampled_from([["cls"], ["cls", "sep"], ["sep", "cls", "sep"]]))
    raw = schema_dict(
        global_prefix=prefix,
        long_prefix=draw(st.sampled_from([[], ["cls"]])),
        packing={"max_documents": 3},
        node_types={
            "document": {},
            "paragraph": {"global": draw(st.sampled_from(["node", "none"]))},
            "sentence": {"global": "node", "long": True},
        },
    )
    roomy = load_schema(raw)
    full = compile_instance(graphs, roomy, WordTokenizer())
    budget = draw(st.integers(len(prefix), full.global_length))
    return graphs, roomy, load_schema({**raw, "max_global_length": budget}), full


@SETTINGS
@given(packed_cases())
def test_a_tight_global_budget_cuts_the_last_globals_even_inside_a_later_prefix(case):
    graphs, roomy, schema, full = case
    tok = WordTokenizer()
    inst = compile_instance(graphs, schema, tok)
    G = schema.max_global_length
    assert inst.global_length == min(G, full.global_length)
    assert inst.global_node_ids == full.global_node_ids[:G]  # a prefix of the uncut order, [CLS]/[SEP] included
    np.testing.assert_array_equal(inst.global_token_ids, full.global_token_ids[:G])
    np.testing.assert_array_equal(inst.global_doc_index, full.global_doc_index[:G])
    np.testing.assert_array_equal(inst.long_token_ids, full.long_token_ids)
    side = inst.side
    cross = inst.global_doc_index[:, None] != inst.global_doc_index[None, :]
    assert not side.g2g_att_mask[cross].any()  # still nothing across packed documents
    assert not side.l2g_att_mask[inst.long_doc_index[:, None] != inst.global_doc_index[None, :]].any()
    compact = compile_instance(graphs, schema, tok, compact=True)
    for name, value in compact.side.to_dense().as_dict().items():
        np.testing.assert_array_equal(value, getattr(side, name), err_msg=name)


def test_the_issues_minimal_packed_prefix_case():
    schema = load_schema(schema_dict(global_prefix=["cls", "sep"], max_global_length=4, packing={"max_documents": 2}))
    inst = compile_instance([sentences_doc([[2]], "a"), sentences_doc([[2]], "b")], schema, WordTokenizer())
    assert inst.global_node_ids == ["<cls>", "<sep>", "p0.s0", "<cls>"]
    assert inst.global_token_ids.tolist() == [2, 3, 5, 2]
    assert inst.truncation.dropped_nodes == ["b/p0.s0"]


# -- item 5: feature values -----------------------------------------------------------------------
FEATURE_VALUES = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.integers(-3, 30),
)


def _acceptable(value, dtype: str, bounds: dict) -> bool:
    """The documented rule, written out independently of the compiler's."""
    if not isinstance(value, (int, float)) or not np.isfinite(float(value)):
        return False
    low, high = (-(2**31), 2**31 - 1) if dtype == "int32" else (-3.4028234663852886e38, 3.4028234663852886e38)
    low, high = bounds.get("minimum", low), bounds.get("maximum", high)
    return low <= value <= high and (dtype == "float32" or float(value).is_integer())


@SETTINGS
@given(
    st.lists(FEATURE_VALUES, min_size=3, max_size=3),
    st.sampled_from(["int32", "float32"]),
    st.sampled_from([{}, {"minimum": 0, "maximum": 23}]),
)
def test_feature_values_are_exact_or_a_compile_error_naming_node_and_attr(values, dtype, bounds):
    schema = load_schema(schema_dict(features=[{"name": "f", "attr": "size", "dtype": dtype, **bounds}]))
    graph = sentences_doc([[1, 1, 1]])
    for s, value in enumerate(values):
        graph.node(f"p0.s{s}").attrs["size"] = value
    bad = [s for s, value in enumerate(values) if not _acceptable(value, dtype, bounds)]
    if bad:
        where = r"attr 'size': .* \(feature 'f' of schema 'test', \$\.features\[0\]\)"
        with pytest.raises(CompileError, match=where) as err:
            compile_instance(graph, schema, WordTokenizer())
        assert err.value.location.node == f"p0.s{bad[0]}"
        return
    got = compile_instance(graph, schema, WordTokenizer()).features["global:f"]
    for s, value in enumerate(values):
        assert got[s] == (np.float32(value) if dtype == "float32" else int(value))  # never wrapped or truncated


def test_the_issues_feature_examples():
    schema = load_schema(schema_dict(features=["size"]))
    for value, problem in [
        ("12px", "'12px' is not a number"),
        (1e10, "10000000000.0 is outside [-2147483648, 2147483647] (dtype int32)"),
        (float("nan"), "nan is not a finite number"),
    ]:
        graph = sentences_doc([[2]])
        graph.node("p0.s0").attrs["size"] = value
        with pytest.raises(CompileError, match=re.escape(f"node 'p0.s0': attr 'size': {problem}")) as err:
            compile_instance(graph, schema, WordTokenizer())
        assert "$.features[0]" in str(err.value)


# -- item 6: text that spells special tokens, and lone surrogates ---------------------------------
SPECIAL_STRINGS = ["[SEP]", "[CLS]", "[MASK]", "[PAD]", "[UNK]", "[unused0]", "<s>", "</s>"]
SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\ud83d"])
PIECES = st.one_of(st.sampled_from(SPECIAL_STRINGS), st.text(max_size=6), SURROGATES)
TEXTS = st.lists(PIECES, min_size=1, max_size=8).map(" ".join)


HF = HFTokenizer.from_file(TOKENIZER)
SPACY = SpacyWordTokenizer(special_tokens=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "SEP", "PAD"))


@settings(max_examples=200, deadline=None)
@given(TEXTS)
def test_document_text_never_encodes_to_a_special_id(text):
    for tokenizer in (HF, SPACY):
        enc = tokenizer.encode(text)
        special = {tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id}
        assert not special & set(enc.ids.tolist()), (text, enc.tokens)
        assert (enc.offsets[:, 0] >= 0).all() and (enc.offsets[:, 1] <= len(text)).all()
        assert [e.ids.tolist() for e in tokenizer.encode_batch([text, text])] == [enc.ids.tolist()] * 2


def test_special_token_strings_in_a_document_compile_as_text_and_separators_come_from_the_compiler():
    text = "a [SEP] b [CLS] c [MASK] d [PAD]"
    graph = DocGraph(text, doc_id="forged")
    graph.add_node("doc", "document", (0, len(text)))
    graph.add_child("doc", "p", "paragraph", (0, len(text)))
    graph.add_child("p", "s", "sentence", (0, len(text)))
    node_types = {"document": {}, "paragraph": {"sep_after": True}, "sentence": {"global": "node", "long": True}}
    schema = load_schema(schema_dict(long_prefix=["cls"], special_tokens={"global": 1}, node_types=node_types))
    ids = compile_instance(graph, schema, HF).long_token_ids.tolist()
    assert ids[0] == HF.cls_id and ids[-1] == HF.sep_id  # the compiler's own [CLS] and [SEP], nothing else
    assert HF.cls_id not in ids[1:] and HF.sep_id not in ids[:-1] and HF.mask_id not in ids and HF.pad_id not in ids
    assert len(ids) > 2 + 8  # "[SEP]" became several text tokens


def test_a_lone_surrogate_encodes_as_a_replacement_character_keeping_offsets():
    text = "caf\u00e9 w\ud800rld end"
    enc = HF.encode(text)
    assert [text[a:b] for a, b in enc.offsets][-1] == "end"
    spacy_enc = SPACY.encode(text)
    assert [text[a:b] for a, b in spacy_enc.offsets] == ["caf\u00e9", "w", "\ud800", "rld", "end"]
    assert spacy_enc.tokens[2] == "\ufffd"  # the token is U+FFFD; its offsets still index the graph's text


# -- item 9: truncation policy error refuses globals too -------------------------------------------
def test_error_policy_refuses_globals_over_max_global_length():
    schema = load_schema(schema_dict(max_global_length=2, truncation={"policy": "error"}))
    with pytest.raises(CompileError, match=r"node 'd': document needs 3 long and 3 global tokens; the schema allows"):
        compile_instance(sentences_doc([[1, 1, 1]]), schema, WordTokenizer())
    assert compile_instance(sentences_doc([[1, 1]]), schema, WordTokenizer()).global_length == 2
    packed = load_schema(schema_dict(max_global_length=1, truncation={"policy": "error"}, packing={"max_documents": 2}))
    with pytest.raises(CompileError, match=r"node 'a': the 2 packed documents need 2 long and 2 global tokens"):
        compile_instance([sentences_doc([[1]], "a"), sentences_doc([[1]], "b")], packed, WordTokenizer())


@SETTINGS
@given(
    st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=3), min_size=1, max_size=3),
    st.integers(1, 12),
    st.integers(1, 8),
)
def test_error_policy_never_cuts(paragraphs, max_long, max_global):
    raw = schema_dict(max_long_length=max_long, max_global_length=max_global, truncation={"policy": "error"})
    schema = load_schema(raw)
    try:
        inst = compile_instance(sentences_doc(paragraphs), schema, WordTokenizer())
    except CompileError as err:
        assert err.location.node == "d" and "truncation policy is 'error'" in str(err)
        return
    assert not inst.truncation.truncated and inst.truncation.messages == []


def test_windows_refuse_pinned_text_longer_than_max_long_length():
    schema = load_schema(
        schema_dict(max_long_length=3, truncation={"policy": "windows", "stride": 1, "pin": ["sentence"]})
    )
    with pytest.raises(CompileError, match=r"the pinned nodes \(sentence\) leave no room"):
        compile_instance(sentences_doc([[5]]), schema, WordTokenizer())
