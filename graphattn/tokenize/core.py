"""The tokenizer protocol the compiler uses: text -> token ids + character offsets.

The compiler never asks a tokenizer to add special tokens: it inserts [CLS]/[SEP] and global
tokens itself, so every adapter encodes the bare text. Offsets are ``[start, end)`` character
(not byte) positions into the text that was passed in, which is how graph spans, also in
characters, find their long positions (`spans_to_token_ranges`).

Document text is plain text, whatever it spells (`plain_text`):

* Special tokens come only from the compiler. A literal ``[SEP]``, ``[CLS]``, ``[MASK]`` or
  ``[PAD]`` in a document is encoded as the characters it is made of (the HF adapter sets
  `tokenizers`' ``encode_special_tokens``, which stops added special tokens from being matched in
  the text), and a piece of text that a vocabulary still maps to a special token's id (a
  word-level vocabulary holding ``[SEP]`` as a word) reads as the unk token. So a document
  cannot forge separators, masks or padding.
* A lone surrogate (``"\\ud800"``, which JSON allows but Unicode text cannot hold) is encoded as
  U+FFFD, one character for one, so offsets still index the graph's text. The compiled
  instance's ``texts`` hold the same replacement (UTF-8 writers such as Parquet refuse surrogates).

Adapters:

* `HFTokenizer` wraps a Hugging Face `tokenizers.Tokenizer` (a ``tokenizer.json``).
* `SpacyWordTokenizer` (in `words.py`) is word level, on a spaCy tokenizer (``spacy.blank(lang)`` by
  default).

`load_tokenizer` (in `load.py`) turns whatever a user names (a path, ``"spacy:en"``, an object) into
one of them.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from graphattn.errors import TokenizerError

WORDPIECE_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# The global tokens ETC (and the shipped schemas) name, BERT's [unused0]..[unused4] (ids 1..5 in
# BERT's vocabulary): sentence globals [unused0], candidates [unused3], paragraphs [unused4].
# `train_wordpiece` reserves them, so that a schema naming them resolves in a trained vocabulary.
RESERVED_GLOBAL_TOKENS = tuple(f"[unused{i}]" for i in range(5))

# Names the usual vocabularies give their special tokens (BERT first, then RoBERTa/XLNet style).
_SPECIAL_TOKEN_CANDIDATES = {
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"),
    "pad": ("[PAD]", "<pad>"),
    "mask": ("[MASK]", "<mask>"),
    "unk": ("[UNK]", "<unk>"),
}


# What one character says about where tokens start (`HFTokenizer.char_classes`), so that the
# compiler can tell which nodes past a cut hold tokens without tokenizing there (`compile.encode`):
CHAR_SPACE = 0  # never starts a token; the next word character starts one (a pre-token boundary)
CHAR_REMOVED = 1  # never starts a token and joins its neighbours (the normalizer drops it: U+200B, U+FFFD)
CHAR_WORD = 2  # starts a token when it starts a pre-token (after a space or an alone character)
CHAR_ALONE = 3  # a pre-token of its own (BERT's punctuation, CJK): starts a token, ends its pre-token
CHAR_UNKNOWN = 4  # may start a token or not, and says nothing of its neighbours
_UNCLASSIFIED = 255

# str.isspace by code point, as one lookup: every space character is below U+3001 (the last slot,
# False, stands for all code points above).
IS_WHITESPACE = np.array([chr(c).isspace() for c in range(0x3002)], dtype=bool)
IS_WHITESPACE[-1] = False


class Encoding:
    """One encoded text: `ids` int32 [n], `offsets` int32 [n, 2] char [start, end), `tokens`.

    `tokens` may be given as a function that makes the list when first read: the compiler never
    reads it, and making it costs a tenth of the encoding.
    """

    __slots__ = ("ids", "offsets", "_tokens")

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, tokens: list[str] | Callable[[], list[str]]):
        self.ids, self.offsets, self._tokens = ids, offsets, tokens

    @classmethod
    def empty(cls) -> Encoding:
        return cls(np.zeros(0, np.int32), np.zeros((0, 2), np.int32), [])

    def shifted(self, chars: int) -> Encoding:
        """The same tokens with offsets `chars` further on: the encoding of a piece of a text."""
        return Encoding(self.ids, self.offsets + np.int32(chars), lambda: self.tokens)

    @staticmethod
    def concatenate(parts: Sequence[Encoding]) -> Encoding:
        """The tokens of consecutive pieces of one text as one encoding."""
        ids = np.concatenate([part.ids for part in parts])
        offsets = np.concatenate([part.offsets for part in parts]).reshape(-1, 2)
        return Encoding(ids, offsets, lambda: [token for part in parts for token in part.tokens])

    @property
    def tokens(self) -> list[str]:
        if callable(self._tokens):
            self._tokens = self._tokens()
        return self._tokens

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __repr__(self) -> str:
        return f"Encoding({len(self)} tokens)"


@runtime_checkable
class Tokenizer(Protocol):
    """What the compiler needs from a tokenizer. Special-token ids are None when absent.

    Optional, for tokenizing only what can be kept (`compile.encode`): `prefix_exact`,
    `suffix_exact` and `char_classes` (see `HFTokenizer`); a tokenizer without them is given
    whole texts."""

    cls_id: int | None
    sep_id: int | None
    pad_id: int | None
    mask_id: int | None
    unk_id: int | None

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> Encoding: ...

    def encode_batch(self, texts: Sequence[str]) -> list[Encoding]: ...

    def token_to_id(self, token: str) -> int | None: ...

    def id_to_token(self, token_id: int) -> str: ...


def find_special_ids(token_to_id, overrides: dict[str, str | None], source: str | None = None) -> dict[str, int | None]:
    """Look special tokens up by the conventional names unless the caller named them."""
    found: dict[str, int | None] = {}
    for role, candidates in _SPECIAL_TOKEN_CANDIDATES.items():
        named = overrides.get(role)
        if named is not None:
            token_id = token_to_id(named)
            if token_id is None:
                message = f"{role}_token {named!r} is not in the vocabulary"
                raise TokenizerError(message, file=source, path=(f"{role}_token",))
            found[role] = token_id
            continue
        found[role] = next((i for i in map(token_to_id, candidates) if i is not None), None)
    return found


def special_id_array(ids: Iterable[int | None], unk_id: int | None) -> np.ndarray:
    return np.array(sorted({i for i in ids if i is not None and i != unk_id}), dtype=np.int32)


def _offsets_array(offsets: list[tuple[int, int]]) -> np.ndarray:
    return np.fromiter(itertools.chain.from_iterable(offsets), dtype=np.int32, count=2 * len(offsets)).reshape(-1, 2)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def plain_text(text: Any, *path: str | int) -> str:
    """The text a tokenizer is given: a str, lone surrogates replaced by U+FFFD (same length).

    `path` names the argument in errors (``$.texts[3]: expected a str to tokenize, got bytes``).
    """
    if not isinstance(text, str):
        raise TokenizerError(f"expected a str to tokenize, got {type(text).__name__}", path=path)
    if not text.isascii():
        try:
            text.encode("utf-8")  # refuses a surrogate; 8x faster than searching for one
        except UnicodeEncodeError:
            text = _LONE_SURROGATE.sub("\ufffd", text)
    return text


def without_special_ids(
    ids: np.ndarray, special: np.ndarray, unk_id: int | None, text: str, offsets: np.ndarray, source: str | None
) -> np.ndarray:
    """Text pieces that a vocabulary maps to a special token's id read as unk (see module docstring)."""
    forged = np.isin(ids, special)
    if not forged.any():
        return ids
    if unk_id is None:
        at = int(offsets[int(np.argmax(forged)), 0])
        raise TokenizerError(
            f"the text at character {at} ({text[at : at + 12]!r}) "
            "encodes to a special token's id and the vocabulary has "
            "no unk token to read it as plain text instead",
            file=source,
            path=("text",),
        )
    return np.where(forged, np.int32(unk_id), ids).astype(np.int32)


