"""Relation-schema files: loading, typed result, and errors that name file, line and key path."""

import json
import textwrap

import jsonschema
import pytest

from graphattn.errors import SchemaError
from graphattn.schema import JSON_SCHEMA_PATH, NodeType, Schema, load_schema, shipped_schemas

MINIMAL = """\
name: mini
special_tokens: {global: 1}
node_types:
  sentence: {global: node, long: true}
"""


def write(tmp_path, text: str, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_the_json_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(json.loads(JSON_SCHEMA_PATH.read_text()))


@pytest.mark.parametrize("path", list(shipped_schemas()), ids=lambda p: p.name)
def test_every_shipped_schema_loads(path):
    schema = load_schema(path)
    assert isinstance(schema, Schema) and schema.source == str(path)
    assert len(schema.label_vocab()) <= schema.relative_vocab_size


def test_shipped_schema_by_name_and_typed_result():
    schema = load_schema("etc-sentences")
    assert schema.name == "etc-sentences"
    assert schema.masks.hard_g2l and not schema.masks.hard_l2g
    assert isinstance(schema.node_types["sentence"], NodeType)
    assert schema.node_types["sentence"].global_mode == "node" and schema.node_types["sentence"].long
    assert schema.global_order == (("sentence",),)
    assert schema.hierarchy_relations == ("contains",)
    assert schema.label_vocab().names[-2:] == ["does_not_belong", "belongs"]


def test_yaml_json_and_dict_give_the_same_schema(tmp_path):
    raw = {
        "name": "same",
        "special_tokens": {"global": "[unused0]"},
        "node_types": {
            "q": {"global": "per_token", "long": True, "ignore_hard_masks": True},
            "s": {"global": "node", "long": True},
        },
        "relations": {"contains": {"hierarchy": True}, "mention": {"link": "l2g", "label": "mention_of"}},
        "global_order": ["q", "s"],
    }
    a = load_schema(raw)
    b = load_schema(write(tmp_path, json.dumps(raw, indent=2), "s.json"))
    import yaml

    c = load_schema(write(tmp_path, yaml.safe_dump(raw), "s.yaml"))
    assert a == b == c
    assert a.node_types["q"].ignore_hard_g2l and a.node_types["q"].ignore_hard_l2g
    assert a.labels == ["mention_of"]
    assert a.label_vocab().id("mention_of") == 2 * 12 + 3


BAD = [
    # (file text, expected message part, line, key path)
    (
        MINIMAL.replace("global: node", "golbal: node"),
        "unknown key 'golbal' (did you mean 'global'?)",
        4,
        "$.node_types.sentence.golbal",
    ),
    (MINIMAL + "local_radus: 3\n", "unknown key 'local_radus' (did you mean 'local_radius'?)", 5, "$.local_radus"),
    (
        MINIMAL.replace("global: node", "global: nodes"),
        "expected one of 'none', 'node', 'per_token', got 'nodes'",
        4,
        "$.node_types.sentence.global",
    ),
    (MINIMAL + "local_radius: 0\n", "must be >= 1, got 0", 5, "$.local_radius"),
    (MINIMAL + "max_long_length: -5\n", "must be >= 1, got -5", 5, "$.max_long_length"),
    (MINIMAL + "max_global_length: 0\n", "must be >= 1, got 0", 5, "$.max_global_length"),
    (MINIMAL + "relative_pos_max_distance: 0\n", "must be >= 1, got 0", 5, "$.relative_pos_max_distance"),
    (MINIMAL + "max_long_length: many\n", "expected integer, got string 'many'", 5, "$.max_long_length"),
    (MINIMAL + "local_radius: 2.5\n", "expected integer, got number 2.5", 5, "$.local_radius"),
    (
        MINIMAL.replace("long: true", "long: yes please"),
        "expected boolean, got string 'yes please'",
        4,
        "$.node_types.sentence.long",
    ),
    (MINIMAL + "fixed_blocks: {tokens_per_block: 0}\n", "must be >= 1, got 0", 5, "$.fixed_blocks.tokens_per_block"),
    (
        MINIMAL.replace("global: 1}", "global: [1]}"),
        "expected string or integer, got array [1]",
        2,
        "$.special_tokens.global",
    ),
    (
        MINIMAL.replace("{global: node, long: true}", "{global: node, type_id: -1}"),
        "must be >= 0, got -1",
        4,
        "$.node_types.sentence.type_id",
    ),
    ("local_radius: 3\n", "missing required key: 'name'", 1, "$.name"),
    (
        MINIMAL + "fixed_blocks: {name: b}\n",
        "missing required key: 'tokens_per_block'",
        5,
        "$.fixed_blocks.tokens_per_block",
    ),
    (MINIMAL + "local_radius: 3\nlocal_radius: 4\n", "duplicate key 'local_radius' (first on line 5)", 6, None),
    (
        MINIMAL + "global_order: [sentense]\n",
        "unknown global node type 'sentense' (did you mean 'sentence'?)",
        5,
        "$.global_order[0]",
    ),
    (MINIMAL + "global_order: [sentence, sentence]\n", "'sentence' is listed twice", 5, "$.global_order[1]"),
    (
        MINIMAL + "  q: {global: node}\nglobal_order: [sentence]\n",
        "global types missing from global_order: q",
        6,
        "$.global_order",
    ),
    (MINIMAL + "relations: {m: {label: mention}}\n", "a label needs `link", 5, "$.relations.m.label"),
    (MINIMAL + "relations: {m: {link: g2g}}\n", "a g2g link needs a `label`", 5, "$.relations.m.link"),
    (
        MINIMAL + "relations: {m: {link: l2g, reverse_label: x}}\n",
        "reverse_label applies to g2g links only",
        5,
        "$.relations.m.reverse_label",
    ),
    (
        MINIMAL + "relations: {c: {hierarchy: true, link: l2g}}\n",
        "a hierarchy relation already lowers",
        5,
        "$.relations.c.link",
    ),
    (
        MINIMAL + "relations: {m: {link: l2g, label: belongs}}\n",
        "label 'belongs' clashes with a built-in label",
        5,
        "$.relations.m.label",
    ),
    (MINIMAL + "relative_vocab_size: 26\n", "relative_vocab_size 26 is too small", 5, "$.relative_vocab_size"),
    (MINIMAL + "long_prefix: [clss]\n", "unknown special token 'clss' (did you mean 'cls'?)", 5, "$.long_prefix[0]"),
    (MINIMAL + "truncation: {policy: drop_longest_first}\n", "drop_longest_first needs `unit`", 5, "$.truncation"),
    (
        MINIMAL + "truncation: {policy: drop_longest_first, unit: sentenc}\n",
        "unknown node type 'sentenc'",
        5,
        "$.truncation.unit",
    ),
    (MINIMAL + "truncation: {policy: windows}\n", "windows needs `stride`", 5, "$.truncation"),
    (
        MINIMAL + "truncation: {policy: tail, stride: 5}\n",
        "`stride` applies to policy windows only",
        5,
        "$.truncation.stride",
    ),
    (
        MINIMAL + "truncation: {policy: windows, stride: 9000}\n",
        "stride is longer than max_long_length",
        5,
        "$.truncation.stride",
    ),
    (
        MINIMAL + "truncation: {policy: trim}\n",
        "expected one of 'tail', 'drop_longest_first', 'windows', 'error', got 'trim'",
        5,
        "$.truncation.policy",
    ),
    (MINIMAL + "segments: {block_g2g: true}\n", "no node type has `segment: true`", 5, "$.segments"),
    (
        MINIMAL + "  p: {segment: true}\nsegments: {block_g2g: [sentense]}\n",
        "unknown global node type 'sentense'",
        6,
        "$.segments.block_g2g[0]",
    ),
    (
        MINIMAL + "fixed_blocks: {tokens_per_block: 4, name: sentence}\n",
        "clashes with a declared node type",
        5,
        "$.fixed_blocks.name",
    ),
    (
        MINIMAL + "  p: {where: {block: true}}\n",
        "`where` selects which nodes become globals",
        5,
        "$.node_types.p.where",
    ),
    (
        MINIMAL + "  q: {global: per_token, global_token: x}\n",
        "per_token globals use their wordpiece ids",
        5,
        "$.node_types.q.global_token",
    ),
    (MINIMAL.replace("special_tokens: {global: 1}\n", ""), "need special_tokens.global", 1, None),
    ("name: x\nnode_types: [a, b]\n", "expected object, got array", 2, "$.node_types"),
    ("- just\n- a list\n", "must be a mapping at the top level", 1, None),
    ("name: x\nnode_types: {a: {global: node\n", "not valid YAML/JSON", 3, None),
]


@pytest.mark.parametrize("text, message, line, path", BAD, ids=[b[1][:40] for b in BAD])
def test_bad_schema_files_name_file_line_and_key_path(tmp_path, text, message, line, path):
    file = write(tmp_path, text)
    with pytest.raises(SchemaError) as err:
        load_schema(file)
    text = str(err.value)
    assert message in text
    assert text.startswith(f"{file}:{line}: "), text
    if path is not None:
        assert f": {path}: " in text or text.endswith(path), text
    assert err.value.location.line == line


def test_bad_json_file_reports_its_line(tmp_path):
    file = write(tmp_path, '{"name": "x",\n "local_radius": 0}\n', "s.json")
    with pytest.raises(SchemaError, match=r"s\.json:2: \$\.local_radius: must be >= 1"):
        load_schema(file)
    file = write(tmp_path, '{"name": "x",\n "local_radius": }\n', "t.json")
    with pytest.raises(SchemaError, match=r"t\.json:2: not valid JSON"):
        load_schema(file)


def test_several_problems_report_the_first_and_count_the_rest(tmp_path):
    file = write(tmp_path, MINIMAL + "local_radius: 0\nmax_long_length: 0\n")
    with pytest.raises(SchemaError, match=r":5: \$\.local_radius: must be >= 1, got 0 \(and 1 more problem\(s\)\)"):
        load_schema(file)


def test_missing_file_and_wrong_argument():
    with pytest.raises(SchemaError, match="schema file does not exist"):
        load_schema("/nonexistent/schema.yaml")
    with pytest.raises(SchemaError, match="takes a path or a dict"):
        load_schema(42)


def test_dict_schemas_report_key_paths_without_a_file():
    with pytest.raises(SchemaError, match=r"^\$\.node_types\.s\.global: expected one of"):
        load_schema({"name": "x", "node_types": {"s": {"global": "all"}}})


def test_defaults_match_etc_base():
    schema = load_schema(
        {"name": "d", "special_tokens": {"global": 1}, "node_types": {"s": {"global": "node", "long": True}}}
    )
    assert (schema.local_radius, schema.relative_pos_max_distance, schema.relative_vocab_size) == (84, 12, 32)
    assert (schema.max_long_length, schema.max_global_length) == (4096, 256)
    assert schema.truncation.policy == "tail" and schema.max_documents == 1
    assert schema.special_tokens["cls"] == "[CLS]" and schema.special_tokens["sep"] == "[SEP]"
