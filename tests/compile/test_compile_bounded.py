"""Tokenize only what can be kept (#16 item 3, #15 item 8): under `tail`, a long document's text is
tokenized up to a cut past the last keepable token, and the instance equals the one from the whole
text; the sizes before truncation then count the tokenized part (lower bounds) and say so."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn import compile_instance, load_schema
from graphattn.compile.encode import MIN_PREFIX_CHARS, long_token_bound, may_cut
from graphattn.graph import DocGraph
from graphattn.tokenize import HFTokenizer, SpacyWordTokenizer, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "examples" / "data" / "tokenizer.json"
WORDS = (
    "the river runs past old mills and quiet towns where people trade grain wool stories, storms; ships (bridges)"
).split()


class Counting:
    """A tokenizer wrapper that counts the characters it is asked to encode; `prefix_exact` as told."""

    def __init__(self, inner, prefix_exact: bool):
        self.inner, self.prefix_exact, self.chars = inner, prefix_exact, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, text):
        self.chars += len(text)
        return self.inner.encode(text)

    def encode_batch(self, texts):
        self.chars += sum(map(len, texts))
        return self.inner.encode_batch(texts)


def _trained(kind: str) -> HFTokenizer:
    """Small tokenizers of other families, trained in memory: byte-level BPE, Metaspace unigram."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    corpus = [" ".join(random.Random(i).choices(WORDS, k=30)) for i in range(200)]
    if kind == "bpe":
        raw = Tokenizer(models.BPE(unk_token="[UNK]"))
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    else:
        raw = Tokenizer(models.Unigram())
        raw.normalizer = normalizers.NFKC()
        raw.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=200,
            special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"],
            unk_token="[UNK]",
            show_progress=False,
        )
    raw.train_from_iterator(corpus, trainer)
    return HFTokenizer(raw)


def test_which_tokenizers_may_stop_early():
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

    assert load_tokenizer(str(TOKENIZER)).prefix_exact
    assert _trained("bpe").prefix_exact and _trained("unigram").prefix_exact
    raw = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    assert not HFTokenizer(raw).prefix_exact  # no pre-tokenizer: the model sees the whole text at once
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    assert HFTokenizer(raw).prefix_exact
    raw.normalizer = normalizers.Replace("  ", " ")  # a pattern could span the cut
    assert not HFTokenizer(raw).prefix_exact
    raw.normalizer = None
    raw.add_tokens([AddedToken("new york")])  # an added token across a space
    assert not HFTokenizer(raw).prefix_exact
    assert not SpacyWordTokenizer().prefix_exact  # a growing vocabulary numbers words by first sight
    assert SpacyWordTokenizer(vocab=["[UNK]", "a"]).prefix_exact


@pytest.mark.parametrize("kind", ["shipped", "bpe", "unigram", "spacy"])
@settings(max_examples=40, deadline=None)
@given(
    words=st.lists(st.sampled_from(WORDS + ["  ", "\n", "\t", "caf\u00e9", "x\u0301y", "ß"]), min_size=1, max_size=60),
    where=st.floats(0, 1),
)
def test_a_prefix_tokenizes_like_the_whole_text(kind, words, where):
    """The claim `prefix_exact` makes: cut before a space that follows a non-space."""
    tokenizer = {
        "shipped": lambda: load_tokenizer(str(TOKENIZER)),
        "bpe": lambda: _cached("bpe"),
        "unigram": lambda: _cached("unigram"),
        "spacy": lambda: SpacyWordTokenizer(vocab=WORDS + ["[UNK]"]),
    }[kind]()
    text = " ".join(words)
    cuts = [i for i in range(1, len(text)) if text[i] == " " and not text[i - 1].isspace()]
    if not cuts:
        return
    cut = cuts[int(where * (len(cuts) - 1))]
    whole, prefix = tokenizer.encode(text), tokenizer.encode(text[:cut])
    before = whole.offsets[:, 0] < cut
    np.testing.assert_array_equal(prefix.ids, whole.ids[before])
    np.testing.assert_array_equal(prefix.offsets, whole.offsets[before])


_TOKENIZERS: dict = {}


def _cached(kind: str) -> HFTokenizer:
    if kind not in _TOKENIZERS:
        _TOKENIZERS[kind] = _trained(kind)
    return _TOKENIZERS[kind]


