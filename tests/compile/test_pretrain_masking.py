"""Whole-word MLM masking and CPC sentence instances (graphattn.compile.masking).

Tiny instances compiled with the shipped WordPiece tokenizer; expected words, masks and side
inputs are written out by hand; properties are checked against references written straight from
the definitions (BERT: a token continues a word iff it starts with "##").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted_rng import ScriptedRng

from graphattn.compile import compile_instance
from graphattn.compile.masking import (
    IGNORE_INDEX,
    KEEP,
    MASK,
    RANDOM,
    MaskingConfig,
    PretrainingDataset,
    TokenInfo,
    apply_mlm_mask,
    choose_sentences,
    choose_words,
    draw_actions,
    mask_instance,
    sentence_globals,
    sentence_instance,
    word_index,
    word_spans,
    word_starts,
)
from graphattn.errors import CompileError
from graphattn.graph import DocGraph
from graphattn.tokenize import load_tokenizer

TOKENIZER = Path(__file__).resolve().parents[2] / "examples" / "data" / "tokenizer.json"


def tiny_schema(radius: int = 2, prefix: bool = False) -> dict:
    """ETC pre-training's layout (a global per sentence, hard g2l) at toy sizes."""
    schema = {
        "name": "tiny-sentences",
        "local_radius": radius,
        "relative_pos_max_distance": 2,
        "relative_vocab_size": 16,
        "max_long_length": 512,
        "max_global_length": 64,
        "special_tokens": {"global": "[unused0]"},
        "node_types": {"document": {}, "sentence": {"global": "node", "long": True}},
        "relations": {"contains": {"hierarchy": True}},
        "masks": {"hard_g2l": True},
    }
    if prefix:
        schema["long_prefix"] = ["cls"]
        schema["special_tokens"]["cls"] = "[CLS]"
    return schema


def sentence_graph(sentences: list[str], separator: str = " ") -> DocGraph:
    text = separator.join(sentences)
    graph = DocGraph(text, doc_id="doc")
    graph.add_node("doc", "document", (0, len(text)))
    start = 0
    for i, sentence in enumerate(sentences):
        graph.add_child("doc", f"s{i}", "sentence", (start, start + len(sentence)))
        start += len(sentence) + len(separator)
    return graph


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(TOKENIZER))


@pytest.fixture(scope="module")
def info(tok):
    return TokenInfo.from_tokenizer(tok)


def tokens_of(instance, tok) -> list[str]:
    return [tok.id_to_token(int(i)) for i in instance.long_token_ids]


# -- words ------------------------------------------------------------------------------------


def test_word_starts_follow_wordpiece_continuations(tok, info):
    inst = compile_instance(sentence_graph(["Sea levels rotates.", "The Moon pulls."]), tiny_schema(), tok)
    assert tokens_of(inst, tok) == [
        "sea",
        "le",
        "##vel",
        "##s",
        "rot",
        "##ates",
        ".",
        "the",
        "moon",
        "pull",
        "##s",
        ".",
    ]
    assert word_starts(inst, info.continuation).astype(int).tolist() == [1, 1, 0, 0, 1, 0, 1, 1, 1, 1, 0, 1]


def test_word_starts_by_adjacency_alone_join_punctuation(tok):
    """Without a continuation prefix (BPE, word tokenizers) touching tokens form one word."""
    inst = compile_instance(sentence_graph(["Sea levels rotates.", "The Moon pulls."]), tiny_schema(), tok)
    assert word_starts(inst, None).astype(int).tolist() == [1, 1, 0, 0, 1, 0, 0, 1, 1, 1, 0, 0]


def test_a_sentence_boundary_always_ends_a_word(tok, info):
    """'seamoon' is sea ##m ##oon; with sentences [0, 3) and [3, 7) '##m' opens sentence 2."""
    inst = compile_instance(sentence_graph(["sea", "moon"], separator=""), tiny_schema(), tok)
    assert tokens_of(inst, tok) == ["sea", "##m", "##oon"]
    assert word_starts(inst, info.continuation).astype(int).tolist() == [1, 1, 0]


