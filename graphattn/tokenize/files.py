"""Tokenizers from disk: a tokenizer.json, a Hugging Face model directory, or the shipped default.

What `--tokenizer` (and `load_tokenizer`) accepts, all of it local (nothing is downloaded):

* ``default``: a small English WordPiece (3,000 ids, lowercased) shipped inside the package
  (`DEFAULT_TOKENIZER_FILE`), trained on the project's own example text. It is for
  structure-only use and demos: its ids match no pre-trained model.
* a ``tokenizer.json`` (the `tokenizers` library's format), or a directory holding one;
* a Hugging Face model directory without one (what ``save_pretrained`` of older tokenizers
  writes, the same folder `graphattn.nn.lift.lift_pretrained` reads): BERT's ``vocab.txt``
  (WordPiece, lowercased unless ``tokenizer_config.json`` says ``do_lower_case: false``) or
  RoBERTa's ``vocab.json`` + ``merges.txt`` (byte-level BPE), rebuilt with `tokenizers`.

* an ETC checkpoint directory (etcmodel's released checkpoints): its WordPiece vocabulary
  ``vocab_bert_uncased_english.txt`` (lowercased, BERT's rules), or its SentencePiece model
  ``*.model`` (the large checkpoints), read with the `sentencepiece` package's model description
  and rebuilt as a `tokenizers` Unigram or BPE tokenizer. A directory whose name ends in
  ``split_punctuation`` (etc_large_split_punctuation) splits words and punctuation as BERT's
  basic tokenizer does before the SentencePieces, as that checkpoint expects.

A name such as ``bert-base-uncased`` that is no file here gets a message saying how to make a
local copy. This module imports `tokenizers` only when it builds one, so --help stays fast.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from graphattn.errors import TokenizerError

DEFAULT_TOKENIZER = "default"
DEFAULT_TOKENIZER_FILE = Path(__file__).resolve().parents[1] / "assets" / "default-tokenizer.json"
TOKENIZER_HELP = (
    "tokenizer.json, or a local Hugging Face model directory (tokenizer.json, BERT vocab.txt or RoBERTa "
    "vocab.json + merges.txt), or an ETC checkpoint directory (its WordPiece vocabulary or SentencePiece "
    "model); default: 'default', a small English WordPiece shipped for structure-only use and demos, whose ids "
    "match no pre-trained model"
)
ETC_WORDPIECE_VOCABS = ("vocab_bert_uncased_english.txt",)  # etc_base_2x_pretrain*: BERT uncased
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def raw_tokenizer(spec: str | os.PathLike) -> tuple[Any, str]:
    """(`tokenizers.Tokenizer`, the file or directory it came from) for what a user named."""
    if str(spec) == DEFAULT_TOKENIZER:
        return _from_json(DEFAULT_TOKENIZER_FILE), str(DEFAULT_TOKENIZER_FILE)
    path = Path(spec)
    if path.is_dir():
        return _from_directory(path), str(path)
    if path.is_file():
        if path.name == "vocab.txt":
            return _wordpiece(path, _lowercase(path.parent)), str(path)
        if path.name in ETC_WORDPIECE_VOCABS:
            return _wordpiece(path, True), str(path)
        if path.suffix == ".model":
            return _sentencepiece(path, path.parent.name.endswith("split_punctuation")), str(path)
        if path.name in ("vocab.json", "merges.txt"):
            return _from_directory(path.parent), str(path.parent)
        return _from_json(path), str(path)
    raise TokenizerError(_missing(str(spec)), file=str(spec))


def _missing(spec: str) -> str:
    if _HUB_NAME.match(spec) and not spec.endswith((".json", ".txt")):
        folder = spec.rsplit("/", 1)[-1]
        return (
            f"no such file or directory; if {spec!r} is a Hugging Face Hub name: graphattn never downloads, so save a "
            f"local copy first (huggingface-cli download {spec} --local-dir {folder}, or transformers' "
            f"AutoTokenizer.from_pretrained({spec!r}).save_pretrained({folder!r})) and pass that directory"
        )
    return "tokenizer file does not exist (expected a tokenizer.json or a Hugging Face model directory)"


def _from_json(path: Path) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for bad JSON / unknown models
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TokenizerError(f"not a valid tokenizers tokenizer.json: {first_line}", file=str(path)) from None


def _from_directory(folder: Path) -> Any:
    if (folder / "tokenizer.json").is_file():
        return _from_json(folder / "tokenizer.json")
    if (folder / "vocab.txt").is_file():
        return _wordpiece(folder / "vocab.txt", _lowercase(folder))
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        return _byte_level_bpe(folder / "vocab.json", folder / "merges.txt")
    for name in ETC_WORDPIECE_VOCABS:
        if (folder / name).is_file():
            return _wordpiece(folder / name, True)
    models = sorted(folder.glob("*.model"))
    if len(models) == 1:
        return _sentencepiece(models[0], folder.name.endswith("split_punctuation"))
    present = ", ".join(sorted(p.name for p in folder.iterdir())[:8]) or "nothing"
    raise TokenizerError(
        f"no tokenizer here: expected tokenizer.json, vocab.txt (BERT), vocab.json + merges.txt "
        f"(RoBERTa), or an ETC checkpoint's vocab_bert_uncased_english.txt or one SentencePiece *.model; "
        f"found {present}",
        file=str(folder),
    )


def _tokenizer_config(folder: Path) -> dict:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TokenizerError(f"tokenizer_config.json is not valid JSON ({err})", file=str(path)) from None
    if not isinstance(data, dict):
        raise TokenizerError(f"expected a JSON object, got {type(data).__name__}", file=str(path))
    return data


def _lowercase(folder: Path) -> bool:
    """BERT's vocab.txt is lowercased unless tokenizer_config.json says otherwise (as transformers does)."""
    return bool(_tokenizer_config(folder).get("do_lower_case", True))