def _document(seed: int, paragraphs: int, question_words: int = 6, answer_at: float | None = None) -> DocGraph:
    """question + paragraphs > sentences, as the hotpotqa schema reads them; with `answer_at`, a
    span answer (the first word of the sentence that far through the document)."""
    rng = random.Random(seed)
    parts, spans = [], []
    pos = 0

    def add(piece: str) -> tuple[int, int]:
        nonlocal pos
        start = pos
        parts.append(piece + " ")
        pos += len(piece) + 1
        return start, start + len(piece)

    question = add(" ".join(rng.choices(WORDS, k=question_words)) + "?")
    for _ in range(paragraphs):
        title = add(" ".join(rng.choices(WORDS, k=2)))
        sentences = [add(" ".join(rng.choices(WORDS, k=rng.randint(4, 20))) + ".") for _ in range(rng.randint(1, 5))]
        spans.append((title, sentences))
    graph = DocGraph("".join(parts), doc_id=f"doc{seed}")
    graph.add_node("q", "question", question)
    for p, (title, sentences) in enumerate(spans):
        graph.add_node(f"p{p}", "paragraph", (title[0], sentences[-1][1]))
        graph.add_child(f"p{p}", f"p{p}.t", "title", title)
        for s, span in enumerate(sentences):
            graph.add_child(f"p{p}", f"p{p}.s{s}", "sentence", span)
    if answer_at is not None:
        every = [span for _, sentences in spans for span in sentences]
        start = every[min(int(answer_at * len(every)), len(every) - 1)][0]
        word = graph.text[start:].split(" ", 1)[0].rstrip(".")
        graph.add_node("answer", "answer", (start, start + len(word)), answer_type="span")
    return graph


def _same_instance(a, b) -> None:
    for name in ("long_token_ids", "long_type_ids", "global_token_ids", "global_type_ids", "long_char_spans"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.global_node_ids == b.global_node_ids
    for level in a.long_owners:
        np.testing.assert_array_equal(a.long_owners[level], b.long_owners[level])
    for field in (
        "link_long",
        "link_global",
        "link_label",
        "g2g_src",
        "g2g_dst",
        "g2g_label",
        "long_segment",
        "global_segment",
    ):
        np.testing.assert_array_equal(getattr(a.side, field), getattr(b.side, field), err_msg=field)
    assert a.targets.keys() == b.targets.keys()
    for name in a.targets:
        np.testing.assert_array_equal(a.targets[name], b.targets[name], err_msg=name)
    ra, rb = a.truncation, b.truncation
    assert (ra.long_tokens_after, ra.globals_after, ra.dropped_nodes, ra.dropped_targets) == (
        rb.long_tokens_after,
        rb.globals_after,
        rb.dropped_nodes,
        rb.dropped_targets,
    )
    assert ra.truncated == rb.truncated
    # The messages differ only in the tail line, which says where tokenizing stopped.
    assert [m for m in ra.messages if not m.startswith("tail:")] == [
        m for m in rb.messages if not m.startswith("tail:")
    ]


@pytest.mark.parametrize("seed", range(6))
def test_the_instance_equals_the_one_from_the_whole_text(seed):
    schema = load_schema("hotpotqa")
    inner = load_tokenizer(str(TOKENIZER))
    graph = _document(seed, paragraphs=600 + 100 * seed, answer_at=(0.01, 0.9)[seed % 2])  # kept, or past the cut
    assert len(graph.text) > 4 * MIN_PREFIX_CHARS
    stopping, whole = Counting(inner, True), Counting(inner, False)
    early = compile_instance(graph, schema, stopping, compact=True)
    full = compile_instance(graph, schema, whole, compact=True)
    _same_instance(early, full)
    assert stopping.chars < whole.chars / 2 and whole.chars == len(graph.text)
    report, exact = early.truncation, full.truncation
    assert report.truncated and report.long_tokens_after == schema.max_long_length
    assert schema.max_long_length < report.long_tokens_before <= exact.long_tokens_before
    assert report.globals_before <= exact.globals_before
    assert any("tokenizing stopped at character" in m for m in report.messages)
    assert not any("tokenizing stopped" in m for m in exact.messages)
    assert report.dropped_targets == ([] if seed % 2 == 0 else ["answer"])  # an answer past the cut is reported cut


def test_short_documents_are_tokenized_whole_and_reported_exactly():
    schema = load_schema("hotpotqa")
    inner = load_tokenizer(str(TOKENIZER))
    graph = _document(0, paragraphs=5)
    counting = Counting(inner, True)
    inst = compile_instance(graph, schema, counting)
    assert counting.chars == len(graph.text) and not inst.truncation.truncated
    assert (
        long_token_bound(schema) == 4096 and long_token_bound(load_schema("wikihop")) is None
    )  # no long prefix; drop_longest_first


def test_a_per_token_global_is_never_cut():
    """The question's every wordpiece is a global: a question longer than the first guess is tokenized whole."""
    schema = load_schema({**_hotpot_dict(), "max_long_length": 64, "max_global_length": 4096})
    inner = load_tokenizer(str(TOKENIZER))
    graph = _document(3, paragraphs=60, question_words=3000)
    early = compile_instance(graph, schema, Counting(inner, True), compact=True)
    full = compile_instance(graph, schema, Counting(inner, False), compact=True)
    _same_instance(early, full)
    assert early.global_node_types.count("question") == full.global_node_types.count("question") > 3000


def _hotpot_dict() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "schemas" / "hotpotqa.yaml").read_text(encoding="utf-8"))


