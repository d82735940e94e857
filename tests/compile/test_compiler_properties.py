"""Property tests: the vectorized compiler against the brute-force reference (reference.py) on
random hierarchies, radii, distances, lengths, masks, segments, links, packing and padding."""

import numpy as np
from compile_helpers import WordTokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import reference

from graphattn import collate, compile_instance, load_schema
from graphattn.graph import DocGraph


@st.composite
def documents(draw, d: int, with_question: bool, n_candidates: int):
    words = iter(f"d{d}w{i}" for i in range(10_000))
    text, pos = [], 0

    def add(n_words):
        nonlocal pos
        chunk = " ".join(next(words) for _ in range(n_words))
        span = (pos, pos + len(chunk))
        text.append(chunk + " ")
        pos += len(chunk) + 1
        return span

    question = add(draw(st.integers(1, 3))) if with_question else None
    doc_start = pos
    paragraphs = []
    for _ in range(draw(st.integers(1, 3))):
        p_start = pos
        sentences = [add(draw(st.integers(1, 5))) for _ in range(draw(st.integers(1, 3)))]
        paragraphs.append(((p_start, pos - 1), sentences))
    graph = DocGraph("".join(text), doc_id=f"doc{d}")
    graph.add_node("doc", "document", (doc_start, pos - 1))
    if question:
        graph.add_node("q", "question", question)
    for c in range(n_candidates):
        graph.add_node(f"c{c}", "candidate")
    sentence_ids = []
    for p, (p_span, sentences) in enumerate(paragraphs):
        graph.add_child("doc", f"p{p}", "paragraph", p_span)
        for s, span in enumerate(sentences):
            graph.add_child(f"p{p}", f"p{p}s{s}", "sentence", span)
            sentence_ids.append(f"p{p}s{s}")
    for c in range(n_candidates):
        for sid in draw(st.lists(st.sampled_from(sentence_ids), max_size=2, unique=True)):
            graph.add_edge(sid, "mentions", f"c{c}")
    return graph


@st.composite
def cases(draw):
    with_question = draw(st.booleans())
    n_candidates = draw(st.integers(0, 2))
    n_docs = draw(st.integers(1, 3))
    graphs = [draw(documents(d, with_question, n_candidates)) for d in range(n_docs)]
    paragraph_global = draw(st.booleans())
    paragraph_segment = draw(st.booleans())
    node_types = {
        "document": {"long": True, "sep_after": draw(st.booleans()), "type_id": 1},
        "paragraph": {"global": "node" if paragraph_global else "none", "segment": paragraph_segment},
        "sentence": {"global": "node", "long": True, "type_id": draw(st.integers(0, 3))},
        "question": {
            "global": draw(st.sampled_from(["per_token", "node", "none"])),
            "long": True,
            "sep_after": draw(st.booleans()),
            "ignore_hard_masks": draw(st.booleans()),
        },
        "candidate": {"global": "node", "ignore_hard_g2l": draw(st.booleans()), "global_token": "[unused1]"},
    }
    relations = {
        "contains": {"hierarchy": True},
        "mentions": {"link": "l2g", **({"label": "mention"} if draw(st.booleans()) else {})},
    }
    if paragraph_global and draw(st.booleans()):
        relations["contains"].update(link="g2g", label="child", reverse_label="parent")
    segments = {}
    if paragraph_segment:
        segments["block_g2g"] = draw(st.sampled_from([False, True, ["sentence"]]))
        if draw(st.booleans()):
            segments["cross_segment_label"] = "cross"
    global_types = [t for t, v in node_types.items() if v.get("global", "none") != "none"]
    order = draw(st.permutations(global_types))
    split = draw(st.integers(1, len(order)))
    raw = {
        "name": "random",
        "local_radius": draw(st.integers(1, 5)),
        "relative_pos_max_distance": draw(st.integers(1, 4)),
        "relative_vocab_size": 64,
        "max_long_length": 4096,
        "max_global_length": 4096,
        "special_tokens": {"global": "[unused0]"},
        "long_prefix": draw(st.sampled_from([[], ["cls"]])),
        "global_prefix": draw(st.sampled_from([[], ["cls"]])),
        "node_types": node_types,
        "relations": relations,
        "masks": {"hard_g2l": draw(st.booleans()), "hard_l2g": draw(st.booleans())},
        "global_order": [list(order[:split]), *order[split:]],
        "packing": {"max_documents": 3},
    }
    if segments:
        raw["segments"] = segments
    return graphs, load_schema(raw)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(0, 3), st.integers(0, 2))
