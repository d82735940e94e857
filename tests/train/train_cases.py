"""Small generated examples for the heads and the training loop (shared by tests/nn and tests/train).

Each document: two candidate phrases, then 2-3 sentences made of a small word list, some of which
mention a candidate. Compiled with a WikiHop-like schema made tiny (radius 3, short lengths) and
the tokenizer the project ships, so an encoder with hidden 32 and 2 layers runs them fast. The
schema declares one target of each kind, so every head trains on these instances:

    answer      choice          the candidate global whose node has is_answer ("wikihop")
    supporting  global_labels   a flag per sentence global ("hotpotqa")
    span        span            the first mention's tokens, type "short" ("nq")
    mentions    spans           every mention's tokens ("openkp")
"""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path

from graphattn.compile import compile_instance as compile_graph
from graphattn.graph import DocGraph
from graphattn.nn import EtcConfig
from graphattn.schema import load_schema
from graphattn.tokenize import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = str(REPO / "examples" / "data" / "tokenizer.json")
WORDS = "the river runs past old mills and quiet towns where people trade grain wool".split()
CANDIDATES = ["red fox", "blue whale", "green frog", "grey owl", "brown bear"]

SCHEMA = {
    "name": "train-test",
    "local_radius": 3,
    "relative_pos_max_distance": 2,
    "relative_vocab_size": 16,
    "max_long_length": 128,
    "max_global_length": 16,
    "special_tokens": {"global": "[unused0]"},
    "node_types": {
        "document": {"segment": True},
        "candidate": {"global": "node", "long": True, "segment": True, "ignore_hard_masks": True, "global_type_id": 2},
        "sentence": {"global": "node", "long": True, "type_id": 1},
        "mention": {},
        "answer": {},
    },
    "relations": {"contains": {"hierarchy": True}, "mention_of": {"link": "l2g", "label": "mention_of"}},
    "masks": {"hard_g2l": True},
    "targets": {
        "answer": {"kind": "choice", "node_types": "candidate", "attr": "is_answer"},
        "supporting": {"kind": "global_labels", "node_types": "sentence", "attr": "supporting", "default": False},
        "span": {"kind": "span", "node_types": "answer", "type_attr": "answer_type", "types": ["null", "short"]},
        "mentions": {"kind": "spans", "node_types": "mention", "max_spans": 4},
    },
}
TASKS = {"wikihop": "answer", "hotpotqa": "supporting", "nq": "span", "openkp": "mentions"}  # a target of each kind


def tiny_config(**changes) -> EtcConfig:
    base = dict(
        vocab_size=3000,
        type_vocab_size=4,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=2,
        local_radius=SCHEMA["local_radius"],
        relative_pos_max_distance=SCHEMA["relative_pos_max_distance"],
        relative_vocab_size=SCHEMA["relative_vocab_size"],
        hidden_dropout_prob=0.0,
    )
    return EtcConfig(**{**base, **changes})


@lru_cache(maxsize=1)
def tokenizer():
    return load_tokenizer(TOKENIZER)


def make_graph(rng: random.Random, index: int) -> DocGraph:
    """Candidates first (each its own segment), then sentences; sentence s mentions candidate s % 2."""
    candidates = rng.sample(CANDIDATES, 2)
    answer = rng.randrange(2)
    sentences = []
    for s in range(rng.randint(2, 3)):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 6))]
        words.insert(rng.randrange(len(words) + 1), candidates[s % 2])
        sentences.append(" ".join(words) + " .")
    text = " ".join(candidates + sentences)
    graph = DocGraph(text, doc_id=f"doc{index}")
    graph.add_node("doc", "document", (0, len(text)))
    pos = 0
    for c, candidate in enumerate(candidates):
        graph.add_child("doc", f"c{c}", "candidate", (pos, pos + len(candidate)), is_answer=c == answer, text=candidate)
        pos += len(candidate) + 1
    for s, sentence in enumerate(sentences):
        graph.add_child("doc", f"s{s}", "sentence", (pos, pos + len(sentence)), supporting=rng.random() < 0.5)
        start = sentence.find(candidates[s % 2])
        graph.add_node(f"m{s}", "mention", (pos + start, pos + start + len(candidates[s % 2])))
        graph.add_edge(f"m{s}", "mention_of", f"c{s % 2}")
        pos += len(sentence) + 1
    graph.add_node("a", "answer", graph.node("m0").span, answer_type="short")
    return graph


@lru_cache(maxsize=4)
def compiled(n: int = 8, seed: int = 0) -> tuple:
    """(graph, instance) pairs, cached: compiling is the slow part of these tests."""
    rng = random.Random(seed)
    graphs = [make_graph(rng, i) for i in range(n)]
    return tuple((g, compile_graph(g, SCHEMA, tokenizer())) for g in graphs)


def instances(n: int = 8, seed: int = 0) -> list:
    """Compiled instances carrying every target of SCHEMA."""
    return [instance for _, instance in compiled(n, seed)]


def task_targets(task: str) -> dict:
    """The one target of SCHEMA that stands for `task` (wikihop, hotpotqa, nq, openkp)."""
    name = TASKS[task]
    return {name: load_schema(SCHEMA).targets[name]}
