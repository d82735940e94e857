"""Hand-built EtcInstances for the viz tests, written straight from docs/DESIGN.md §3.

One document of sentences, one word per long token. Globals: an optional `document` global
(soft: sees every long token) and one `sentence` global per sentence (hard g2l: sees only its
own tokens). l2g is soft everywhere. Relative ids follow etcmodel: 0 same, 1..k right,
k+1..2k left; l2g/g2l belongs / does_not_belong.
"""

from __future__ import annotations

import numpy as np

from graphattn.contract import EtcInstance, SideInputs
from graphattn.labels import LabelVocab

WORDS = "the quick brown fox jumps over a lazy dog while seven bright owls watch from old oak trees".split()


def relative_ids(distance: np.ndarray, max_distance: int) -> np.ndarray:
    """etcmodel's relative position ids for key - query = `distance`."""
    right = np.minimum(distance, max_distance)
    left = max_distance + np.minimum(-distance, max_distance)
    return np.where(distance == 0, 0, np.where(distance > 0, right, left)).astype(np.int32)


def hand_instance(
    sentence_lengths=(3, 4, 2),
    radius: int = 2,
    max_distance: int = 2,
    document_global: bool = True,
    extra_labels: tuple[str, ...] = (),
    words: list[str] | None = None,
) -> EtcInstance:
    vocab = LabelVocab(max_distance, list(extra_labels))
    L = int(sum(sentence_lengths))
    words = words or [WORDS[i % len(WORDS)] for i in range(L)]
    text = " ".join(words)
    starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
    spans = np.stack([starts, starts + np.array([len(w) for w in words])], axis=1).astype(np.int32)

    first_sentence = 1 if document_global else 0
    sentence_of_token = np.repeat(np.arange(len(sentence_lengths)), sentence_lengths)
    owner = sentence_of_token + first_sentence  # global position of each token's sentence
    G = first_sentence + len(sentence_lengths)
    node_ids = (["doc"] if document_global else []) + [f"s{i}" for i in range(len(sentence_lengths))]
    node_types = (["document"] if document_global else []) + ["sentence"] * len(sentence_lengths)

    offsets = np.arange(-radius, radius + 1)
    keys = np.arange(L)[:, None] + offsets[None, :]
    l2l_mask = ((keys >= 0) & (keys < L)).astype(np.int32)
    l2l_ids = np.broadcast_to(relative_ids(offsets, max_distance), (L, 2 * radius + 1)).copy()

    g = np.arange(G)
    g2g_mask = np.ones((G, G), np.int32)
    g2g_ids = relative_ids(g[None, :] - g[:, None], max_distance)

    owns = owner[:, None] == g[None, :]  # [L, G]
    if document_global:
        owns[:, 0] = True
    l2g_ids = np.where(owns, vocab.belongs, vocab.does_not_belong).astype(np.int32)
    l2g_mask = np.ones((L, G), np.int32)
    g2l_ids = l2g_ids.T.copy()
    g2l_mask = owns.T.astype(np.int32)
    if document_global:
        g2l_mask[0] = 1  # the document global is soft

    side = SideInputs(l2l_mask, g2g_mask, l2g_mask, g2l_mask, l2l_ids, g2g_ids, l2g_ids, g2l_ids)
    owners = {"sentence": owner.astype(np.int32)}
    if document_global:
        owners = {"document": np.zeros(L, np.int32), **owners}
    return EtcInstance(
        long_token_ids=np.arange(100, 100 + L, dtype=np.int32),
        long_type_ids=np.zeros(L, np.int32),
        global_token_ids=np.ones(G, np.int32),
        global_type_ids=np.array([0 if t == "document" else 1 for t in node_types], np.int32),
        side=side,
        label_vocab=vocab,
        global_node_ids=node_ids,
        global_node_types=node_types,
        long_char_spans=spans,
        long_doc_index=np.zeros(L, np.int32),
        long_owners=owners,
        doc_ids=["doc"],
        texts=[text],
    )


