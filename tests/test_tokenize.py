"""Tokenizer protocol and adapters: ids + char offsets, no special tokens, clear load errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as RawTokenizer

from graphattn.errors import GraphattnError
from graphattn.tokenize import (
    Encoding,
    HFTokenizer,
    SpacyWordTokenizer,
    Tokenizer,
    TokenizerError,
    load_tokenizer,
    spans_to_token_ranges,
    train_wordpiece,
)

SHIPPED = Path(__file__).resolve().parents[1] / "examples" / "data" / "tokenizer.json"
TEXT = "The lighthouse keeper's log records storms on nineteen nights in December."


@pytest.fixture(scope="module")
def shipped() -> HFTokenizer:
    return HFTokenizer.from_file(SHIPPED)


@pytest.fixture(scope="module")
def small_wordpiece() -> HFTokenizer:
    texts = ["the quick brown fox jumps over the lazy dog", "a lazy afternoon with quick brown bread"] * 5
    return train_wordpiece(texts, vocab_size=120)


# -- HF adapter ---------------------------------------------------------------------------------
def test_shipped_tokenizer_has_bert_specials_and_a_few_thousand_tokens(shipped):
    assert 2000 <= shipped.vocab_size <= 4000
    assert (shipped.pad_id, shipped.unk_id, shipped.cls_id, shipped.sep_id, shipped.mask_id) == (0, 1, 2, 3, 4)
    assert SHIPPED.stat().st_size < 300 * 1024
    assert isinstance(shipped, Tokenizer)


def test_encode_gives_int32_ids_and_char_offsets_without_special_tokens(shipped):
    enc = shipped.encode(TEXT)
    assert isinstance(enc, Encoding)
    assert enc.ids.dtype == np.int32 and enc.offsets.dtype == np.int32
    assert enc.offsets.shape == (len(enc), 2)
    assert shipped.cls_id not in enc.ids and shipped.sep_id not in enc.ids
    # the raw tokenizer's post-processor would add them: the adapter really strips them
    raw = shipped.tokenizer.encode(TEXT)
    assert raw.ids[0] == shipped.cls_id and raw.ids[-1] == shipped.sep_id and raw.ids[1:-1] == enc.ids.tolist()
    for token, (start, end) in zip(enc.tokens, enc.offsets):
        assert TEXT[start:end].lower() == token.removeprefix("##")
    assert enc.tokens[:2] == ["the", "lighthouse"]
    assert enc.offsets[:2].tolist() == [[0, 3], [4, 14]]


def test_offsets_count_characters_not_bytes(small_wordpiece):
    text = "Ünï ☃ café fox"
    enc = small_wordpiece.encode(text)
    assert enc.offsets.tolist()[-1] == [11, 14]  # "fox" starts at char 11 (byte 16)
    assert text[11:14] == "fox"
    snowman = enc.offsets.tolist().index([4, 5])
    assert enc.ids[snowman] == small_wordpiece.unk_id
    assert enc.offsets[0, 0] == 0 and enc.offsets[snowman - 1, 1] == 3  # "Ünï", in however many pieces


def test_empty_text_gives_empty_arrays(shipped):
    enc = shipped.encode("")
    assert enc.ids.shape == (0,) and enc.offsets.shape == (0, 2) and enc.ids.dtype == np.int32


def test_encode_batch_matches_encode(shipped):
    texts = [TEXT, "", "Glaciers carve U-shaped valleys.", "café ☃"]
    batch = shipped.encode_batch(texts)
    for text, enc in zip(texts, batch):
        one = shipped.encode(text)
        np.testing.assert_array_equal(enc.ids, one.ids)
        np.testing.assert_array_equal(enc.offsets, one.offsets)
        assert enc.tokens == one.tokens


def test_truncation_and_padding_in_the_file_are_switched_off_on_a_copy(small_wordpiece):
    raw = RawTokenizer.from_str(small_wordpiece.tokenizer.to_str())
    raw.enable_truncation(max_length=3)
    raw.enable_padding(length=50)
    adapter = HFTokenizer(raw)
    enc = adapter.encode("the quick brown fox jumps over the lazy dog")
    assert len(enc) == 9 and small_wordpiece.pad_id not in enc.ids
    assert raw.truncation is not None  # the caller's object is untouched


def test_token_and_id_lookups(shipped):
    assert shipped.id_to_token(shipped.token_to_id("the")) == "the"
    assert shipped.token_to_id("[CLS]") == shipped.cls_id
    assert shipped.token_to_id("no-such-token-xyz") is None
    with pytest.raises(TokenizerError, match="outside the vocabulary of 3000"):
        shipped.id_to_token(10**6)


def test_encode_rejects_non_text(shipped):
    with pytest.raises(TokenizerError, match=r"^\$\.text: expected a str to tokenize, got bytes"):
        shipped.encode(b"bytes")
    with pytest.raises(TokenizerError, match=r"^\$\.texts\[1\]: expected a str to tokenize, got NoneType"):
        shipped.encode_batch(["ok", None])


def test_explicit_special_token_names_must_exist(small_wordpiece):
    adapter = HFTokenizer(small_wordpiece.tokenizer, cls_token="[MASK]")
    assert adapter.cls_id == small_wordpiece.mask_id
    with pytest.raises(TokenizerError, match="'<bos>' is not in the vocabulary"):
        HFTokenizer(small_wordpiece.tokenizer, cls_token="<bos>")


def test_tokenizer_without_specials_reports_none():
    raw = RawTokenizer.from_str(
        train_wordpiece(["abc abd"], vocab_size=30, special_tokens=["<unk>"]).tokenizer.to_str()
    )
    adapter = HFTokenizer(raw)
    assert adapter.unk_id == 0
    assert (adapter.cls_id, adapter.sep_id, adapter.pad_id, adapter.mask_id) == (None, None, None, None)


def test_train_wordpiece_is_bert_style(small_wordpiece):
    assert small_wordpiece.vocab_size <= 120
    assert [small_wordpiece.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert small_wordpiece.encode("QUICK Brown").tokens == ["quick", "brown"]
    with pytest.raises(TokenizerError, match="unk token"):
        train_wordpiece(["x"], vocab_size=50, special_tokens=["[CLS]"])
    with pytest.raises(TokenizerError, match="must exceed"):
        train_wordpiece(["x"], vocab_size=3)


# -- load_tokenizer -----------------------------------------------------------------------------
def test_load_tokenizer_accepts_paths_objects_and_spacy(tmp_path, shipped):
    assert load_tokenizer(shipped) is shipped
    assert load_tokenizer(str(SHIPPED)).vocab_size == shipped.vocab_size
    assert load_tokenizer(SHIPPED.parent).vocab_size == shipped.vocab_size  # a directory holding tokenizer.json
    assert isinstance(load_tokenizer(shipped.tokenizer), HFTokenizer)
    spacy_tok = load_tokenizer("spacy:en")
    assert isinstance(spacy_tok, SpacyWordTokenizer) and spacy_tok.grow
    assert isinstance(load_tokenizer(spacy_tok.nlp), SpacyWordTokenizer)


def test_load_tokenizer_missing_file_names_it(tmp_path):
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(TokenizerError, match="does not exist") as info:
        load_tokenizer(missing)
    assert str(missing) in str(info.value) and isinstance(info.value, GraphattnError)


@pytest.mark.parametrize("content", ["{not json", json.dumps({"model": {"type": "NoSuchModel"}}), ""])
def test_load_tokenizer_invalid_file_names_it(tmp_path, content):
    bad = tmp_path / "tokenizer.json"
    bad.write_text(content)
    with pytest.raises(TokenizerError, match="not a valid tokenizers tokenizer.json") as info:
        load_tokenizer(bad)
    assert str(bad) in str(info.value)


def test_load_tokenizer_rejects_other_objects():
    with pytest.raises(TokenizerError, match="cannot make a tokenizer from int"):
        load_tokenizer(42)
    with pytest.raises(TokenizerError, match="no language 'zz-not-a-lang'"):
        load_tokenizer("spacy:zz-not-a-lang")


# -- spaCy adapter ------------------------------------------------------------------------------
def test_spacy_growing_vocab_numbers_words_by_first_use():
    tok = SpacyWordTokenizer()
    text = "Bees hum.  Bees\nsleep!"
    enc = tok.encode(text)
    assert enc.tokens == ["Bees", "hum", ".", "Bees", "sleep", "!"]  # whitespace tokens skipped
    first = 10  # the ids before: [PAD] [UNK] [CLS] [SEP] [MASK] and the reserved [unused0]..[unused4]
    assert [tok.id_to_token(i) for i in range(first)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
        f"[unused{i}]" for i in range(5)
    ]
    assert (enc.ids - first).tolist() == [0, 1, 2, 0, 3, 4]
    assert enc.offsets.tolist() == [[0, 4], [5, 8], [8, 9], [11, 15], [16, 21], [21, 22]]
    assert [text[s:e] for s, e in enc.offsets.tolist()] == enc.tokens
    assert tok.vocab_size == first + 5 and tok.id_to_token(first + 3) == "sleep"
    assert (tok.encode("hum Bees").ids - first).tolist() == [1, 0]


def test_spacy_fixed_vocab_maps_unknowns_to_unk_and_lowercases():
    tok = SpacyWordTokenizer(["bees", "hum"], lowercase=True)
    assert not tok.grow
    enc = tok.encode("BEES hum loudly")
    assert enc.ids.tolist() == [10, 11, tok.unk_id]  # after the 5 special and 5 reserved tokens
    assert enc.tokens == ["bees", "hum", "[UNK]"]
    assert tok.vocab_size == 12 and tok.token_to_id("loudly") is None


def test_spacy_vocab_file_round_trip(tmp_path):
    grown = SpacyWordTokenizer()
    grown.encode("café naïve ☃ glaciers")
    path = tmp_path / "vocab.txt"
    grown.save_vocab(path)
    fixed = SpacyWordTokenizer(path)
    assert fixed.vocab_size == grown.vocab_size and not fixed.grow
    enc = fixed.encode("naïve glaciers melt")
    assert enc.ids.tolist() == [grown.token_to_id("naïve"), grown.token_to_id("glaciers"), fixed.unk_id]
    assert enc.offsets.tolist() == [[0, 5], [6, 14], [15, 19]]


def test_spacy_errors_name_the_problem(tmp_path):
    with pytest.raises(TokenizerError, match="does not exist") as info:
        SpacyWordTokenizer(tmp_path / "missing.txt")
    assert "missing.txt" in str(info.value)
    with pytest.raises(TokenizerError, match="needs an unk token"):
        SpacyWordTokenizer(["a"], special_tokens=["[PAD]"])
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        SpacyWordTokenizer().id_to_token(99)


def test_spacy_encode_batch_matches_encode():
    texts = ["One two.", "", "two three  one"]
    batch_tok, single_tok = SpacyWordTokenizer(), SpacyWordTokenizer()
    for text, enc in zip(texts, batch_tok.encode_batch(texts)):
        one = single_tok.encode(text)
        assert enc.ids.tolist() == one.ids.tolist() and enc.offsets.tolist() == one.offsets.tolist()
    assert batch_tok.encode("").offsets.shape == (0, 2)


# -- spans -> token ranges ----------------------------------------------------------------------
#                 0    5    10   15   20
#                 unbelievable walking
UNBELIEVABLE = np.array([[0, 2], [2, 6], [6, 12], [13, 20]])  # un ##beli ##evable walking


@pytest.mark.parametrize(
    "span, expected",
    [
        ((0, 20), (0, 4)),  # everything
        ((0, 12), (0, 3)),  # the word
        ((2, 12), (1, 3)),  # on token boundaries
        ((0, 4), (0, 2)),  # cuts ##beli: it starts inside, so it is in
        ((4, 20), (2, 4)),  # cuts ##beli: it starts before, so it is out
        ((3, 5), (2, 2)),  # inside one token: empty, at the position after it
        ((12, 13), (3, 3)),  # the space: no token starts there
        ((13, 13), (3, 3)),  # empty span at a token start is still empty
        ((20, 25), (4, 4)),  # past the last token
    ],
)
def test_spans_to_token_ranges_by_first_character(span, expected):
    assert spans_to_token_ranges(UNBELIEVABLE, np.array([span])).tolist() == [list(expected)]


def test_zero_width_tokens_follow_their_start():
    offsets = np.array([[0, 3], [4, 4], [4, 7], [8, 8]])  # "abc" [UNK]@4 "def" [UNK]@8
    spans = np.array([[4, 7], [0, 4], [3, 4], [8, 9], [0, 8], [0, 9]])
    expected = [[1, 3], [0, 1], [1, 1], [3, 4], [0, 3], [0, 4]]
    out = spans_to_token_ranges(offsets, spans)
    assert out.tolist() == expected and out.dtype == np.int32


def test_spans_to_token_ranges_rejects_bad_input():
    with pytest.raises(TokenizerError, match="not in text order: token 2"):
        spans_to_token_ranges(np.array([[0, 1], [5, 6], [2, 3]]), np.array([[0, 1]]))
    with pytest.raises(TokenizerError, match=r"span 1 ends before it starts: \[5, 2\]"):
        spans_to_token_ranges(UNBELIEVABLE, np.array([[0, 1], [5, 2]]))
    with pytest.raises(TokenizerError, match=r"spans must have shape \[m, 2\]"):
        spans_to_token_ranges(UNBELIEVABLE, np.array([0, 1]))
    with pytest.raises(TokenizerError, match=r"offsets must have shape \[n, 2\]"):
        spans_to_token_ranges(np.zeros(4), np.array([[0, 1]]))
    assert spans_to_token_ranges(np.zeros((0, 2)), np.array([[0, 3]])).tolist() == [[0, 0]]


@st.composite
def offsets_and_spans(draw):
    widths = draw(st.lists(st.integers(0, 4), max_size=20))
    gaps = draw(st.lists(st.integers(0, 2), min_size=len(widths), max_size=len(widths)))
    starts = (
        np.cumsum(np.array(gaps, dtype=np.int64) + np.r_[0, widths[:-1]].astype(np.int64)) if widths else np.zeros(0)
    )
    offsets = np.stack([starts, starts + np.array(widths, dtype=np.int64)], axis=1).reshape(-1, 2)
    limit = int(offsets.max(initial=0)) + 3
    pairs = draw(st.lists(st.tuples(st.integers(0, limit), st.integers(0, limit)), min_size=1, max_size=8))
    spans = np.array([sorted(p) for p in pairs])
    return offsets, spans


@settings(max_examples=150, deadline=None)
@given(offsets_and_spans())
def test_spans_to_token_ranges_matches_definition(case):
    offsets, spans = case
    got = spans_to_token_ranges(offsets, spans)
    for (start, end), (first, stop) in zip(spans.tolist(), got.tolist()):
        members = [t for t in range(len(offsets)) if start <= offsets[t, 0] < end]
        if members:
            assert (first, stop) == (members[0], members[-1] + 1)
        else:
            assert first == stop