class HFTokenizer:
    """A Hugging Face `tokenizers.Tokenizer`, encoding bare text with character offsets.

    The wrapped tokenizer is a private copy with truncation and padding switched off (a
    ``tokenizer.json`` saved for training often has them on, and the compiler truncates by
    graph structure, not by cutting text). Its post-processor is kept but not applied.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        source: str | None = None,
        cls_token: str | None = None,
        sep_token: str | None = None,
        pad_token: str | None = None,
        mask_token: str | None = None,
        unk_token: str | None = None,
    ):
        from tokenizers import Tokenizer as RawTokenizer

        if not isinstance(tokenizer, RawTokenizer):
            raise TokenizerError(
                f"HFTokenizer wraps a tokenizers.Tokenizer, got {type(tokenizer).__name__}", file=source
            )
        try:
            tokenizer = RawTokenizer.from_str(tokenizer.to_str())
        except Exception:  # custom (unserializable) components: use the object itself
            pass
        tokenizer.no_truncation()
        tokenizer.no_padding()
        tokenizer.encode_special_tokens = True  # "[SEP]" in a document is text, not the separator
        self.tokenizer = tokenizer
        self.source = source
        self._prefix_exact: bool | None = None
        self._suffix_exact: bool | None = None
        self._char_table: np.ndarray | None = None  # `char_classes` by code point, filled as met
        model_unk = getattr(tokenizer.model, "unk_token", None)
        overrides = {
            "cls": cls_token,
            "sep": sep_token,
            "pad": pad_token,
            "mask": mask_token,
            "unk": unk_token or model_unk,
        }
        special = find_special_ids(tokenizer.token_to_id, overrides, source)
        self.cls_id, self.sep_id, self.pad_id = special["cls"], special["sep"], special["pad"]
        self.mask_id, self.unk_id = special["mask"], special["unk"]
        added = [i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special]
        roles = [self.cls_id, self.sep_id, self.pad_id, self.mask_id]
        self._special_ids = special_id_array([*added, *roles], self.unk_id)

    @classmethod
    def from_file(cls, path: str | os.PathLike, **special_tokens: str) -> HFTokenizer:
        """A tokenizer.json, a Hugging Face model directory or ``"default"`` (see `graphattn.tokenize.files`)."""
        from graphattn.tokenize.files import raw_tokenizer

        raw, source = raw_tokenizer(path)
        return cls(raw, source=source, **special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def prefix_exact(self) -> bool:
        """Whether the tokens of ``text[:p]``, p a space after a non-space, are exactly the whole
        text's tokens that start before p: the normalizer works per character, the pre-tokenizer
        splits at spaces, and no added token holds a space. The compiler may then stop
        tokenizing a long text once nothing more of it can be kept (`compile.encode`)."""
        if self._prefix_exact is None:
            self._prefix_exact = _prefix_exact(json.loads(self.tokenizer.to_str()))
        return self._prefix_exact

    @property
    def suffix_exact(self) -> bool:
        """Whether ``text[p:q]`` (p, q cuts as for `prefix_exact`) gives the whole text's tokens
        that start in [p, q), offsets less p: also no normalizer that acts at the ends of the
        text it is given (Strip, Prepend). A prefix may then grow by tokenizing only what it adds."""
        if self._suffix_exact is None:
            normalizers = _components(json.loads(self.tokenizer.to_str()).get("normalizer"))
            self._suffix_exact = self.prefix_exact and not any(n.get("type") in _END_NORMALIZERS for n in normalizers)
        return self._suffix_exact

    def char_classes(self, points: np.ndarray) -> np.ndarray:
        """uint8 per code point in `points`: what the character says about where tokens start
        (``CHAR_*``), from this tokenizer's own normalizer and pre-tokenizer run on ``x{c}x`` and
        ``x{c}{c}x`` once per code point first met (after that, one table lookup). Only for a
        pre-tokenizer that splits at spaces and drops them, whose choices then depend on each
        character alone; any other gets `CHAR_UNKNOWN` throughout."""
        if self._char_table is None:
            self._char_table = np.full(0x110000, _UNCLASSIFIED, dtype=np.uint8)
        classes = np.take(self._char_table, points)
        fresh = classes == _UNCLASSIFIED
        if fresh.any():
            new = np.unique(points[fresh])
            self._char_table[new] = self._classify(new.tolist())
            classes[fresh] = self._char_table[points[fresh]]
        return classes

    def _classify(self, points: list[int]) -> np.ndarray:
        from tokenizers import PreTokenizedString

        normalizer, pre_tokenizer = self.tokenizer.normalizer, self.tokenizer.pre_tokenizer

        def splits(text: str) -> list[tuple[str, tuple[int, int]]]:
            pieces = PreTokenizedString(text)
            if normalizer is not None:
                pieces.normalize(normalizer.normalize)
            if pre_tokenizer is not None:
                pre_tokenizer.pre_tokenize(pieces)
            return [(t, o) for t, o, _ in pieces.get_splits(offset_referential="original", offset_type="char")]

        model = self.tokenizer.model
        # models that give every pre-token a first token at its first character (a BPE without an
        # unk token or byte fallback drops the characters it does not know)
        whole = type(model).__name__ in ("WordPiece", "WordLevel", "Unigram") or bool(
            getattr(model, "unk_token", None) or getattr(model, "byte_fallback", False)
        )
        # a non-special added token is matched before the pre-tokenizer, anywhere but across a space
        plain = not any(not t.special for t in self.tokenizer.get_added_tokens_decoder().values())
        out = np.full(len(points), CHAR_UNKNOWN, dtype=np.uint8)
        if [o for _, o in splits("x x")] != [(0, 1), (2, 3)]:
            return out  # spaces stay in the tokens (byte-level BPE, Metaspace): nothing is certain
        for k, point in enumerate(points):
            c = chr(point)
            one, two = splits(f"x{c}x"), splits(f"x{c}{c}x")
            shape = [o for _, o in one], [o for _, o in two]
            if shape == ([(0, 1), (2, 3)], [(0, 1), (3, 4)]):
                out[k] = CHAR_SPACE
            elif not plain:
                continue
            elif shape == ([(0, 3)], [(0, 4)]) and len(one[0][0]) == len(two[0][0]) == 2:
                out[k] = CHAR_REMOVED
            elif whole and shape == ([(0, 3)], [(0, 4)]):
                out[k] = CHAR_WORD
            elif whole and shape == ([(0, 1), (1, 2), (2, 3)], [(0, 1), (1, 2), (2, 3), (3, 4)]):
                out[k] = CHAR_ALONE
        return out

    def _wrap(self, encoding: Any, text: str) -> Encoding:
        offsets = _offsets_array(encoding.offsets)
        ids = encoding.ids
        ids = np.fromiter(ids, dtype=np.int32, count=len(ids))
        ids = without_special_ids(ids, self._special_ids, self.unk_id, text, offsets, self.source)
        return Encoding(ids, offsets, lambda: encoding.tokens)

    def encode(self, text: str) -> Encoding:
        text = plain_text(text, "text")
        return self._wrap(self.tokenizer.encode(text, add_special_tokens=False), text)

    def encode_batch(self, texts: Sequence[str]) -> list[Encoding]:
        """Encode many texts on the library's parallel batch path (much faster than a loop)."""
        texts = [plain_text(t, "texts", i) for i, t in enumerate(texts)]
        return [self._wrap(e, t) for e, t in zip(self.tokenizer.encode_batch(texts, add_special_tokens=False), texts)]

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        token = self.tokenizer.id_to_token(int(token_id))
        if token is None:
            raise TokenizerError(
                f"token id {token_id} is outside the vocabulary of {self.vocab_size}", file=self.source
            )
        return token

    def save(self, path: str | os.PathLike) -> None:
        self.tokenizer.save(str(path))

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size}, source={self.source!r})"


