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
    "vocab.json + merges.txt); default: 'default', a small English WordPiece shipped for structure-only use "
    "and demos, whose ids match no pre-trained model"
)
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
    present = ", ".join(sorted(p.name for p in folder.iterdir())[:8]) or "nothing"
    raise TokenizerError(
        f"no tokenizer here: expected tokenizer.json, vocab.txt (BERT) or vocab.json + merges.txt "
        f"(RoBERTa); found {present}",
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
