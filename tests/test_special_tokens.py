"""Special and global tokens named by their text (issue 39 item 4): a schema's names resolve in the
tokenizer at compile time; a name it lacks, or unk / padding by name, is refused naming the schema
key; unk (named or by id), a padding id or an ordinary word is warned about in one line; the shipped
schemas name BERT's [unused0]/[unused3]/[unused4] (its ids 1/4/5) and compile with a tokenizer that
`graphattn tokenizer train` made (which reserves them)."""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from graphattn import compile_instance
from graphattn.compile.tokens import SpecialTokenWarning, resolve_tokens
from graphattn.errors import CompileError
from graphattn.graph import DocGraph
from graphattn.schema import load_schema, shipped_schemas
from graphattn.tokenize import RESERVED_GLOBAL_TOKENS, WORDPIECE_SPECIAL_TOKENS, load_tokenizer

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "examples" / "data"
# What the shipped schemas said before they named their tokens: ETC's ids in BERT's vocabulary.
BERT_IDS = {
    "special_tokens.global": 1,
    "node_types.paragraph.global_token": 5,
    "node_types.candidate.global_token": 4,
    "node_types.document.global_token": 5,
}


@pytest.fixture(scope="module")
def bert_vocab(tmp_path_factory) -> Path:
    """A BERT-style vocab.txt: [PAD], [unused0..98], [UNK], [CLS], [SEP], [MASK], then words (BERT's layout)."""
    words = "the a cat sat on mat dog ran far away end came soon it was sunny day".split()
    folder = tmp_path_factory.mktemp("bert")
    tokens = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, "."]
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in tokens))
    return folder


def _schema(tmp_path: Path, special: str, extra: str = "") -> object:
    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: s\nspecial_tokens:\n  global: {special}\nnode_types:\n  s: {{global: node, long: true}}\n{extra}"
    )
    return load_schema(path)


def _graph() -> DocGraph:
    text = "the cat sat. the dog ran."
    graph = DocGraph(text, doc_id="d")
    graph.add_node("a", "s", span=(0, 12))
    graph.add_node("b", "s", span=(13, 25))
    return graph


def test_names_resolve_to_the_old_bert_ids_in_every_shipped_schema(bert_vocab):
    tokenizer = load_tokenizer(str(bert_vocab))
    checked = 0
    for path in shipped_schemas():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no shipped token is unk, padding or a word
            resolved = resolve_tokens(load_schema(path), tokenizer).resolved
        for key, token_id in resolved.items():
            if key in BERT_IDS:
                assert token_id == BERT_IDS[key], (path.name, key)
                checked += 1
            else:
                assert key.endswith(("[0]", ".sep")) or key.startswith("special_tokens."), key
                assert tokenizer.id_to_token(token_id) in ("[CLS]", "[SEP]"), (path.name, key)
    assert checked >= 10  # global of 7 schemas, 2 paragraph, 2 candidate, 1 document


def test_a_shipped_schema_compiles_with_the_ids_etc_pretrained_with(bert_vocab):
    """hotpotqa on a BERT vocabulary: sentence globals are id 1, paragraph globals id 5, as before."""
    from graphattn.ingest import read_documents

    graph = next(iter(read_documents(DATA / "hotpotqa_sample.json")))
    instance = compile_instance(graph, "hotpotqa", load_tokenizer(str(bert_vocab)))
    kinds = dict(zip(instance.global_node_ids, instance.global_node_types))
    ids = {kinds.get(n): int(i) for n, i in zip(instance.global_node_ids, instance.global_token_ids) if n in kinds}
    assert ids["sentence"] == 1 and ids["paragraph"] == 5 and ids["title"] == 1


def test_every_name_a_shipped_schema_uses_is_reserved_by_the_trainer():
    named = set()
    for path in shipped_schemas():
        schema = load_schema(path)
        named |= {v for v in schema.special_tokens.values() if isinstance(v, str)}
        named |= {t.global_token for t in schema.node_types.values() if isinstance(t.global_token, str)}
    assert named - {"[CLS]", "[SEP]"} and named - {"[CLS]", "[SEP]"} <= set(RESERVED_GLOBAL_TOKENS)
    assert not any(isinstance(v, int) for p in shipped_schemas() for v in load_schema(p).special_tokens.values())