def test_compiler_matches_the_brute_force_reference(case, extra_long, extra_global):
    graphs, schema = case
    tok = WordTokenizer()
    inst = compile_instance(graphs, schema, tok)
    expected = reference(graphs, schema, tok)
    for name in ("long_token_ids", "global_token_ids", "long_doc_index"):
        np.testing.assert_array_equal(getattr(inst, name), expected[name], err_msg=name)
    for name, value in inst.side.as_dict().items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)

    compact = compile_instance(graphs, schema, tok, compact=True)
    for name, value in compact.side.to_dense().as_dict().items():
        np.testing.assert_array_equal(value, expected[name], err_msg=f"compact {name}")

    L, G = inst.long_length + extra_long, inst.global_length + extra_global
    batch = collate([inst, compact], pad_to_long=L, pad_to_global=G)
    _check_padding(batch, inst, expected, schema)


def _check_padding(batch, inst, expected, schema):
    """Padding is one more document: it attends padding only, with distance / dnb ids."""
    k, r = schema.relative_pos_max_distance, schema.local_radius
    n_long, n_global = inst.long_length, inst.global_length
    for b in range(2):
        side = batch.side.to_numpy().map(lambda a: a[b])
        L, G = side.long_length, side.global_length
        is_pad_long = np.arange(L) >= n_long
        is_pad_global = np.arange(G) >= n_global
        for i in range(L):
            for c in range(2 * r + 1):
                j = i + c - r
                want = expected["l2l_att_mask"][i, c] if i < n_long else int(0 <= j < L and is_pad_long[j])
                if i < n_long and not 0 <= j < n_long:
                    want = 0
                assert side.l2l_att_mask[i, c] == want, (b, i, c)
        np.testing.assert_array_equal(side.l2g_att_mask[n_long:, n_global:], 1)
        np.testing.assert_array_equal(side.l2g_att_mask[:n_long, n_global:], 0)
        np.testing.assert_array_equal(side.l2g_att_mask[n_long:, :n_global], 0)
        np.testing.assert_array_equal(side.g2l_att_mask[n_global:], is_pad_long[None, :].repeat(G - n_global, 0))
        np.testing.assert_array_equal(side.g2g_att_mask[n_global:, n_global:], 1)
        np.testing.assert_array_equal(side.g2g_att_mask[:n_global, n_global:], 0)
        np.testing.assert_array_equal(side.l2g_relative_att_ids[n_long:], 2 * k + 1)
        np.testing.assert_array_equal(side.l2g_relative_att_ids[:, n_global:], 2 * k + 1)
        np.testing.assert_array_equal(side.g2l_relative_att_ids, side.l2g_relative_att_ids.T)
        pos = np.arange(G)
        d = pos[None, :] - pos[:, None]
        distance = np.where(d > 0, np.minimum(d, k), np.where(d < 0, k + np.minimum(-d, k), 0))
        np.testing.assert_array_equal(side.g2g_relative_att_ids[n_global:], distance[n_global:])
        np.testing.assert_array_equal(side.g2g_relative_att_ids[:n_global, :n_global], expected["g2g_relative_att_ids"])
        np.testing.assert_array_equal(batch.long_input_mask[b].numpy(), ~is_pad_long)
        np.testing.assert_array_equal(batch.global_input_mask[b].numpy(), ~is_pad_global)


@st.composite
def truncation_cases(draw):
    paragraphs = draw(st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=4), min_size=1, max_size=4))
    n_tokens = sum(map(sum, paragraphs))
    n_sentences = sum(map(len, paragraphs))
    prefix = draw(st.sampled_from([[], ["cls"]]))
    policy = draw(st.sampled_from(["tail", "drop_longest_first"]))
    raw = {
        "name": "trunc",
        "local_radius": 2,
        "relative_pos_max_distance": 2,
        "special_tokens": {"global": "[unused0]"},
        "long_prefix": prefix,
        "node_types": {
            "document": {},
            "paragraph": {"global": draw(st.sampled_from(["node", "none"])), "sep_after": draw(st.booleans())},
            "sentence": {"global": "node", "long": True},
        },
        "relations": {"contains": {"hierarchy": True}},
        "max_long_length": draw(
            st.integers(len(prefix) + 2, n_tokens + 2 * len(paragraphs) + 2)
        ),  # a token and a [SEP]
        "max_global_length": draw(st.integers(1, n_sentences + len(paragraphs) + 1)),
        "truncation": {"policy": policy, **({"unit": "sentence"} if policy == "drop_longest_first" else {})},
    }
    return paragraphs, load_schema(raw)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(truncation_cases())