def test_inserted_tokens_are_words_of_their_own_and_never_masked(tok, info):
    inst = compile_instance(sentence_graph(["Sea levels."]), tiny_schema(prefix=True), tok)
    assert tokens_of(inst, tok) == ["[CLS]", "sea", "le", "##vel", "##s", "."]
    starts = word_starts(inst, info.continuation)
    assert starts.astype(int).tolist() == [1, 1, 1, 0, 0, 1]
    maskable = inst.long_char_spans[:, 0] >= 0
    assert word_index(starts, maskable).tolist() == [-1, 0, 1, 1, 1, 2]


def test_word_index_drops_a_word_with_any_unmaskable_token():
    starts = np.array([1, 0, 1, 1, 0, 0, 1], dtype=bool)
    maskable = np.array([1, 1, 1, 1, 0, 1, 1], dtype=bool)
    words = word_index(starts, maskable)
    assert words.tolist() == [0, 0, 1, -1, -1, -1, 2]
    assert [w.tolist() for w in word_spans(words)] == [[0, 1], [2], [6]]


# -- MLM masks, the deterministic half by hand ---------------------------------------------------


def test_apply_mlm_mask_by_hand():
    ids = np.array([10, 11, 12, 13, 14, 15])
    words = np.array([0, 0, 1, 2, 2, -1])
    actions = np.array([MASK, RANDOM, KEEP, MASK], dtype=np.int8)  # for positions 0, 1, 3, 4
    random_tokens = np.array([7, 99, 7, 7])
    masked, labels = apply_mlm_mask(ids, words, np.array([0, 2]), actions, random_tokens, mask_id=4)
    assert masked.tolist() == [4, 99, 12, 13, 4, 15]
    assert labels.tolist() == [10, 11, IGNORE_INDEX, 13, 14, IGNORE_INDEX]


def test_apply_mlm_mask_checks_the_draw_sizes():
    with pytest.raises(CompileError, match="2 tokens chosen but 1 actions"):
        apply_mlm_mask(np.array([5, 6]), np.array([0, 0]), np.array([0]), np.array([MASK], np.int8), np.array([1]), 4)


def test_choose_words_counts():
    rng = np.random.default_rng(0)
    assert choose_words(0, 0.15, rng).size == 0
    assert choose_words(5, 0.0, rng).size == 0
    assert choose_words(3, 0.15, rng).size == 1  # round(0.45) = 0, but at least one word
    chosen = choose_words(40, 0.15, rng)
    assert chosen.size == 6 and np.all(np.diff(chosen) > 0) and chosen.max() < 40


def test_draw_actions_split_80_10_10():
    actions = draw_actions(200_000, MaskingConfig(), np.random.default_rng(1))
    fractions = np.bincount(actions, minlength=3) / actions.size
    np.testing.assert_allclose(fractions, [0.8, 0.1, 0.1], atol=0.005)


def test_masking_config_rejects_fractions_over_one():
    with pytest.raises(CompileError, match="mask_fraction \\+ random_fraction"):
        MaskingConfig(mask_fraction=0.8, random_fraction=0.3)
    with pytest.raises(CompileError, match="must be in \\[0, 1\\]"):
        MaskingConfig(mlm_probability=1.5)


def test_mask_instance_by_hand(tok, info):
    """Three sentences. CPC: floor(0.34 * 3 + 0.5) = 1 sentence, the script picks global 2
    ('the moon pulls .' -> all [MASK]). MLM: the 6 words of sentences 0-1 ('sea' 'levels'
    'rotates' '.' | 'tides' '.'), round(0.34 * 6) = 2 words, the script picks words 1 and 4
    ('levels' = le ##vel ##s, 'tides'); per-token uniforms 0.1, 0.85, 0.95, 0.5 give MASK,
    RANDOM, KEEP, MASK; the random draw for the RANDOM token is id 300."""
    inst = compile_instance(sentence_graph(["Sea levels rotates.", "Tides.", "The Moon pulls."]), tiny_schema(), tok)
    ids = inst.long_token_ids.tolist()
    assert tokens_of(inst, tok) == [
        "sea",
        "le",
        "##vel",
        "##s",
        "rot",
        "##ates",
        ".",
        "tides",
        ".",
        "the",
        "moon",
        "pull",
        "##s",
        ".",
    ]
    rng = ScriptedRng(picks=[[2], [1, 4], [5, 300, 5, 5]], uniforms=[0.5, 0.1, 0.85, 0.95, 0.5])
    config = MaskingConfig(mlm_probability=0.34, cpc_probability=0.34)
    example = mask_instance(inst, info, rng, config)
    m = tok.mask_id
    assert example.cpc_globals.tolist() == [2]
    assert example.instance.long_token_ids.tolist() == [
        ids[0],
        m,
        300,
        ids[3],
        ids[4],
        ids[5],
        ids[6],
        m,
        ids[8],
        m,
        m,
        m,
        m,
        m,
    ]
    expected_labels = [IGNORE_INDEX] * 14
    for position in (1, 2, 3, 7):
        expected_labels[position] = ids[position]
    assert example.mlm_labels.tolist() == expected_labels
    assert example.instance.global_token_ids.tolist() == inst.global_token_ids.tolist()  # globals never masked
    assert example.cpc_sentences[0].long_token_ids.tolist() == ids[9:]  # the sentence alone, unmasked


