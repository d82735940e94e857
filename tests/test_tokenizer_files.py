"""Tokenizers a pip user has: the shipped default, a Hugging Face model directory, one trained by
`graphattn tokenizer train`; and what a Hub name gets."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from graphattn.tokenize import HFTokenizer, TokenizerError, load_tokenizer
from graphattn.tokenize.files import DEFAULT_TOKENIZER_FILE

REPO = Path(__file__).resolve().parents[1]
TEXT = "The river runs past old mills and quiet towns, where people trade grain and wool."

transformers = pytest.importorskip("transformers")


def test_default_tokenizer_ships_inside_the_package():
    tokenizer = load_tokenizer("default")
    assert isinstance(tokenizer, HFTokenizer) and tokenizer.vocab_size == 3000
    assert Path(tokenizer.source) == DEFAULT_TOKENIZER_FILE and DEFAULT_TOKENIZER_FILE.is_relative_to(
        REPO / "graphattn"
    )
    assert (
        REPO / "examples" / "data" / "tokenizer.json"
    ).resolve() == DEFAULT_TOKENIZER_FILE  # the examples use the same one
    assert tokenizer.cls_id is not None and tokenizer.sep_id is not None and tokenizer.unk_id is not None


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    """BERT's layout without tokenizer.json: vocab.txt (the default tokenizer's WordPiece vocabulary)."""
    folder = tmp_path_factory.mktemp("bert")
    vocab = json.loads(DEFAULT_TOKENIZER_FILE.read_text())["model"]["vocab"]
    (folder / "vocab.txt").write_text("".join(f"{token}\n" for token, _ in sorted(vocab.items(), key=lambda kv: kv[1])))
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return folder


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory) -> Path:
    """RoBERTa's layout: vocab.json + merges.txt of a byte-level BPE (trained here, nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("roberta")
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    lines = (REPO / "examples" / "data" / "corpus.txt").read_text().splitlines()
    raw.train_from_iterator(
        lines,
        trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    raw.model.save(str(folder))
    return folder


def test_bert_vocab_txt_directory_matches_transformers(bert_dir):
    ours = load_tokenizer(str(bert_dir))
    theirs = transformers.BertTokenizer.from_pretrained(str(bert_dir))  # what transformers reads from the same folder
    got = ours.encode(TEXT)
    want = theirs(TEXT, add_special_tokens=False, return_offsets_mapping=True)
    np.testing.assert_array_equal(got.ids, want["input_ids"])
    np.testing.assert_array_equal(got.offsets, want["offset_mapping"])
    assert (ours.cls_id, ours.sep_id, ours.mask_id) == (theirs.cls_token_id, theirs.sep_token_id, theirs.mask_token_id)
    assert (
        load_tokenizer(str(bert_dir / "vocab.txt")).encode(TEXT).ids.tolist() == got.ids.tolist()
    )  # the file alone too


def test_roberta_vocab_json_and_merges_directory_matches_transformers(roberta_dir):
    ours = load_tokenizer(str(roberta_dir))
    theirs = transformers.RobertaTokenizer.from_pretrained(str(roberta_dir))
    got = ours.encode(TEXT)
    want = theirs(TEXT, add_special_tokens=False, return_offsets_mapping=True)
    np.testing.assert_array_equal(got.ids, want["input_ids"])
    np.testing.assert_array_equal(got.offsets, want["offset_mapping"])  # trimmed: a token starts at its first letter
    assert TEXT[got.offsets[1, 0]] == "r"  # "Ġriver" starts at the r, so spans of words stay exact
    assert (ours.cls_id, ours.sep_id, ours.pad_id) == (theirs.cls_token_id, theirs.sep_token_id, theirs.pad_token_id)


def test_hub_name_says_a_local_copy_is_needed():
    with pytest.raises(
        TokenizerError,
        match=r"bert-base-uncased: no such file or directory; .*graphattn never downloads, "
        r"so save a local copy first \(huggingface-cli download bert-base-uncased",
    ):
        load_tokenizer("bert-base-uncased")
    with pytest.raises(TokenizerError, match="tokenizer file does not exist"):
        load_tokenizer("missing/tokenizer.json")


def test_tokenizer_train_command_writes_a_tokenizer_json(tmp_path):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text((REPO / "examples" / "data" / "corpus.txt").read_text())
    (tmp_path / "texts" / "skip.bin").write_bytes(b"\xff\xfe")  # not a text suffix: left out of the directory
    out = tmp_path / "tok" / "tokenizer.json"
    proc = subprocess.run(
        ["graphattn", "tokenizer", "train", str(tmp_path / "texts"), "--vocab-size", "600", "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.startswith(f"wrote {out}: 600 ids, trained on 270 lines")
    tokenizer = load_tokenizer(str(out))
    assert tokenizer.vocab_size == 600 and tokenizer.unk_id is not None
    assert tokenizer.id_to_token(int(tokenizer.encode("river").ids[0])) == "river"


def test_compile_and_viz_default_to_the_same_tokenizer(tmp_path):
    (tmp_path / "doc.txt").write_text(TEXT)
    argv = ["compile", str(tmp_path / "doc.txt"), "--schema", "etc-sentences", "--out", str(tmp_path / "shards"), "-q"]
    proc = subprocess.run(["graphattn", *argv], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    run = json.loads((tmp_path / "shards" / "run.json").read_text())
    assert run["settings"]["tokenizer"] == "default" and run["settings"]["tokenizer_vocab_size"] == 3000
    from graphattn.shards.dataset import ShardDataset
    from graphattn.viz.cli import load_instance

    stored = ShardDataset(tmp_path / "shards")[0]
    drawn = load_instance(tmp_path / "doc.txt", schema="etc-sentences").instance  # viz with its default tokenizer
    np.testing.assert_array_equal(drawn.long_token_ids, stored.long_token_ids)


def test_etc_checkpoint_directory_gives_its_lowercased_wordpiece_vocabulary(tmp_path):
    words = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "river", "##s", "flow", "."]
    (tmp_path / "vocab_bert_uncased_english.txt").write_text("\n".join(words) + "\n")
    (tmp_path / "etc_config.json").write_text("{}")
    tokenizer = load_tokenizer(str(tmp_path))
    encoding = tokenizer.encode("The Rivers FLOW.")
    assert encoding.tokens == ["the", "river", "##s", "flow", "."]
    assert encoding.ids.tolist() == [6, 7, 8, 9, 10]
    assert encoding.offsets.tolist() == [[0, 3], [4, 9], [9, 10], [11, 15], [15, 16]]


@pytest.fixture(scope="module")
def sentencepiece_models(tmp_path_factory):
    """Unigram and BPE SentencePiece models trained here (the checkpoints' own are too large to ship)."""
    spm = pytest.importorskip("sentencepiece")
    lines = [line for line in (REPO / "examples" / "data" / "corpus.txt").read_text().splitlines() if line.strip()]
    models = {}
    for kind in ("unigram", "bpe"):
        folder = tmp_path_factory.mktemp(f"etc_large_{kind}")
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_prefix=str(folder / "vocab_gpt_for_etc"),
            vocab_size=400,
            model_type=kind,
            minloglevel=2,
        )
        models[kind] = folder
    return models, lines


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_sentencepiece_model_encodes_as_sentencepiece_does(sentencepiece_models, kind):
    import sentencepiece as spm

    models, lines = sentencepiece_models
    reference = spm.SentencePieceProcessor(model_file=str(models[kind] / "vocab_gpt_for_etc.model"))
    tokenizer = load_tokenizer(str(models[kind]))  # the checkpoint directory: its one *.model
    assert tokenizer.vocab_size == reference.get_piece_size()
    texts = lines[:150] + ["  Two  spaces and\ttabs ", "Caf\u00e9 \uff21\uff22 (full-width)", ""]
    for text, encoding in zip(texts, tokenizer.encode_batch(texts)):
        assert encoding.ids.tolist() == reference.encode(text), text
        for (start, end), piece in zip(encoding.offsets.tolist(), encoding.tokens):
            assert text[start:end].strip() or piece == "\u2581", (text, piece)  # offsets point into the text


def test_split_punctuation_directory_splits_words_first(sentencepiece_models):
    models, _ = sentencepiece_models
    split = models["unigram"].parent / "etc_large_split_punctuation"
    split.mkdir(exist_ok=True)
    (split / "vocab_gpt_for_etc.model").write_bytes((models["unigram"] / "vocab_gpt_for_etc.model").read_bytes())
    plain = load_tokenizer(str(models["unigram"])).encode("The end.").tokens
    words = load_tokenizer(str(split)).encode("The end.").tokens
    assert "".join(words).endswith("\u2581.") and not "".join(plain).endswith("\u2581.")  # "." is a word of its own


def test_compile_takes_an_etc_checkpoint_directory_as_tokenizer(sentencepiece_models, tmp_path):
    models, _ = sentencepiece_models
    (tmp_path / "doc.txt").write_text(TEXT)
    out = tmp_path / "shards"
    argv = ["compile", str(tmp_path / "doc.txt"), "--schema", "etc-sentences", "--out", str(out), "-q"]
    refused = subprocess.run(["graphattn", *argv, "--tokenizer", str(models["bpe"])], capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr  # this vocabulary lacks it
    assert "$.special_tokens.global: token '[unused0]' is not in the tokenizer's vocabulary" in refused.stderr
    assert "--set special_tokens.global=" in refused.stderr
    argv += ["--set", "special_tokens.global=1"]  # etcmodel's global token id, as the large checkpoints use it
    proc = subprocess.run(["graphattn", *argv, "--tokenizer", str(models["bpe"])], capture_output=True, text=True)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr  # id 1 is <s>: reserved, not a word
    run = json.loads((out / "run.json").read_text())
    assert run["settings"]["tokenizer_vocab_size"] == 400
    from graphattn.shards.dataset import ShardDataset

    instance = ShardDataset(out)[0]
    assert set(instance.global_token_ids.tolist()) == {1}  # every sentence global is id 1, as ETC pre-trained


def test_a_damaged_sentencepiece_model_is_one_line(tmp_path):
    pytest.importorskip("sentencepiece")
    (tmp_path / "vocab.model").write_bytes(b"\x0a\xff\xff\xff")
    with pytest.raises(TokenizerError) as exc:
        load_tokenizer(str(tmp_path / "vocab.model"))
    assert "vocab.model" in str(exc.value) and "not a SentencePiece model" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_viz_takes_an_etc_checkpoint_directory_as_tokenizer(tmp_path):
    words = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "river", "##s", "flow", "."]
    checkpoint = tmp_path / "etc_base_2x_pretrain"
    checkpoint.mkdir()
    (checkpoint / "vocab_bert_uncased_english.txt").write_text("\n".join(words) + "\n")
    (tmp_path / "doc.txt").write_text("The rivers flow. The river flows.")
    argv = ["viz", str(tmp_path / "doc.txt"), "--schema", "etc-sentences", "--tokenizer", str(checkpoint)]
    done = subprocess.run(["graphattn", *argv, "--out", str(tmp_path / "pic.png")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {tmp_path / 'pic.png'} (tokens, queries 0:12, keys 0:12)")
    assert (tmp_path / "pic.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
