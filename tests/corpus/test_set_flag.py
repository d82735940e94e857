"""`graphattn compile --set KEY=VALUE` (issue 39 item 5): a schema value from the command line
changes what is compiled, is recorded as the effective schema in the shard footers and run.json,
and a bad key or value is one line naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import run_main as _run

from graphattn.errors import SchemaError
from graphattn.schema import load_effective_schema, load_schema
from graphattn.shards.dataset import ShardDataset
from graphattn.shards.reader import read_info, shard_paths
from graphattn.tokenize import load_tokenizer
from graphattn.train.finetune import schema_from_text

TEXT = "The cat sat on the mat and looked at the long grey wall for a while.\n\nA dog ran far away. The end.\n"


@pytest.fixture(scope="module")
def doc(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("set") / "doc.txt"
    path.write_text(TEXT)
    return path


def _compile(capsys, doc: Path, out: Path, *sets: str) -> Path:
    argv = ["compile", doc, "--schema", "etc-sentences", "--out", out, "-q"]
    code, _, err = _run(capsys, [*argv, *(w for s in sets for w in ("--set", s))])
    assert code == 0, err
    return out


def test_set_changes_the_compiled_relative_labels(capsys, doc, tmp_path):
    clipped = {}
    for k in (3, 4):
        out = _compile(capsys, doc, tmp_path / f"k{k}", f"relative_pos_max_distance={k}")
        instance = ShardDataset(out, compact=False)[0]
        labels = instance.side.l2l_relative_att_ids[instance.side.l2l_att_mask.astype(bool)]
        clipped[k] = int(labels.max())
        assert instance.label_vocab.max_distance == k
        assert labels.max() == 2 * k  # left distances run k+1..2k, farther ones clipped at k
    assert clipped == {3: 6, 4: 8}
    plain = ShardDataset(_compile(capsys, doc, tmp_path / "plain"), compact=False)[0]
    assert plain.label_vocab.max_distance == 12


def test_the_footer_and_run_json_record_the_effective_schema(capsys, doc, tmp_path):
    out = _compile(capsys, doc, tmp_path / "o", "relative_pos_max_distance=3", "masks.hard_l2g=true")
    text = read_info(shard_paths([out])[0]).schema_text
    recorded = schema_from_text(text, "footer")
    assert recorded.relative_pos_max_distance == 3 and recorded.masks.hard_l2g and recorded.local_radius == 84
    assert (
        text.startswith("# ") and "--set relative_pos_max_distance=3 --set masks.hard_l2g=true" in text.splitlines()[0]
    )
    run = json.loads((out / "run.json").read_text())
    plain = json.loads((_compile(capsys, doc, tmp_path / "p") / "run.json").read_text())
    assert run["settings"]["schema_sha256"] != plain["settings"]["schema_sha256"]
    # nothing overridden: the footer holds the file as written, comments included
    assert read_info(shard_paths([tmp_path / "p"])[0]).schema_text == load_effective_schema("etc-sentences")[1]
    assert "# ETC pre-training layout" in read_info(shard_paths([tmp_path / "p"])[0]).schema_text


def test_set_names_a_special_token(capsys, doc, tmp_path):
    out = _compile(capsys, doc, tmp_path / "o", "special_tokens.global=[unused2]")  # YAML's list syntax: the text
    tokenizer = load_tokenizer("default")
    assert set(ShardDataset(out)[0].global_token_ids.tolist()) == {tokenizer.token_to_id("[unused2]")}
    settings = json.loads((out / "run.json").read_text())["settings"]  # the footer's settings too
    assert settings["special_token_ids"] == {"special_tokens.global": tokenizer.token_to_id("[unused2]")}
    assert read_info(shard_paths([out])[0]).settings["special_token_ids"] == settings["special_token_ids"]


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (["relative_pos_max_distanc=3"], "--set relative_pos_max_distanc=3: unknown key 'relative_pos_max_distanc' "),
        (["relative_pos_max_distance=three"], "--set relative_pos_max_distance=three: expected integer, got string"),
        (["local_radius=0"], "--set local_radius=0: must be >= 1, got 0"),
        (["relative_pos_max_distance"], "--set relative_pos_max_distance: expected KEY=VALUE"),
        (["masks.hard_g2l.x=1"], "--set masks.hard_g2l.x: masks.hard_g2l holds a bool, not a section"),
        (["node_types..x=1"], "is not a schema key"),
        (["relative_pos_max_distance=42"], "relative_vocab_size 32 is too small"),
        (["special_tokens.global=[nope]"], "$.special_tokens.global: token '[nope]' is not in the tokenizer's"),
    ],
)
def test_a_bad_set_is_one_line_naming_the_flag(capsys, doc, tmp_path, sets, says):
    argv = ["compile", doc, "--schema", "etc-sentences", "--out", tmp_path / "o"]
    code, out, err = _run(capsys, [*argv, *(w for s in sets for w in ("--set", s))])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert says in err, err
    if "token '[nope]'" not in says:
        assert err.startswith(f"graphattn compile: error: --set {sets[0].split('=')[0]}"), err
    assert not (tmp_path / "o" / "run.json").exists()


def test_the_error_names_every_set_when_the_whole_does_not_add_up():
    with pytest.raises(SchemaError) as info:
        load_effective_schema("etc-sentences", ["relative_pos_max_distance=42", "local_radius=10"])
    message = str(info.value)
    assert message.startswith("--set relative_pos_max_distance=42 --set local_radius=10: relative_vocab_size 32")
    assert "(at $.relative_vocab_size of " in message
    fixed = load_schema("etc-sentences", ["relative_pos_max_distance=42", "relative_vocab_size=87"])
    assert fixed.relative_pos_max_distance == 42 and len(fixed.label_vocab()) == 87