def test_mask_everything_or_keep_everything(tok, info):
    inst = compile_instance(sentence_graph(["Sea levels rotates.", "The Moon pulls."]), tiny_schema(prefix=True), tok)
    text = inst.long_char_spans[:, 0] >= 0
    everything = mask_instance(
        inst,
        info,
        np.random.default_rng(0),
        MaskingConfig(mlm_probability=1.0, mask_fraction=1.0, random_fraction=0.0, cpc_probability=0.0),
    )
    assert np.all(everything.instance.long_token_ids[text] == tok.mask_id)
    assert everything.instance.long_token_ids[0] == tok.cls_id
    assert everything.mlm_labels.tolist() == np.where(text, inst.long_token_ids, IGNORE_INDEX).tolist()
    kept = mask_instance(
        inst,
        info,
        np.random.default_rng(0),
        MaskingConfig(mlm_probability=1.0, mask_fraction=0.0, random_fraction=0.0, cpc_probability=0.0),
    )
    assert kept.instance.long_token_ids.tolist() == inst.long_token_ids.tolist()
    assert kept.cpc_globals.size == 0 and kept.cpc_sentences == []


def test_random_replacements_never_draw_special_tokens(tok, info):
    special = {tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id, tok.unk_id}
    assert not special & set(info.random_ids.tolist())
    assert len(info.random_ids) == tok.vocab_size - len(special)


def test_tokenizer_without_mask_token_is_a_clear_error(tok):
    class NoMask:
        mask_id = None

    with pytest.raises(CompileError, match="no mask token"):
        TokenInfo.from_tokenizer(NoMask())


# -- dynamic masking ----------------------------------------------------------------------------


def test_dataset_masks_are_fresh_per_epoch_and_repeatable(tok, info):
    text = [
        "Tides rise and fall twice every day.",
        "The Moon pulls the sea.",
        "The Sun pulls it too.",
        "Earth rotates.",
    ]
    insts = [compile_instance(sentence_graph(text), tiny_schema(), tok)] * 3
    config = MaskingConfig(mlm_probability=0.3, cpc_probability=0.3)
    data = PretrainingDataset(insts, info, config, seed=7)
    first = [data[i].instance.long_token_ids.tolist() for i in range(3)]
    assert first == [
        PretrainingDataset(insts, info, config, seed=7)[i].instance.long_token_ids.tolist() for i in range(3)
    ]
    assert len({tuple(x) for x in first}) > 1  # the same instance at another index gets another mask
    data.set_epoch(1)
    assert [data[i].instance.long_token_ids.tolist() for i in range(3)] != first


# -- properties against references from the definitions ------------------------------------------

WORDS = [
    "sea",
    "levels",
    "rotates",
    "tides",
    "moon",
    "gravitational",
    "forces",
    "earth",
    "sun",
    "coastline",
    "bathymetry",
]
sentence_strategy = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(
    lambda ws: " ".join(ws).capitalize() + st_punct(ws)
)


def st_punct(words: list[str]) -> str:
    return "." if len(words) % 2 else "!"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sentences=st.lists(sentence_strategy, min_size=1, max_size=5), seed=st.integers(0, 2**31 - 1))