def test_truncation_fits_keeps_text_order_and_reports_what_it_dropped(case):
    from compile_helpers import sentences_doc

    paragraphs, schema = case
    tok = WordTokenizer()
    graph = sentences_doc(paragraphs)
    inst = compile_instance(graph, schema, tok)
    roomy = load_schema({**_raw(schema), "max_long_length": 10_000, "max_global_length": 10_000})
    full = compile_instance(graph, roomy, tok)
    report = inst.truncation
    assert inst.long_length <= schema.max_long_length and inst.global_length <= schema.max_global_length
    assert (report.long_tokens_after, report.globals_after) == (inst.long_length, inst.global_length)
    assert (report.long_tokens_before, report.globals_before) == (full.long_length, full.global_length)
    assert report.truncated == (full.long_length > inst.long_length or full.global_length > inst.global_length)
    real = inst.long_char_spans[:, 0] >= 0
    starts = inst.long_char_spans[real, 0]
    assert np.all(np.diff(starts) > 0) and set(starts) <= set(full.long_char_spans[:, 0])
    assert set(full.global_node_ids) <= set(inst.global_node_ids) | set(report.dropped_nodes)
    assert not set(inst.global_node_ids) & set(report.dropped_nodes)
    if schema.truncation.policy == "drop_longest_first" and not any(
        m.startswith(("tail", "cut")) for m in report.messages
    ):
        kept = {s for s, t in zip(inst.global_node_ids, inst.global_node_types) if t == "sentence"}
        for s in kept:  # whole sentences only: every kept sentence keeps all its tokens
            assert np.count_nonzero(inst.long_owners["sentence"] == inst.global_node_ids.index(s)) == len(
                graph.span_text(s).split()
            )
    compact = compile_instance(graph, schema, tok, compact=True)
    for name, value in compact.side.to_dense().as_dict().items():
        np.testing.assert_array_equal(value, getattr(inst.side, name), err_msg=name)


def _raw(schema):
    """The dict a Schema was loaded from, rebuilt for a variant (tests only)."""
    return {
        "name": schema.name,
        "local_radius": schema.local_radius,
        "relative_pos_max_distance": schema.relative_pos_max_distance,
        "special_tokens": dict(schema.special_tokens),
        "long_prefix": list(schema.long_prefix),
        "node_types": {
            name: {"global": t.global_mode, "long": t.long, "sep_after": t.sep_after}
            for name, t in schema.node_types.items()
        },
        "relations": {"contains": {"hierarchy": True}},
    }


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-1, 40), min_size=1, max_size=40))
def test_hierarchy_depths_and_cycles_against_walking_up(targets):
    """`hierarchy.containment` (pointer jumping over the nodes with children, leaves one gather)
    against walking up each node's parents: the same depths, and on a cycle the error names the
    node where the walk up from the first row that never reaches a root enters the cycle."""
    import pytest

    from graphattn.compile.hierarchy import containment
    from graphattn.errors import CompileError

    n = len(targets)
    parent = [t if 0 <= t < n else -1 for t in targets]  # any parent: forests, self-loops, cycles
    graph = DocGraph("w", doc_id="h")
    for i in range(n):
        graph.add_node(f"n{i}", "paragraph")
    schema = load_schema({"name": "h", "node_types": {"paragraph": {}}, "relations": {"contains": {"hierarchy": True}}})
    kids = [i for i in range(n) if parent[i] >= 0]
    edges = {"contains": (np.array([parent[i] for i in kids], dtype=np.int64), np.array(kids, dtype=np.int64))}

    def walk_up(i):
        steps = 0
        while parent[i] >= 0 and steps <= n:
            i, steps = parent[i], steps + 1
        return steps if steps <= n else None  # None: never reaches a root

    depths = [walk_up(i) for i in range(n)]
    if None in depths:
        seen, node = [], depths.index(None)  # the first row that never reaches a root, walked up
        while node not in seen:
            seen.append(node)
            node = parent[node]
        with pytest.raises(CompileError, match=rf"node 'n{node}': cycle in the containment hierarchy: 'n\d+' -> "):
            containment(graph, schema, graph.node_ids, edges)
    else:
        got_parent, got_depth = containment(graph, schema, graph.node_ids, edges)
        assert got_parent.tolist() == parent and got_depth.tolist() == depths