_LOCAL_NORMALIZERS = {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents", "Strip", "Prepend"}
_SPACE_SPLITTERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
_SPLITTERS = _SPACE_SPLITTERS | {"Punctuation", "Digits", "UnicodeScripts", "ByteLevel", "Metaspace"}


_END_NORMALIZERS = {"Strip", "Prepend"}  # act at the ends of the text they are given, not per character


def _components(component: dict | None) -> list[dict]:
    """A tokenizer.json component, or the members of a Sequence (nested ones flattened)."""
    if component is None:
        return []
    if component.get("type") != "Sequence":
        return [component]
    members = component.get("normalizers", component.get("pretokenizers", [])) or []
    return [part for member in members for part in _components(member)]


def _prefix_exact(config: dict) -> bool:
    """`HFTokenizer.prefix_exact` from a tokenizer.json: see there."""
    normalizers = _components(config.get("normalizer"))
    pre_tokenizers = _components(config.get("pre_tokenizer"))
    if any(n.get("type") not in _LOCAL_NORMALIZERS for n in normalizers):
        return False
    if any(p.get("type") not in _SPLITTERS for p in pre_tokenizers):
        return False
    splits_at_spaces = any(
        p.get("type") in _SPACE_SPLITTERS
        or (p.get("type") == "ByteLevel" and p.get("use_regex", True))
        or (p.get("type") == "Metaspace" and p.get("split", True))
        for p in pre_tokenizers
    )
    no_spaced_added = not any(any(c.isspace() for c in t.get("content", "")) for t in config.get("added_tokens") or [])
    return splits_at_spaces and no_spaced_added


def read_vocab_file(path: Path) -> list[str]:
    if not path.is_file():
        raise TokenizerError("vocabulary file does not exist (expected one token per line)", file=str(path))
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise TokenizerError(
            f"vocabulary file is not UTF-8 ({exc.reason} at byte {exc.start})", file=str(path)
        ) from None
    return [line for line in (raw.strip() for raw in lines) if line]


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int = 3000,
    special_tokens: Sequence[str] = (*WORDPIECE_SPECIAL_TOKENS, *RESERVED_GLOBAL_TOKENS),
    *,
    min_frequency: int = 1,
    lowercase: bool = True,
) -> HFTokenizer:
    """Train a BERT-style WordPiece tokenizer in memory (no download), for tests and examples.

    BERT's normalizer (lowercasing, accent stripping) and pre-tokenizer, ``##`` continuation
    prefix, and a ``[CLS] $A [SEP]`` post-processor so the saved file works elsewhere too. The
    special tokens come first (ids 0..), the global tokens schemas name (`RESERVED_GLOBAL_TOKENS`)
    among them, so that no global shares a word's or [UNK]'s embedding.
    """
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    if vocab_size <= len(special_tokens):
        raise TokenizerError(f"vocab_size must exceed the {len(special_tokens)} special tokens, got {vocab_size}")
    unk = next((t for t in special_tokens if t in _SPECIAL_TOKEN_CANDIDATES["unk"]), None)
    if unk is None:
        raise TokenizerError(f"special_tokens must include an unk token ([UNK] or <unk>), got {list(special_tokens)}")
    raw = RawTokenizer(models.WordPiece(unk_token=unk, continuing_subword_prefix="##"))
    raw.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase or None)
    raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    raw.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    raw.train_from_iterator(texts, trainer)
    cls_token = next((t for t in special_tokens if t in _SPECIAL_TOKEN_CANDIDATES["cls"]), None)
    sep_token = next((t for t in special_tokens if t in _SPECIAL_TOKEN_CANDIDATES["sep"]), None)
    if cls_token and sep_token:
        cls_id, sep_id = raw.token_to_id(cls_token), raw.token_to_id(sep_token)
        raw.post_processor = processors.TemplateProcessing(
            single=f"{cls_token} $A {sep_token}",
            pair=f"{cls_token} $A {sep_token} $B:1 {sep_token}:1",
            special_tokens=[(cls_token, cls_id), (sep_token, sep_id)],
        )
    return HFTokenizer(raw)