def big_instance(
    long_length: int = 4096, globals_count: int = 256, radius: int = 128, max_distance: int = 12
) -> EtcInstance:
    """A 4096 + 256 instance: one document global and sentences of equal length."""
    sentences = globals_count - 1
    lengths = np.full(sentences, long_length // sentences)
    lengths[: long_length - lengths.sum()] += 1
    return hand_instance(tuple(int(x) for x in lengths), radius=radius, max_distance=max_distance)


def random_instance(
    rng: np.random.Generator, G: int, L: int, radius: int, max_distance: int = 2, extra_labels: int = 1
) -> EtcInstance:
    """Arbitrary masks and label ids (not a compiler's output): for checks against brute force."""
    vocab = LabelVocab(max_distance, [f"rel{i}" for i in range(extra_labels)])
    V, W = len(vocab), 2 * radius + 1

    def piece(shape):
        return (rng.random(shape) < 0.6).astype(np.int32), rng.integers(0, V, shape).astype(np.int32)

    (l2l_m, l2l_i), (g2g_m, g2g_i), (l2g_m, l2g_i), (g2l_m, g2l_i) = (
        piece((L, W)),
        piece((G, G)),
        piece((L, G)),
        piece((G, L)),
    )
    side = SideInputs(l2l_m, g2g_m, l2g_m, g2l_m, l2l_i, g2g_i, l2g_i, g2l_i)
    words = [WORDS[i % len(WORDS)] for i in range(L)]
    starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]]) if L else np.zeros(0, int)
    spans = (
        np.stack([starts, starts + np.array([len(w) for w in words], dtype=int)], axis=1).astype(np.int32).reshape(L, 2)
    )
    return EtcInstance(
        long_token_ids=np.arange(L, dtype=np.int32),
        long_type_ids=np.zeros(L, np.int32),
        global_token_ids=np.ones(G, np.int32),
        global_type_ids=np.zeros(G, np.int32),
        side=side,
        label_vocab=vocab,
        global_node_ids=[f"n{g}" for g in range(G)],
        global_node_types=["node"] * G,
        long_char_spans=spans,
        long_doc_index=np.zeros(L, np.int32),
        long_owners={},
        doc_ids=["d"],
        texts=[" ".join(words)],
    )


def brute_force_grid(instance: EtcInstance) -> np.ndarray:
    """[G+L, G+L] label-or--1 straight from docs/DESIGN.md §3, one pair at a time."""
    s = instance.side
    G, L = instance.global_length, instance.long_length
    r = (s.l2l_att_mask.shape[1] - 1) // 2
    grid = np.full((G + L, G + L), -1, dtype=np.int64)
    for q in range(G + L):
        for k in range(G + L):
            if q < G and k < G:
                allowed, label = s.g2g_att_mask[q, k], s.g2g_relative_att_ids[q, k]
            elif q < G:
                allowed, label = s.g2l_att_mask[q, k - G], s.g2l_relative_att_ids[q, k - G]
            elif k < G:
                allowed, label = s.l2g_att_mask[q - G, k], s.l2g_relative_att_ids[q - G, k]
            else:
                c = (k - G) - (q - G) + r
                if not 0 <= c <= 2 * r:
                    continue
                allowed, label = s.l2l_att_mask[q - G, c], s.l2l_relative_att_ids[q - G, c]
            if allowed:
                grid[q, k] = label
    return grid


def _instance_of(
    side, vocab: LabelVocab, owners: dict[str, np.ndarray], node_ids: list[str], node_types: list[str], docs: int = 1
) -> EtcInstance:
    """An EtcInstance around compact side inputs: one word per long token, ids counting up."""
    L, G = side.long_length, side.global_length
    words = [WORDS[i % len(WORDS)] for i in range(L)]
    starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]]) if L else np.zeros(0, int)
    lengths = np.array([len(w) for w in words], dtype=int)
    spans = np.stack([starts, starts + lengths], axis=1).astype(np.int32).reshape(L, 2)
    return EtcInstance(
        long_token_ids=np.arange(L, dtype=np.int32),
        long_type_ids=np.zeros(L, np.int32),
        global_token_ids=np.ones(G, np.int32),
        global_type_ids=np.zeros(G, np.int32),
        side=side,
        label_vocab=vocab,
        global_node_ids=node_ids,
        global_node_types=node_types,
        long_char_spans=spans,
        long_doc_index=np.zeros(L, np.int32),
        long_owners=owners,
        doc_ids=[f"d{i}" for i in range(docs)],
        texts=[" ".join(words)] * docs,
    )