def test_shipped_schemas_compile_with_a_trained_tokenizer_and_no_global_is_unk(tmp_path):
    out = tmp_path / "tokenizer.json"
    trained = subprocess.run(
        ["graphattn", "tokenizer", "train", str(DATA / "corpus.txt"), "--vocab-size", "400", "--out", str(out), "-q"],
        capture_output=True,
        text=True,
    )
    assert trained.returncode == 0, trained.stderr
    tokenizer = load_tokenizer(str(out))
    assert [tokenizer.token_to_id(t) for t in WORDPIECE_SPECIAL_TOKENS + RESERVED_GLOBAL_TOKENS] == list(range(10))
    shards = tmp_path / "shards"
    argv = ["compile", str(DATA / "hotpotqa_sample.json"), "--schema", "hotpotqa", "--tokenizer", str(out)]
    done = subprocess.run(["graphattn", *argv, "--out", str(shards), "-q"], capture_output=True, text=True)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    from graphattn.shards.dataset import ShardDataset

    dataset = ShardDataset(shards)
    for k in range(len(dataset)):
        instance = dataset[k]
        types = np.asarray(instance.global_node_types)
        ids = instance.global_token_ids
        assert tokenizer.unk_id not in ids.tolist()
        for kind, token in (("sentence", "[unused0]"), ("paragraph", "[unused4]"), ("title", "[unused0]")):
            assert set(ids[types == kind].tolist()) == {tokenizer.token_to_id(token)}, kind
    for path in shipped_schemas():  # every shipped schema resolves in the trained tokenizer, without a warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            resolve_tokens(load_schema(path), tokenizer)


def test_the_default_tokenizer_reserves_the_names_too():
    tokenizer = load_tokenizer("default")
    for path in shipped_schemas():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            table = resolve_tokens(load_schema(path), tokenizer)
        assert tokenizer.unk_id not in table.resolved.values(), path.name


def test_a_name_that_is_padding_is_refused_and_unk_warns_naming_the_key(tmp_path):
    where = f"{tmp_path / 's.yaml'}:3: $.special_tokens.global: "
    with pytest.raises(CompileError) as info:
        compile_instance(_graph(), _schema(tmp_path, '"[PAD]"'), load_tokenizer("default"))
    message = str(info.value)
    assert message.startswith(where + "token '[PAD]' (id 0) is the padding token")
    assert "default-tokenizer.json" in message and "\n" not in message
    with pytest.warns(SpecialTokenWarning) as caught:
        instance = compile_instance(_graph(), _schema(tmp_path, '"[UNK]"'), load_tokenizer("default"))
    message = str(next(w for w in caught if issubclass(w.category, SpecialTokenWarning)).message)
    assert message.startswith(where + "token '[UNK]' (id 1) is the unk token") and "\n" not in message
    assert set(instance.global_token_ids.tolist()) == {1}


def test_a_name_the_tokenizer_lacks_is_refused_naming_the_key_and_the_tokenizer(tmp_path, bert_vocab):
    schema = _schema(tmp_path, '"[unused0]"', "  t: {global: node, global_token: '<s>'}\n")
    with pytest.raises(CompileError) as info:
        compile_instance(_graph(), schema, load_tokenizer(str(bert_vocab)))
    message = str(info.value)
    assert "$.node_types.t.global_token: token '<s>' is not in the tokenizer's vocabulary" in message
    assert str(bert_vocab) in message and "--set node_types.t.global_token=" in message


@pytest.mark.parametrize(
    ("special", "says"),
    [
        ("1", "token id 1 ('[UNK]') is the unk token"),
        ("0", "token id 0 ('[PAD]') is the padding token"),
        ('"the"', "token 'the' (id"),
        ("30", "token id 30 ("),
    ],
)
def test_an_id_that_is_unk_padding_or_a_word_warns_in_one_line_naming_the_key(tmp_path, special, says):
    tokenizer = load_tokenizer("default")
    schema = _schema(tmp_path, special)
    with pytest.warns(SpecialTokenWarning) as caught:
        instance = compile_instance(_graph(), schema, tokenizer)
        expected = resolve_tokens(schema, tokenizer).resolved["special_tokens.global"]  # warns again, caught
    first = next(w for w in caught if issubclass(w.category, SpecialTokenWarning))
    message = str(first.message)
    assert message.startswith(f"{tmp_path / 's.yaml'}:3: $.special_tokens.global: ") and says in message
    assert "\n" not in message and "--set special_tokens.global=" in message
    assert set(instance.global_token_ids.tolist()) == {expected}  # warned, and compiled as asked


def test_a_reserved_token_by_id_or_name_is_silent(tmp_path, bert_vocab):
    tokenizer = load_tokenizer(str(bert_vocab))
    for special in ("1", '"[unused0]"', '"[MASK]"'):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compile_instance(_graph(), _schema(tmp_path, special), tokenizer)


def test_compile_says_the_warning_once_in_one_line(tmp_path):
    (tmp_path / "a.txt").write_text("The cat sat. The dog ran.\n\nA bird flew. It sang.\n")
    argv = ["compile", str(tmp_path / "a.txt"), "--schema", "etc-sentences", "--set", "special_tokens.global=1"]
    done = subprocess.run(["graphattn", *argv, "--out", str(tmp_path / "o"), "-q"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("graphattn compile: warning: "), done.stderr
    assert "$.special_tokens.global: token id 1 ('[UNK]') is the unk token" in lines[0]
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["settings"]["tokenizer"] == "default"
