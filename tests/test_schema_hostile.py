"""Schema values without bounds, integral floats, non-string keys and hostile YAML/JSON (issue 15,
items 1-3): every one is a SchemaError naming file, line and key path, found before anything is
built from it. Memory is measured with tracemalloc; nothing here allocates more than a bound needs."""

import json
import re
import textwrap
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphattn.errors import SchemaError
from graphattn.schema import JSON_SCHEMA_PATH, load_schema
from graphattn.schema.io import MAX_DEPTH, MAX_NUMBER_CHARS, MAX_SCHEMA_BYTES, MAX_VALUES

BASE = {"name": "b", "special_tokens": {"global": 1}, "node_types": {"s": {"global": "node", "long": True}}}
MINIMAL = "name: b\nspecial_tokens: {global: 1}\nnode_types:\n  s: {global: node, long: true}\n"


def write(tmp_path, text: str, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    except SchemaError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def _bounded_keys(node=None, path=()):
    """(key path, JSON Schema of the value) of every integer the relation schema admits."""
    node = json.loads(JSON_SCHEMA_PATH.read_text()) if node is None else node
    root = node if not path else None
    defs = (root or {}).get("$defs", {})
    found = []

    def walk(sub, where):
        if "$ref" in sub:
            sub = {**defs[sub["$ref"].split("/")[-1]], **{k: v for k, v in sub.items() if k != "$ref"}}
        if sub.get("type") == "integer":
            found.append((where, sub))
        for branch in sub.get("oneOf", []):
            walk(branch, where)
        for key, value in sub.get("properties", {}).items():
            walk(value, (*where, key))
        if isinstance(sub.get("additionalProperties"), dict):
            walk(sub["additionalProperties"], (*where, "*"))
        if isinstance(sub.get("items"), dict):
            walk(sub["items"], (*where, 0))

    walk(node, ())
    return found


def test_every_integer_key_has_a_documented_maximum():
    keys = _bounded_keys()
    assert len(keys) >= 14
    for where, sub in keys:
        assert "maximum" in sub, where
        assert sub["maximum"] <= 2**31 - 1, where  # every bound fits the int32 arrays the compiler writes


def _with(path: tuple, value) -> dict:
    data = json.loads(json.dumps(BASE))
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return data


ISSUE_EXAMPLES = [  # issue 15 item 1: each was accepted (or built 2e9 names / 45 GiB) before
    (("relative_pos_max_distance",), 1_000_000_000),
    (("local_radius",), 1_000_000_000),
    (("local_radius",), 10_000_000),
    (("node_types", "s", "type_id"), 2**32 + 7),
    (("node_types", "s", "type_id"), 2**31),
    (("node_types", "s", "global_type_id"), 2**31),
    (("fixed_blocks", "type_id"), 2**31),
    (("special_tokens", "global"), 2**31),
    (("max_long_length",), 2**40),
    (("max_global_length",), 2**40),
    (("packing", "max_documents"), 10**12),
    (("relative_vocab_size",), 2**31),
]


@pytest.mark.parametrize("path, value", ISSUE_EXAMPLES, ids=[".".join(p) + f"={v}" for p, v in ISSUE_EXAMPLES])
def test_values_past_their_bound_are_refused_before_anything_is_built(path, value):
    data = _with(path, value)
    if path[0] == "fixed_blocks":
        data["fixed_blocks"]["tokens_per_block"] = 4
    with pytest.raises(SchemaError, match=r"must be <= \d+ \(the documented bound\)") as err:
        load_schema(data)
    assert tuple(err.value.location.path) == path
    assert _peak_bytes(lambda: load_schema(data)) < 2 << 20


INTEGRAL_FLOATS = [  # issue 15 item 2: each passed JSON Schema (3.0 is an integer there) and then raised TypeError
    (("local_radius",), 3.0, lambda s: s.local_radius),
    (("relative_pos_max_distance",), 2.0, lambda s: s.relative_pos_max_distance),
    (("special_tokens", "global"), 1.0, lambda s: s.special_tokens["global"]),
    (("node_types", "s", "global_token"), 4.0, lambda s: s.node_types["s"].global_token),
    (("node_types", "s", "type_id"), 2.0, lambda s: s.node_types["s"].type_id),
    (("max_long_length",), 64.0, lambda s: s.max_long_length),
]


@pytest.mark.parametrize("path, value, read", INTEGRAL_FLOATS, ids=[".".join(f[0]) for f in INTEGRAL_FLOATS])
def test_integral_floats_are_the_integers_they_equal(path, value, read):
    schema = load_schema(_with(path, value))
    assert schema == load_schema(_with(path, int(value)))
    assert type(read(schema)) is int


def test_integral_float_in_fixed_blocks_compiles_as_an_int():
    schema = load_schema({**BASE, "fixed_blocks": {"tokens_per_block": 3.0}})
    assert schema.fixed_blocks.tokens_per_block == 3 and type(schema.fixed_blocks.tokens_per_block) is int


def test_a_fractional_or_infinite_float_stays_a_type_error_with_its_path():
    with pytest.raises(SchemaError, match=r"^\$\.local_radius: expected integer, got number 2\.5"):
        load_schema(_with(("local_radius",), 2.5))
    with pytest.raises(SchemaError, match=r"^\$\.local_radius: expected integer, got number inf"):
        load_schema(_with(("local_radius",), float("inf")))


@pytest.mark.parametrize("key, kind", [("3", "int"), ("true", "bool"), ("~", "null"), ("1.5", "float")])
def test_yaml_keys_that_are_not_strings_are_refused_at_their_line(tmp_path, key, kind):
    file = write(tmp_path, MINIMAL + f"  {key}: {{global: node}}\n")
    with pytest.raises(SchemaError, match=rf"key '{key}' is not a string \(it reads as {kind}\)") as err:
        load_schema(file)
    assert str(err.value).startswith(f"{file}:5: $.node_types: ")
    quoted = load_schema(write(tmp_path, MINIMAL + f"  '{key}': {{global: node}}\n", "q.yaml"))
    assert key in quoted.node_types


def test_dict_keys_that_are_not_strings_are_refused_with_their_path():
    with pytest.raises(SchemaError, match=r"^\$\.node_types\.3: key 3 is not a string"):
        load_schema({**BASE, "node_types": {3: {}}})


def test_the_top_level_of_a_dict_that_contains_itself_is_refused():
    data = dict(BASE)
    data["description"] = [data]
    with pytest.raises(SchemaError, match=f"nested more than {MAX_DEPTH} levels deep"):
        load_schema(data)


BOMB = "lol0: &l0 [a, a, a, a, a, a, a, a, a, a]\n" + "".join(
    f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 10)
)