def test_masks_are_whole_words_of_the_right_count(tok, info, sentences, seed):
    inst = compile_instance(sentence_graph(sentences), tiny_schema(), tok)
    pieces = tokens_of(inst, tok)
    sentence_of = inst.long_owners["sentence"]
    # Reference, straight from BERT's definition: a token continues the word before it iff it
    # starts with "##" (and sentences never share a word).
    reference_starts = [
        i == 0 or not pieces[i].startswith("##") or sentence_of[i] != sentence_of[i - 1] for i in range(len(pieces))
    ]
    assert word_starts(inst, info.continuation).tolist() == reference_starts

    config = MaskingConfig(cpc_probability=0.25)
    example = mask_instance(inst, info, np.random.default_rng(seed), config)
    cpc = np.isin(sentence_of, example.cpc_globals)
    labelled = example.mlm_labels != IGNORE_INDEX
    word_of = np.cumsum(reference_starts) - 1
    for w in np.unique(word_of):
        in_word = word_of == w
        assert labelled[in_word].all() or not labelled[in_word].any()  # whole words only
    n_words = len(np.unique(word_of[~cpc]))
    chosen_words = len(np.unique(word_of[labelled]))
    assert chosen_words == (min(n_words, max(1, round(0.15 * n_words))) if n_words else 0)
    assert not (labelled & cpc).any()
    assert np.all(example.mlm_labels[labelled] == inst.long_token_ids[labelled])
    untouched = ~labelled & ~cpc
    assert np.all(example.instance.long_token_ids[untouched] == inst.long_token_ids[untouched])
    assert np.all(example.instance.long_token_ids[cpc] == tok.mask_id)


# -- CPC sentences ------------------------------------------------------------------------------


def test_choose_sentences_counts():
    rng = np.random.default_rng(0)
    assert choose_sentences(np.array([4]), 0.9, rng).size == 0  # one sentence: nothing to predict it from
    assert choose_sentences(np.arange(5), 0.0, rng).size == 0
    for _ in range(50):
        chosen = choose_sentences(np.arange(10, 20), 0.25, rng)
        assert chosen.size in (2, 3) and np.all(np.diff(chosen) > 0) and set(chosen) <= set(range(10, 20))
    assert choose_sentences(np.arange(4), 1.0, rng).size == 3  # never every sentence
    counts = [choose_sentences(np.arange(3), 0.1, rng).size for _ in range(4000)]
    assert abs(np.mean(counts) - 0.3) < 0.03  # expected count p * n, also for short documents


def test_sentence_globals_need_the_sentence_level(tok):
    inst = compile_instance(sentence_graph(["Sea levels.", "Tides."]), tiny_schema(), tok)
    assert sentence_globals(inst).tolist() == [0, 1]
    with pytest.raises(CompileError, match="no 'paragraph' level"):
        sentence_globals(inst, "paragraph")


def test_sentence_instance_side_inputs_by_hand(tok):
    """'The Moon pulls.' alone: 5 tokens, radius 2, k 2 (ids 0..4, does_not_belong 5, belongs 6)."""
    inst = compile_instance(sentence_graph(["Sea levels.", "The Moon pulls."]), tiny_schema(radius=2), tok)
    alone = sentence_instance(inst, 1)
    assert tokens_of(alone, tok) == ["the", "moon", "pull", "##s", "."]
    assert alone.global_token_ids.tolist() == [tok.token_to_id("[unused0]")] and alone.global_node_ids == ["s1"]
    side = alone.side
    assert side.l2l_att_mask.tolist() == [
        [0, 0, 1, 1, 1],
        [0, 1, 1, 1, 1],
        [1, 1, 1, 1, 1],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0],
    ]
    assert side.l2l_relative_att_ids.tolist() == [[4, 3, 0, 1, 2]] * 5
    assert side.l2g_relative_att_ids.tolist() == [[6]] * 5 and side.l2g_att_mask.tolist() == [[1]] * 5
    assert side.g2l_relative_att_ids.tolist() == [[6] * 5] and side.g2l_att_mask.tolist() == [[1] * 5]
    assert side.g2g_relative_att_ids.tolist() == [[0]] and side.g2g_att_mask.tolist() == [[1]]
    assert alone.long_owners["sentence"].tolist() == [0] * 5
    assert [alone.long_token_text(i) for i in range(5)] == ["The", "Moon", "pull", "s", "."]
    assert alone.label_vocab is inst.label_vocab