def test_ten_megabytes_tokenize_like_a_hundred_kilobytes():
    """#15 item 8: the cost follows what is kept, not the page (no timing: the characters tokenized)."""
    schema = load_schema("hotpotqa")
    inner = load_tokenizer(str(TOKENIZER))
    small, large = _document(1, paragraphs=250), _document(1, paragraphs=25_000)
    assert len(large.text) > 90 * len(small.text)
    counted = []
    for graph in (small, large):
        counting = Counting(inner, True)
        compile_instance(graph, schema, counting, compact=True)
        counted.append(counting.chars)
    assert counted[1] <= counted[0] * 1.5 and counted[1] < len(large.text) / 50


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    max_long=st.integers(8, 700),
    sep_after=st.booleans(),
    prefix=st.booleans(),
    kind=st.sampled_from(["shipped", "spacy"]),
    answer_at=st.none() | st.floats(0, 1),
)
def test_random_tail_schemas_give_the_whole_texts_instance(seed, max_long, sep_after, prefix, kind, answer_at):
    data = _hotpot_dict()
    data.update(
        max_long_length=max_long, max_global_length=max(8, max_long // 4), long_prefix=["cls"] if prefix else []
    )
    data["node_types"]["paragraph"]["sep_after"] = sep_after
    schema = load_schema(data)
    inner = load_tokenizer(str(TOKENIZER)) if kind == "shipped" else SpacyWordTokenizer(vocab=WORDS + ["[UNK]"])
    graph = _document(seed, paragraphs=random.Random(seed).randint(40, 400), answer_at=answer_at)
    early = compile_instance(graph, schema, Counting(inner, True), compact=True)
    full = compile_instance(graph, schema, Counting(inner, False), compact=True)
    _same_instance(early, full)
    assert early.truncation.long_tokens_before <= full.truncation.long_tokens_before


def test_character_classes_come_from_the_tokenizer():
    """What each character says about where tokens start, as the shipped BERT tokenizer's own
    normalizer and pre-tokenizer treat it; a byte-level BPE keeps its spaces in its tokens."""
    from graphattn.tokenize import CHAR_ALONE, CHAR_REMOVED, CHAR_SPACE, CHAR_UNKNOWN, CHAR_WORD

    chars = [" ", "\n", "\u00a0", "a", "\u00e9", ".", "\u4e00", "\u200b", "\ufeff", "\u0301", "\x00", "\ufffd"]
    points = np.array([ord(c) for c in chars], dtype=np.uint32)
    expected = [CHAR_SPACE] * 3 + [CHAR_WORD] * 2 + [CHAR_ALONE] * 2 + [CHAR_REMOVED] * 5
    assert load_tokenizer(str(TOKENIZER)).char_classes(points).tolist() == expected
    assert set(_cached("bpe").char_classes(points).tolist()) == {CHAR_UNKNOWN}
    assert may_cut(load_tokenizer(str(TOKENIZER))) and not may_cut(_cached("bpe"))
    spacy = SpacyWordTokenizer(vocab=["[UNK]"]).char_classes(points).tolist()
    assert spacy[:3] == [CHAR_SPACE, CHAR_UNKNOWN, CHAR_UNKNOWN] and set(spacy[3:]) == {CHAR_WORD}


def test_which_tokenizers_may_grow_a_prefix_piece_by_piece():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    assert load_tokenizer(str(TOKENIZER)).suffix_exact
    assert _cached("bpe").suffix_exact and _cached("unigram").suffix_exact
    raw = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    assert HFTokenizer(raw).suffix_exact
    raw.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.Strip()])  # acts at a piece's ends
    assert HFTokenizer(raw).prefix_exact and not HFTokenizer(raw).suffix_exact
    raw.normalizer, raw.pre_tokenizer = None, None
    assert not HFTokenizer(raw).suffix_exact  # not even a prefix may be cut