def random_compact_instance(
    rng: np.random.Generator, G: int, L: int, radius: int, max_distance: int = 2, extra_labels: int = 2, levels: int = 2
) -> EtcInstance:
    """Arbitrary compact side inputs (documents, segments, hard rows, owners, links, g2g edges):
    every rule of the compact form exercised at once, for checks against the dense derivation."""
    from graphattn.compact import CompactSideInputs

    vocab = LabelVocab(max_distance, [f"rel{i}" for i in range(extra_labels)])
    docs = max(1, int(rng.integers(1, 4)))
    long_doc = np.sort(rng.integers(0, docs, L)).astype(np.int32)
    global_doc = np.sort(rng.integers(0, docs, G)).astype(np.int32)
    new_run = (np.diff(long_doc) != 0) | (rng.random(max(L - 1, 0)) < 0.2)
    long_segment = np.cumsum(np.r_[0, new_run]).astype(np.int32)[:L]
    n = max(G, 1)  # globals to draw from (owners and links need at least one)
    owned = rng.random((levels, L)) < 0.7
    owners = np.where(owned & (G > 0), rng.integers(0, n, (levels, L)), -1).astype(np.int32)
    n_links = int(rng.integers(0, L * n // 3 + 1)) if G and L else 0
    pairs = np.unique(rng.integers(0, max(L, 1), n_links).astype(np.int64) * n + rng.integers(0, n, n_links))
    schema_ids = np.arange(len(vocab) - extra_labels, len(vocab))

    def label_of(count: int) -> np.ndarray:
        return (rng.choice(schema_ids, count) if extra_labels else np.full(count, vocab.belongs)).astype(np.int32)

    n_edges = int(rng.integers(0, G * G // 2 + 1)) if G else 0
    side = CompactSideInputs(
        local_radius=radius,
        max_distance=max_distance,
        levels=tuple(f"level{i}" for i in range(levels)),
        owners=owners,
        long_doc=long_doc,
        long_segment=long_segment,
        global_doc=global_doc,
        global_segment=rng.integers(-1, 3, G).astype(np.int32),
        global_blockable=rng.random(G) < 0.5,
        long_hard_l2g=rng.random(L) < 0.4,
        global_hard_g2l=rng.random(G) < 0.5,
        link_long=(pairs // n).astype(np.int32),
        link_global=(pairs % n).astype(np.int32),
        link_label=label_of(len(pairs)),
        g2g_src=rng.integers(0, n, n_edges).astype(np.int32),
        g2g_dst=rng.integers(0, n, n_edges).astype(np.int32),
        g2g_label=label_of(n_edges),
        cross_segment_label=int(schema_ids[0]) if extra_labels and rng.random() < 0.5 else -1,
    )
    return _instance_of(
        side, vocab, {f"level{i}": owners[i] for i in range(levels)}, [f"n{g}" for g in range(G)], ["node"] * G, docs
    )


def sentence_instance(L: int, G: int, radius: int = 16, max_distance: int = 4) -> EtcInstance:
    """One document, G sentence globals owning equal runs of tokens, hard g2l, soft l2g: compact."""
    from graphattn.compact import CompactSideInputs

    owner = (np.arange(L) * G // L).astype(np.int32)
    side = CompactSideInputs(
        local_radius=radius,
        max_distance=max_distance,
        levels=("sentence",),
        owners=owner[None, :],
        long_doc=np.zeros(L, np.int32),
        long_segment=np.zeros(L, np.int32),
        global_doc=np.zeros(G, np.int32),
        global_segment=np.full(G, -1, np.int32),
        global_blockable=np.zeros(G, bool),
        long_hard_l2g=np.zeros(L, bool),
        global_hard_g2l=np.ones(G, bool),
    )
    return _instance_of(
        side, LabelVocab(max_distance, []), {"sentence": owner}, [f"s{g}" for g in range(G)], ["sentence"] * G
    )