def spans_to_token_ranges(offsets: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Token ranges ``[first, last + 1)`` for char spans ``[start, end)``, int32 [m, 2].

    Rule: a token belongs to the span that contains its FIRST character, i.e. token t is in span
    ``[s, e)`` iff ``s <= offsets[t, 0] < e``. So a token cut by a span boundary goes wholly to
    the span where it starts; a span lying inside one token (or covering no token start) gets an
    empty range ``[a, a)`` at the position where it would be; an empty span ``[s, s)`` is always
    empty. Zero-width tokens (e.g. an [UNK] with offsets ``(s, s)``) follow the same rule by
    their start. Token starts must not decrease (tokens in text order), which is what makes
    this one `np.searchsorted` per span end.
    """
    offsets = np.asarray(offsets)
    spans = np.asarray(spans)
    if offsets.ndim != 2 or offsets.shape[1] != 2:
        raise TokenizerError(f"offsets must have shape [n, 2], got {list(offsets.shape)}", path=("offsets",))
    if spans.ndim != 2 or spans.shape[1] != 2:
        raise TokenizerError(f"spans must have shape [m, 2], got {list(spans.shape)}", path=("spans",))
    starts = offsets[:, 0]
    if starts.shape[0] > 1 and np.any(starts[1:] < starts[:-1]):
        bad = int(np.argmax(starts[1:] < starts[:-1])) + 1
        message = (
            f"token offsets are not in text order: token {bad} starts at {int(starts[bad])}, before token {bad - 1}"
        )
        raise TokenizerError(message, path=("offsets", bad))
    backwards = spans[:, 1] < spans[:, 0]
    if np.any(backwards):
        bad = int(np.argmax(backwards))
        raise TokenizerError(f"span {bad} ends before it starts: {spans[bad].tolist()}", path=("spans", bad))
    ranges = np.searchsorted(starts, spans.reshape(-1), side="left").astype(np.int32)
    return ranges.reshape(-1, 2)