@pytest.mark.parametrize("kind", ["shipped", "bpe", "unigram", "spacy"])
@settings(max_examples=40, deadline=None)
@given(
    words=st.lists(st.sampled_from(WORDS + ["  ", "\n", "\t", "caf\u00e9", "x\u0301y", "ß"]), min_size=2, max_size=60),
    where=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_a_piece_between_two_cuts_tokenizes_like_the_whole_text(kind, words, where):
    """The claim `suffix_exact` adds: text[p:q] gives the whole text's tokens in [p, q), shifted."""
    if kind == "spacy":
        tokenizer = SpacyWordTokenizer(vocab=WORDS + ["[UNK]"])
    else:
        tokenizer = load_tokenizer(str(TOKENIZER)) if kind == "shipped" else _cached(kind)
    text = " ".join(words)
    cuts = [i for i in range(1, len(text)) if text[i] == " " and not text[i - 1].isspace()] + [len(text)]
    p, q = sorted(cuts[int(w * (len(cuts) - 1))] for w in where)
    whole, piece = tokenizer.encode(text[:q]), tokenizer.encode(text[p:q]).shifted(p)
    inside = whole.offsets[:, 0] >= p
    np.testing.assert_array_equal(piece.ids, whole.ids[inside])
    np.testing.assert_array_equal(piece.offsets, whole.offsets[inside])


def test_a_grown_prefix_reports_errors_at_their_place_in_the_text():
    """A piece past the first prefix that the tokenizer refuses: the error is the one of the whole
    prefix (its positions are the text's), as if the prefix had been tokenized from the start."""
    from graphattn.compile.encode import TextPlan, encode_documents

    class Refusing(Counting):
        suffix_exact = True

        def encode(self, text):
            self.chars += len(text)
            if "BAD" in text:
                raise ValueError(f"refused at character {text.index('BAD')}")
            return self.inner.encode(text)

        def encode_batch(self, texts):
            return [self.encode(text) for text in texts]

    text = "a " * 4000 + "BAD " + "a " * 10
    plan = TextPlan(text, bound=10, long_spans=np.array([[7000, len(text)]]))  # the first prefix holds none
    tokenizer = Refusing(load_tokenizer(str(TOKENIZER)), prefix_exact=True)
    ((error, stop),) = encode_documents([plan], tokenizer)
    assert isinstance(error, ValueError) and stop == len(text)
    assert str(error) == "refused at character 8000"
    assert tokenizer.chars == 2 * len(text)  # the first prefix, the piece after it, then the whole prefix again


def _text_nodes_graph(pieces: list[str]) -> DocGraph:
    """One `text` node per piece, the pieces joined as given (no space added between them)."""
    graph = DocGraph("".join(pieces), doc_id="page")
    pos = 0
    for k, piece in enumerate(pieces):
        graph.add_node(f"t{k}", "text", (pos, pos + len(piece)))
        pos += len(piece)
    return graph


@pytest.mark.parametrize(
    "tricky",
    [
        ["\u200b"],  # a zero-width space: the normalizer removes it, no token
        ["\ufeff", " ", "\u0301"],  # a BOM; a combining mark after a space (accents are stripped)
        ["a2a516ea6ea959d6658e", "const"],  # a node inside a word: the word is one [UNK], starting before it
        ["a2a516ea6ea959d", "\u200bconst"],  # the same word across a removed character
    ],
)
def test_nodes_past_the_cut_hold_tokens_as_the_tokenizer_says(tricky):
    """Past the cut, a node holds long tokens exactly when the whole text's tokens say so: a node
    of only removed characters, or one inside a word whose token starts before it, holds none and
    stays a global (a text-less global is kept, one whose text was cut away is dropped)."""
    schema = load_schema(
        {
            "name": "cut-nodes",
            "max_long_length": 16,
            "max_global_length": 64,
            "special_tokens": {"global": "[unused0]"},
            "node_types": {"text": {"global": "node", "long": True}},
            "truncation": {"policy": "tail"},
        }
    )
    words = [f"{w} " for w in random.Random(0).choices(WORDS, k=2 * MIN_PREFIX_CHARS // 5)]
    graph = _text_nodes_graph(words + [" "] + tricky + [" the river"])
    inner = load_tokenizer(str(TOKENIZER))
    early = compile_instance(graph, schema, Counting(inner, True), compact=True)
    full = compile_instance(graph, schema, Counting(inner, False), compact=True)
    assert early.truncation.messages[0] != full.truncation.messages[0]  # the cut happened
    _same_instance(early, full)
    whole = inner.encode(graph.text).offsets[:, 0]
    first = len("".join(words)) + 1
    tokenless = []  # the tricky nodes no token of the whole text starts in
    for k, piece in enumerate(tricky):
        start = first + sum(map(len, tricky[:k]))
        if not ((whole >= start) & (whole < start + len(piece))).any():
            tokenless.append(f"t{len(words) + 1 + k}")
    assert tokenless and set(tokenless) <= set(early.global_node_ids)


# words, a hex digest and the button text glued to it, removed characters (U+200B, BOM, a lone
# combining mark, a soft hyphen), spaces, accents, CJK, punctuation, a word longer than the window
_WORDS_AND_GLUE = ["the ", "river ", "runs, ", "a2a516ea6ea959d6658e", "const", "copy", "(x)", "ß", "caf\u00e9"]
_TRICKY = _WORDS_AND_GLUE + ["\u200b", "\ufeff", "\u0301", "\u00ad", " ", "  ", "\n", "\u4e00\u4e8c", "x" * 300]


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(st.sampled_from(_TRICKY), min_size=30, max_size=160),
    max_long=st.integers(2, 24),
    kind=st.sampled_from(["shipped", "spacy"]),
)
def test_random_pages_of_tricky_pieces_give_the_whole_texts_instance(pieces, max_long, kind):
    """Text nodes of words cut anywhere (inside words, removed characters, words longer than
    the window `long_text_past` looks for cuts in), with a first prefix so short that the cut
    falls anywhere: the instance and report are those of the whole text."""
    from unittest import mock

    import graphattn.compile.encode as encode

    schema = load_schema(
        {
            "name": "tricky",
            "max_long_length": max_long,
            "max_global_length": 256,
            "special_tokens": {"global": "[unused0]"},
            "node_types": {"text": {"global": "node", "long": True}},
            "truncation": {"policy": "tail"},
        }
    )
    graph = _text_nodes_graph(["start "] + pieces)
    inner = load_tokenizer(str(TOKENIZER)) if kind == "shipped" else SpacyWordTokenizer(vocab=WORDS + ["[UNK]"])
    with mock.patch.object(encode, "MIN_PREFIX_CHARS", 8), mock.patch.object(encode, "FIRST_CHARS_PER_TOKEN", 1):
        early = compile_instance(graph, schema, Counting(inner, True), compact=True)
    full = compile_instance(graph, schema, Counting(inner, False), compact=True)
    _same_instance(early, full)


def test_any_in_looks_further_only_where_no_flag_is_found_yet():
    """`_any_in` answers per range whether a flag is set in it: at once by a range's first
    flag, by widening windows for the others, and by a search over all flags when windows
    would cost as much (forced here with a few long ranges over few flags)."""
    from graphattn.compile.encode import _any_in

    flags = np.zeros(40, dtype=bool)
    flags[[3, 9, 37]] = True
    first = np.array([3, 4, 4, 10, 0, 12, 5, 38, 20])
    end = np.array([4, 9, 10, 37, 40, 12, 3, 40, 38])
    expected = [True, False, True, False, True, False, False, False, True]
    assert _any_in(flags, first, end).tolist() == expected
    many = np.arange(40)  # 40 ranges [k, 40): windows cost more than the search at once
    assert _any_in(flags, many, np.full(40, 40)).tolist() == [k <= 37 for k in range(40)]


def test_nearest_cut_back_and_ahead():
    """A cut is a space after a non-space (position 0 and the text's end are cuts too): found
    near, or past the windows (a word of 300 characters) over the whole text."""
    from graphattn.compile.encode import _nearest_cut

    text = " ab  cd" + "x" * 300 + " e"
    points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    at = np.array([0, 2, 4, 5, 200, 305, 308, 309])  # 3 and 307 are cuts (4 is a space after a space)
    assert _nearest_cut(points, at, -1).tolist() == [0, 0, 3, 3, 3, 3, 307, 309]
    assert _nearest_cut(points, at, 1).tolist() == [0, 3, 307, 307, 307, 307, 309, 309]
    many = np.arange(len(text) + 1).repeat(20)  # windows for all would outgrow the text: one pass
    cuts = np.array([0, 3, 307, 309])
    assert _nearest_cut(points, many, -1).tolist() == cuts[np.searchsorted(cuts, many, "right") - 1].tolist()
    assert _nearest_cut(points, many, 1).tolist() == cuts[np.searchsorted(cuts, many)].tolist()
