"""Batches and comparisons shared by the attention-backend tests.

`compiler_case` builds side inputs with the project's etcmodel-compatible builder (sentence
hierarchy, packed documents, padding, hard masks); `synthetic_case` adds what that builder does
not make (mention links with their own label, rows with nothing to attend to).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from graphattn.compile.batching import collate
from graphattn.compile.compiler import compile_instance as compile_graph
from graphattn.compile.side_inputs import side_inputs
from graphattn.contract import EtcBatch, SideInputs
from graphattn.graph import DocGraph
from graphattn.kernels.synthetic import synthetic_side_inputs
from graphattn.nn.config import EtcConfig

# A small WikiHop-like schema: a candidate global linked to its mentions, one global per
# sentence, documents as l2l segments, hard g2l (candidates exempt).
GRAPH_SCHEMA = {
    "name": "kernel-test",
    "local_radius": 3,
    "relative_pos_max_distance": 2,
    "relative_vocab_size": 16,
    "max_long_length": 256,
    "max_global_length": 32,
    "special_tokens": {"global": "[unused0]"},
    "node_types": {
        "document": {"segment": True},
        "candidate": {"global": "node", "long": True, "segment": True, "ignore_hard_masks": True},
        "sentence": {"global": "node", "long": True},
        "mention": {},
    },
    "relations": {"contains": {"hierarchy": True}, "mention_of": {"link": "l2g", "label": "mention_of"}},
    "masks": {"hard_g2l": True},
}


@dataclass
class Case:
    side: SideInputs
    vocab: int
    states: list[torch.Tensor]  # global q, k, v, long q, k, v
    key_table: torch.Tensor
    bias_table: torch.Tensor | None

    @property
    def params(self) -> list[torch.Tensor]:
        return [*self.states, self.key_table] + ([self.bias_table] if self.bias_table is not None else [])


def _tensors(
    batch, heads, num_global, num_long, dim, vocab, dtype, bias, seed
) -> tuple[list, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()  # noqa: E731
    states = [rand(batch, heads, n, dim) for n in (num_global,) * 3 + (num_long,) * 3]
    return states, rand(vocab, heads, dim), rand(vocab, heads) if bias else None


def compiler_case(
    *,
    batch=2,
    heads=2,
    dim=8,
    num_long=37,
    radius=4,
    max_distance=3,
    doc_lengths=((9, 14, 6), (20,)),
    sentences_per_doc=3,
    hard_g2l=False,
    hard_l2g=False,
    dtype=torch.float64,
    bias=True,
    seed=0,
) -> Case:
    """Packed documents (lengths per batch row), each split into sentences that own global tokens."""
    rng = np.random.default_rng(seed)
    long_bp = np.zeros((batch, num_long), np.int32)
    sentence_ids = np.zeros((batch, num_long), np.int32)
    globals_per_row = [len(docs) * sentences_per_doc for docs in doc_lengths[:batch]]
    num_global = max(globals_per_row) + 1  # at least one padded global per batch
    global_bp = np.zeros((batch, num_global), np.int32)
    for b, docs in enumerate(doc_lengths[:batch]):
        pos, glob = 0, 0
        for length in docs:
            cuts = np.sort(rng.choice(np.arange(1, length), size=sentences_per_doc - 1, replace=False))
            owner = np.searchsorted(cuts, np.arange(length), side="right") + glob
            sentence_ids[b, pos : pos + length] = owner
            pos += length
            glob += sentences_per_doc
            long_bp[b, pos - 1] = 1
            global_bp[b, glob - 1] = 1
    side = side_inputs(
        torch.from_numpy(long_bp),
        torch.from_numpy(global_bp),
        torch.from_numpy(sentence_ids),
        radius,
        max_distance,
        use_hard_g2l_mask=hard_g2l,
        use_hard_l2g_mask=hard_l2g,
    )
    vocab = 2 * max_distance + 3
    states, key_table, bias_table = _tensors(batch, heads, num_global, num_long, dim, vocab, dtype, bias, seed)
    return Case(side, vocab, states, key_table, bias_table)


def document_graph(doc_id: str, candidate: str, sentences: list[str]) -> DocGraph:
    """document > candidate + sentences; every later occurrence of the candidate is a mention."""
    text = " ".join([candidate, *sentences])
    graph = DocGraph(text, doc_id=doc_id)
    graph.add_node("doc", "document", (0, len(text)))
    graph.add_child("doc", "cand", "candidate", (0, len(candidate)))
    pos = len(candidate) + 1
    for i, sentence in enumerate(sentences):
        graph.add_child("doc", f"s{i}", "sentence", (pos, pos + len(sentence)))
        pos += len(sentence) + 1
    start, m = text.find(candidate, len(candidate)), 0
    while start >= 0:
        graph.add_node(f"m{m}", "mention", (start, start + len(candidate)))
        graph.add_edge(f"m{m}", "mention_of", "cand")
        start, m = text.find(candidate, start + 1), m + 1
    return graph


def graph_batch(*, compact: bool = False) -> EtcBatch:
    """Two documents of different lengths compiled and collated (so row 1 is padded); with
    `compact` the instances are compiled compact and the batch carries its CompactBatch too."""
    graphs = [
        document_graph(
            "a",
            "blue whale",
            ["the blue whale is big .", "it eats krill and swims far away .", "blue whale songs travel ."],
        ),
        document_graph("b", "red fox", ["a red fox runs .", "foxes hunt at night ."]),
    ]
    return collate([compile_graph(g, GRAPH_SCHEMA, "spacy:en", compact=compact) for g in graphs])


def graph_case(*, heads=2, dim=8, dtype=torch.float64, bias=True, seed=0) -> Case:
    batch = graph_batch()
    side = batch.side
    vocab = GRAPH_SCHEMA["relative_vocab_size"]
    states, key_table, bias_table = _tensors(
        batch.batch_size, heads, side.global_length, side.long_length, dim, vocab, dtype, bias, seed
    )
    return Case(side, vocab, states, key_table, bias_table)


def synthetic_case(
    *,
    batch=2,
    heads=2,
    dim=8,
    num_long=29,
    num_global=6,
    radius=3,
    max_distance=2,
    dtype=torch.float64,
    bias=True,
    seed=0,
    **layout,
) -> Case:
    side, lay = synthetic_side_inputs(batch, num_long, num_global, radius, max_distance, seed=seed, **layout)
    states, key_table, bias_table = _tensors(batch, heads, num_global, num_long, dim, lay.vocab_size, dtype, bias, seed)
    return Case(side, lay.vocab_size, states, key_table, bias_table)


def run(fn, case: Case, scale: float = 0.4, *, grads: bool = True, seed: int = 1) -> list[torch.Tensor | None]:
    """Outputs, then gradients of a fixed random projection of them w.r.t. every input."""
    global_out, long_out = fn(*case.states, case.side, case.key_table, case.bias_table, scale)
    results = [global_out, long_out]
    if grads:
        gen = torch.Generator().manual_seed(seed)
        weights = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype) for t in results]
        loss = sum((t * w).sum() for t, w in zip(results, weights))
        results += list(torch.autograd.grad(loss, case.params, allow_unused=True))
    return results


def assert_all_close(actual: list, expected: list, rtol: float, names=None, floor: float = 1e-4) -> None:
    """Relative to each tensor's largest magnitude (the issue's "relative" tolerance), or to
    `floor` where all of a tensor is smaller (a gradient that is 0 in exact arithmetic)."""
    for i, (a, e) in enumerate(zip(actual, expected)):
        name = names[i] if names else f"result {i}"
        if e is None or e.numel() == 0:
            assert a is None or a.numel() == 0 or not a.abs().any(), name
            continue
        assert a is not None, f"{name}: missing"
        assert a.shape == e.shape, f"{name}: {a.shape} vs {e.shape}"
        assert torch.isfinite(a).all(), f"{name}: not finite"
        err = (a.double() - e.double()).abs().max().item()
        ref = e.double().abs().max().item()
        assert err <= rtol * max(ref, floor), f"{name}: max error {err:.3g} vs max magnitude {ref:.3g} (rtol {rtol})"


RESULT_NAMES = [
    "global_out",
    "long_out",
    "d_global_q",
    "d_global_k",
    "d_global_v",
    "d_long_q",
    "d_long_k",
    "d_long_v",
    "d_key_table",
    "d_bias_table",
]


def graph_config(**changes) -> EtcConfig:
    """A small encoder whose radius and relative labels fit graph_batch() (GRAPH_SCHEMA)."""
    base = dict(
        vocab_size=200,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=2,
        local_radius=GRAPH_SCHEMA["local_radius"],
        relative_pos_max_distance=GRAPH_SCHEMA["relative_pos_max_distance"],
        relative_vocab_size=GRAPH_SCHEMA["relative_vocab_size"],
        hidden_dropout_prob=0.0,
    )
    return EtcConfig(**{**base, **changes})


def _layout(num_long: int, num_global: int, radius: int, flags: dict, seed: int) -> dict:
    return dict(
        num_long=num_long,
        num_global=num_global,
        radius=radius,
        seed=seed,
        mention_links=3,
        long_padding=min(2, num_long - 1),
        empty_long_rows=min(1, num_long),
        empty_global_rows=min(1, num_global),
        **flags,
    )


def random_layouts():
    """Hypothesis strategy: synthetic_case keywords of a small random batch (sizes, hard masks,
    documents, padding, mention links and empty rows)."""
    flags = st.fixed_dictionaries(dict(hard_g2l=st.booleans(), hard_l2g=st.booleans(), num_docs=st.integers(1, 3)))
    return st.builds(_layout, st.integers(1, 30), st.integers(0, 6), st.integers(1, 8), flags, st.integers(0, 10_000))