def _special_tokens_in(raw: Any, candidates: tuple[str, ...]) -> None:
    """Register the vocabulary's special tokens as such, so that text never spells them."""
    from tokenizers import AddedToken

    present = [token for token in candidates if raw.token_to_id(token) is not None]
    raw.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in present])


def _wordpiece(vocab: Path, lowercase: bool) -> Any:
    """BERT's tokenizer from its vocab.txt: BERT normalizer and pre-tokenizer, ## continuations."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    try:
        model = models.WordPiece.from_file(str(vocab), unk_token="[UNK]")
    except Exception as exc:  # noqa: BLE001 - tokenizers' errors carry no type worth keeping
        raise TokenizerError(f"not a WordPiece vocabulary (one token per line): {exc}", file=str(vocab)) from None
    raw = Tokenizer(model)
    raw.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None)
    raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    raw.decoder = decoders.WordPiece(prefix="##")
    _special_tokens_in(raw, ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"))
    return raw


def _byte_level_bpe(vocab: Path, merges: Path) -> Any:
    """RoBERTa's tokenizer from vocab.json + merges.txt: byte-level BPE with offsets trimmed of
    the leading space, so a token's first character is its first letter (spans stay exact)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    try:
        model = models.BPE.from_file(str(vocab), str(merges))
    except Exception as exc:  # noqa: BLE001
        raise TokenizerError(f"not a BPE vocabulary with its merges: {exc}", file=str(vocab.parent)) from None
    raw = Tokenizer(model)
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.post_processor = processors.ByteLevel(trim_offsets=True)
    _special_tokens_in(raw, ("<s>", "<pad>", "</s>", "<unk>", "<mask>"))
    return raw


def _sentencepiece_model(path: Path) -> Any:
    """The SentencePiece ModelProto of a .model file, parsed with the sentencepiece package's own
    description of the format."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:
        raise TokenizerError(
            "reading a SentencePiece .model needs the sentencepiece package (pip install 'graphattn[etc]')",
            file=str(path),
        ) from None
    if path.stat().st_size > 1 << 28:
        raise TokenizerError(f"{path.stat().st_size} bytes is too large for a SentencePiece model", file=str(path))
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise TokenizerError(f"not a SentencePiece model: {exc}", file=str(path)) from None
    if not proto.pieces:
        raise TokenizerError("not a SentencePiece model: it has no pieces", file=str(path))
    return proto


def _sentencepiece(path: Path, split_punctuation: bool = False) -> Any:
    """A `tokenizers` Tokenizer computing what the SentencePiece model computes: its normalizer
    (the precompiled character map), "▁" for spaces with one before the text, and the Unigram
    pieces and scores, or for a BPE model the merges implied by the pieces' order (each piece that
    splits into two pieces is the merge of that pair, earlier pieces merging first)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    proto = _sentencepiece_model(path)
    pieces = [(p.piece, p.score) for p in proto.pieces]
    unk_id = proto.trainer_spec.unk_id
    kind = proto.trainer_spec.model_type  # 1 unigram, 2 BPE, 3 word, 4 char
    if kind == 1:
        model = models.Unigram(pieces, unk_id, proto.trainer_spec.byte_fallback)
    elif kind == 2:
        vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
        merges = []
        for merged, rank in vocab.items():
            for cut in range(1, len(merged)):
                left, right = merged[:cut], merged[cut:]
                if left in vocab and right in vocab:
                    merges.append((rank, vocab[left], vocab[right], left, right))
        merges.sort()
        model = models.BPE(
            vocab,
            [(left, right) for *_, left, right in merges],
            unk_token=pieces[unk_id][0],
            fuse_unk=True,
            byte_fallback=proto.trainer_spec.byte_fallback,
        )
    else:
        raise TokenizerError(f"SentencePiece model type {kind} is not supported (unigram or BPE)", file=str(path))
    raw = Tokenizer(model)
    charsmap = proto.normalizer_spec.precompiled_charsmap
    steps = [normalizers.Precompiled(charsmap)] if charsmap else []
    if proto.normalizer_spec.remove_extra_whitespaces:  # SentencePiece's default: trim, single spaces
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Strip()]
    raw.normalizer = normalizers.Sequence(steps) if steps else None
    metaspace = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    raw.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.BertPreTokenizer(), metaspace]) if split_punctuation else metaspace
    )
    raw.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    control = [p.piece for p in proto.pieces if p.type in (2, 3)]  # CONTROL, USER_DEFINED
    raw.add_special_tokens([AddedToken(piece, special=True, normalized=False) for piece in control])
    return raw