HOSTILE = [  # (file text, message part, line)
    (MINIMAL + "x:\n" + textwrap.indent(BOMB, "  "), f"holds more than {MAX_VALUES} values", 9),
    (MINIMAL + "x: &a [*a]\n", "alias *a refers to a value that contains it", 5),
    (MINIMAL + "x: &a {y: {z: *a}}\n", "alias *a refers to a value that contains it", 5),
    (MINIMAL + "description: " + "[" * 5000 + "]" * 5000 + "\n", f"nested more than {MAX_DEPTH} levels deep", 5),
    (
        MINIMAL + "x:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(200)) + "  " * 201 + "1\n",
        f"nested more than {MAX_DEPTH} levels deep",
        4 + MAX_DEPTH,
    ),
    (MINIMAL + "local_radius: " + "9" * 5000 + "\n", "a number of 5000 characters is too long", 5),
    (MINIMAL + "local_radius: " + "9" * 30 + "\n", "integer out of range", 5),
    (MINIMAL + "local_radius: !!int abc\n", "cannot read this int value", 5),
    (MINIMAL + "description: 2023-02-30\n", "cannot read this timestamp value", 5),
    (MINIMAL + "description: !!python/object/apply:os.system [ls]\n", "could not determine a constructor", 5),
    (MINIMAL + "description: " + "x" * 70_000 + "\n", "a value of 70000 characters is too long", 5),
    (MINIMAL + "x: *nowhere\n", "found undefined alias", 5),
]


@pytest.mark.parametrize("text, message, line", HOSTILE, ids=[h[1][:30] for h in HOSTILE])
def test_hostile_yaml_is_a_schema_error_with_file_and_line(tmp_path, text, message, line):
    file = write(tmp_path, text)
    with pytest.raises(SchemaError, match=re.escape(message)) as err:
        load_schema(file)
    assert err.value.location.file == str(file) and err.value.location.line == line, str(err.value)
    assert _peak_bytes(lambda: load_schema(file)) < 32 << 20


@pytest.mark.parametrize(
    "text, message, line",
    [
        ('{"name": "x",\n "description": ' + "[" * 5000 + "]" * 5000 + "}", "nested more than", 2),
        (
            '{"name": "x",\n\t"description": ' + "[" * 5000 + "]" * 5000 + "}",
            "nested more than",
            2,
        ),  # YAML rejects the tab
        ('{"name": "x",\n "local_radius": ' + "9" * 5000 + "}", "a number of 5000 characters is too long", 2),
        ('{"name": "x",\n\t"local_radius": ' + "9" * 5000 + "}", "a number of 5000 characters is too long", 2),
        (
            '{"name": "x", "local_radius": 3.0, "special_tokens": {"global": 1},'
            '\n "node_types": {"s": {"global": "node"}}}',
            None,
            None,
        ),
    ],
)
def test_hostile_json_is_a_schema_error_with_file_and_line(tmp_path, text, message, line):
    file = write(tmp_path, text, "s.json")
    if message is None:
        assert load_schema(file).local_radius == 3
        return
    with pytest.raises(SchemaError, match=message) as err:
        load_schema(file)
    assert err.value.location.file == str(file) and err.value.location.line == line, str(err.value)


def test_a_schema_file_past_the_size_bound_is_refused_unread(tmp_path):
    file = write(tmp_path, MINIMAL + "# " + "x" * MAX_SCHEMA_BYTES + "\n")
    with pytest.raises(SchemaError, match="over the 262144 a schema file may have") as err:
        load_schema(file)
    assert err.value.location.file == str(file)


def test_aliases_and_merge_keys_still_work(tmp_path):
    shared = MINIMAL + "  q: &q {global: per_token, long: true}\n"
    schema = load_schema(write(tmp_path, shared + "  r: {<<: *q, long: false}\nglobal_order: [s, q, r]\n"))
    assert schema.node_types["r"].global_mode == "per_token" and not schema.node_types["r"].long
    with pytest.raises(SchemaError, match=r":6: \$\.node_types\.r\.global_token: per_token globals use"):
        load_schema(write(tmp_path, shared + "  r: {<<: *q, global_token: x}\n", "bad.yaml"))


@st.composite
def _yaml_documents(draw):
    """YAML with anchors, aliases (some recursive, some bombs, some undefined), deep nesting, long
    numbers and non-string keys, under keys the schema may or may not know."""
    lines = ["name: random", "special_tokens: {global: 1}", "node_types: {s: {global: node, long: true}}"]
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["aliases", "recursive", "undefined", "deep", "number", "key", "scalar"]))
        if kind == "aliases" and i:
            refs = draw(st.lists(st.integers(0, i - 1), min_size=1, max_size=12))
            value = "[" + ", ".join(f"*a{j}" for j in refs) + "]"
        elif kind == "recursive":
            value = draw(st.sampled_from(["[*a{i}]", "{{k: [*a{i}]}}", "[[x, *a{i}]]"])).format(i=i)
        elif kind == "undefined":
            value = f"[*a{i + 1}]"
        elif kind == "deep":
            depth = draw(st.integers(1, 3 * MAX_DEPTH))
            value = "[" * depth + "1" + "]" * depth
        elif kind == "number":
            value = draw(st.sampled_from(["", "-", "0x"])) + "9" * draw(st.integers(1, 2 * MAX_NUMBER_CHARS))
        elif kind == "key":
            value = "{" + draw(st.sampled_from(["3", "true", "~", "'q'", "[a]", "1.5"])) + ": 1}"
        else:
            value = draw(st.sampled_from(["1", "3.0", "x", "[1, 2]", "{a: b}"]))
        lines.append(f"{draw(st.sampled_from(['local_radius', 'description', 'extra', 'where']))}{i}: &a{i} {value}")
    return "\n".join(lines) + "\n"


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(_yaml_documents())
def test_random_yaml_loads_or_is_a_schema_error_with_file_and_line(tmp_path, text):
    file = write(tmp_path, text)
    tracemalloc.start()
    try:
        load_schema(file)
    except SchemaError as err:
        assert err.location.file == str(file) and err.location.line is not None, str(err)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 32 << 20


def test_a_dict_schema_error_names_its_key_path():  # issue 15 item 12: this one had no place at all
    raw = {"name": "x", "node_types": {"s": {"global": "node", "long": True}}}
    with pytest.raises(SchemaError, match=r"^\$\.special_tokens: global nodes without their own global_token") as err:
        load_schema(raw)
    assert tuple(err.value.location.path) == ("special_tokens",)
    with pytest.raises(SchemaError, match=r"^\$\.spec: load_schema takes a path or a dict, got int"):
        load_schema(42)


# -- every schema error has a location, dicts included (#38 item 3) ---------------------------
def test_a_missing_required_key_is_named_by_its_path():
    with pytest.raises(SchemaError, match=r"^\$\.name: missing required key: 'name'$") as err:
        load_schema({k: v for k, v in BASE.items() if k != "name"})
    assert tuple(err.value.location.path) == ("name",)
    with pytest.raises(SchemaError, match=r"^\$\.fixed_blocks\.tokens_per_block: missing required key"):
        load_schema({**BASE, "fixed_blocks": {"name": "blk"}})
    with pytest.raises(SchemaError, match=r"^\$\.spec: the schema path is empty"):
        load_schema("")


def _key_paths(value, path=()):
    yield path
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in children:
        yield from _key_paths(item, (*path, key))


_ODD = st.sampled_from([None, True, 0, -1, 7, 2**40, 1.5, float("nan"), "", "node", "x", [], ["x"], {}, {"a": 1}])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_broken_dict_schema_is_an_error_with_a_location(data):
    """A shipped schema as a dict with keys removed, added or replaced by values of other types:
    it loads, or the SchemaError names where (a key path; a dict has no file or line)."""
    import copy

    import yaml

    from graphattn.schema import shipped_schemas

    files = sorted(shipped_schemas())
    schema = yaml.safe_load(data.draw(st.sampled_from(files)).read_text())
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from([p for p in _key_paths(schema) if p]))
        parent = schema
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["delete", "replace", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.sampled_from(["zz", "name", "global", "label", "link", "classes"]))] = copy.deepcopy(
                data.draw(_ODD)
            )
        else:
            parent[path[-1]] = copy.deepcopy(data.draw(_ODD))
    try:
        load_schema(schema)
    except SchemaError as err:
        assert err.location.path, str(err)
        assert str(err).startswith("$"), str(err)
