"""Tampered shards: every column and footer key of a valid shard altered, each one written back
as a valid Parquet file, so that only graphattn's own checks can tell.

`tampers(path)` reads a shard and returns one `Tamper` per alteration; `Tamper.write(src, dst)`
writes the altered shard. `valid` says whether the result is still valid data (a flag flipped, a
label swapped for another label, a text made longer): the reader's footer and row checks accept
those, and only the done marker's sha256 refuses them. Every other tamper breaks a length, a
range, an agreement between columns, a type or a footer key, and every reader must refuse it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

Edit = Callable[[pa.Table, dict], tuple[pa.Table, dict]]
FREE_LENGTH = ("dropped_nodes", "dropped_targets", "truncation_messages")  # any number of items is valid


@dataclass
class Tamper:
    name: str
    edit: Edit
    valid: bool = False  # still valid data: only the done marker's sha256 catches it

    def write(self, src: str, dst: str) -> None:
        pf = pq.ParquetFile(src)
        table = pf.read()
        table, meta = self.edit(table.replace_schema_metadata(None), dict(pf.schema_arrow.metadata))
        pq.write_table(table.replace_schema_metadata(meta), dst, row_group_size=64, compression="zstd")


def _set_list(name: str, row: int, change: Callable[[list], list]) -> Edit:
    def edit(table: pa.Table, meta: dict) -> tuple[pa.Table, dict]:
        values = table.column(name).to_pylist()
        values[row] = change(list(values[row]))
        index = table.schema.get_field_index(name)
        field = table.schema.field(index)
        return table.set_column(index, field, pa.array(values, type=field.type)), meta

    return edit


def _set_scalar(name: str, row: int, change: Callable[[object], object]) -> Edit:
    def edit(table: pa.Table, meta: dict) -> tuple[pa.Table, dict]:
        values = table.column(name).to_pylist()
        values[row] = change(values[row])
        index = table.schema.get_field_index(name)
        field = table.schema.field(index)
        return table.set_column(index, field, pa.array(values, type=field.type)), meta

    return edit


def _footer(key: str, value: bytes | None) -> Edit:
    def edit(table: pa.Table, meta: dict) -> tuple[pa.Table, dict]:
        meta = dict(meta)
        if value is None:
            del meta[f"graphattn.{key}".encode()]
        else:
            meta[f"graphattn.{key}".encode()] = value
        return table, meta

    return edit


def _footer_json(key: str, change: Callable[[dict], object]) -> Edit:
    def edit(table: pa.Table, meta: dict) -> tuple[pa.Table, dict]:
        meta = dict(meta)
        name = f"graphattn.{key}".encode()
        meta[name] = json.dumps(change(json.loads(meta[name]))).encode()
        return table, meta

    return edit


def _drop_column(name: str) -> Edit:
    return lambda table, meta: (table.drop_columns([name]), meta)


def _retype_column(name: str, type: pa.DataType) -> Edit:
    def edit(table: pa.Table, meta: dict) -> tuple[pa.Table, dict]:
        index = table.schema.get_field_index(name)
        return table.set_column(index, pa.field(name, type), table.column(name).cast(type)), meta

    return edit


def _add_column(table: pa.Table, meta: dict) -> tuple[pa.Table, dict]:
    return table.append_column("extra", pa.array([0] * table.num_rows, pa.int32())), meta


def _first_labelled(values: list) -> int:
    return next(k for k, v in enumerate(values) if v != -100)


def tampers(path: str) -> list[Tamper]:
    """Every alteration of the shard at `path` (its last row; the row must have links and edges)."""
    pf = pq.ParquetFile(path)
    table = pf.read()
    meta = pf.schema_arrow.metadata
    settings = json.loads(meta[b"graphattn.settings"])
    layout = json.loads(meta[b"graphattn.layout"])
    labels = len(json.loads(meta[b"graphattn.label_vocab"])["names"])
    row = table.num_rows - 1
    get = lambda name: table.column(name)[row].as_py()  # noqa: E731
    L, G, D = get("long_length"), get("global_length"), len(get("doc_numbers"))
    vocab = settings["tokenizer_vocab_size"]
    out: list[Tamper] = []

    # a value outside its range, per numeric list column (item 0 of the row)
    breaking = {
        "long_token_ids": vocab,
        "global_token_ids": vocab,
        "long_type_ids": -1,
        "global_type_ids": -1,
        "long_char_gap": 10**7,
        "long_char_length": -3,
        "long_doc": D,
        "global_doc": D,
        "long_segment": -1,
        "global_segment": -2,
        "link_long": L,
        "link_global": G,
        "link_label": labels,
        "g2g_src": G,
        "g2g_dst": -1,
        "g2g_label": labels,
        "doc_numbers": -1,
        "source_records": -1,
        "source_lines": 0,
        **{f"owner_{level}": G for level in layout["levels"]},
    }
    for field in table.schema:
        name = field.name
        if pa.types.is_list(field.type):
            value_type = field.type.value_type
            item = "x" if pa.types.is_string(value_type) else False if pa.types.is_boolean(value_type) else 0
            if name in FREE_LENGTH:
                out.append(Tamper(f"{name}: one item more", _set_list(name, row, lambda v, i=item: [*v, i]), True))
            else:
                out.append(Tamper(f"{name}: one item more", _set_list(name, row, lambda v, i=item: [*v, i])))
                if get(name):
                    out.append(Tamper(f"{name}: one item fewer", _set_list(name, row, lambda v: v[:-1])))
            if name in breaking and get(name):
                bad = breaking[name]
                out.append(Tamper(f"{name}: item 0 is {bad}", _set_list(name, row, lambda v, b=bad: [b, *v[1:]])))
    for what, src, dst, label in (("a global past G", 0, G, 0), ("a label past the vocabulary", 0, 1, labels)):

        def edge(table, meta, triple=(src, dst, label)):
            for name, value in zip(("g2g_src", "g2g_dst", "g2g_label"), triple):
                table, meta = _set_list(name, row, lambda v, x=value: [*v, x])(table, meta)
            return table, meta

        out.append(Tamper(f"g2g: an edge to {what}", edge))
    # targets: a class past the schema's classes, a half span; and a label swapped for another label
    for name, axis, _ in layout["targets"]:
        column = f"target:{name}"
        if axis == "global":
            k = _first_labelled(get(column))

            def swap(v, k=k):
                return [*v[:k], 1 - v[k], *v[k + 1 :]]

            out.append(
                Tamper(
                    f"{column}: item {k} is class 2 of 2",
                    _set_list(column, row, lambda v, k=k: [*v[:k], 2, *v[k + 1 :]]),
                )
            )
            out.append(Tamper(f"{column}: a label swapped", _set_list(column, row, swap), True))
    # flags and strings: any value is valid data
    for name in ("long_hard_l2g", "global_hard_g2l", "global_blockable"):
        out.append(Tamper(f"{name}: item 0 flipped", _set_list(name, row, lambda v: [not v[0], *v[1:]]), True))
    for name in ("global_node_ids", "global_node_types", "sources"):
        out.append(Tamper(f"{name}: item 0 renamed", _set_list(name, row, lambda v: ["x", *v[1:]]), True))
    out.append(Tamper("texts: text longer", _set_list("texts", row, lambda v: [v[0] + " more", *v[1:]]), True))
    out.append(Tamper("texts: text emptied", _set_list("texts", row, lambda v: ["", *v[1:]])))
    out.append(
        Tamper("link_label: another label", _set_list("link_label", row, lambda v: [(v[0] + 1) % labels, *v[1:]]), True)
    )
    out.append(
        Tamper("long_type_ids: past the schema's", _set_list("long_type_ids", row, lambda v: [v[0] + 9, *v[1:]]))
    )
    out.append(
        Tamper(
            "long_token_ids: another token",
            _set_list("long_token_ids", row, lambda v: [(v[0] + 1) % vocab, *v[1:]]),
            True,
        )
    )

    scalars = {
        "long_length": (lambda v: v + 1, False),
        "global_length": (lambda v: v - 1, False),
        "window": (lambda v: 1, False),
        "windows": (lambda v: 0, False),
        "long_tokens_before": (lambda v: L - 1, False),
        "long_tokens_after": (lambda v: L + 1, False),
        "globals_before": (lambda v: G - 1, False),
        "globals_after": (lambda v: G + 1, False),
        "cross_segment_label": (lambda v: labels, False),
        "truncated": (lambda v: not v, True),
    }
    span_targets = [name[: -len("_start")] for name, axis, shape in layout["targets"] if name.endswith("_start")]
    for base in span_targets:
        scalars[f"target:{base}_start"] = (lambda v: L, False)
        scalars[f"target:{base}_end"] = (lambda v: -5, False)
        scalars[f"target:{base}_type"] = (lambda v: 99, False)
    for name, (change, valid) in scalars.items():
        out.append(Tamper(f"{name}: changed", _set_scalar(name, row, change), valid))
    for base in span_targets:
        out.append(
            Tamper(f"target:{base}_type: -100 beside a span", _set_scalar(f"target:{base}_type", row, lambda v: -100))
        )

    # the column set and types
    for name in ("long_doc", f"owner_{layout['levels'][0]}", "texts", f"target:{layout['targets'][0][0]}"):
        out.append(Tamper(f"column {name} dropped", _drop_column(name)))
    out.append(Tamper("column long_doc retyped int32", _retype_column("long_doc", pa.list_(pa.int32()))))
    out.append(Tamper("an extra column", _add_column))

    # footer keys: missing, not UTF-8, not JSON, not an object, values of the wrong type or out of bounds
    for key in ("format", "settings", "schema", "label_vocab", "layout", "shard"):
        out.append(Tamper(f"footer {key}: missing", _footer(key, None)))
        out.append(Tamper(f"footer {key}: not UTF-8", _footer(key, b"\xff\xfe{}")))
    for key in ("settings", "label_vocab", "layout", "shard"):
        out.append(Tamper(f"footer {key}: not JSON", _footer(key, b"{not json")))
        out.append(Tamper(f"footer {key}: a list", _footer(key, b"[]")))
    out.append(Tamper("footer label_vocab: empty", _footer("label_vocab", b"{}")))
    out.append(
        Tamper(
            "footer label_vocab: an extra label",
            _footer_json("label_vocab", lambda d: {**d, "extra": [*d["extra"], "x"], "names": [*d["names"], "x"]}),
        )
    )
    out.append(
        Tamper(
            "footer label_vocab: max_distance",
            _footer_json("label_vocab", lambda d: {**d, "max_distance": d["max_distance"] + 1}),
        )
    )
    out.append(Tamper("footer layout: token int64", _footer_json("layout", lambda d: {**d, "token": "int64"})))
    out.append(Tamper("footer layout: no levels", _footer_json("layout", lambda d: {**d, "levels": []})))
    out.append(
        Tamper(
            "footer layout: local_radius",
            _footer_json("layout", lambda d: {**d, "local_radius": d["local_radius"] + 1}),
        )
    )
    out.append(Tamper("footer layout: no targets", _footer_json("layout", lambda d: {**d, "targets": []})))
    out.append(
        Tamper(
            "footer layout: a key missing", _footer_json("layout", lambda d: {k: v for k, v in d.items() if k != "doc"})
        )
    )
    out.append(
        Tamper("footer settings: vocabulary 10", _footer_json("settings", lambda d: {**d, "tokenizer_vocab_size": 10}))
    )
    out.append(
        Tamper(
            "footer settings: vocabulary a string",
            _footer_json("settings", lambda d: {**d, "tokenizer_vocab_size": "x"}),
        )
    )
    out.append(
        Tamper(
            "footer shard: one instance more", _footer_json("shard", lambda d: {**d, "instances": d["instances"] + 1})
        )
    )
    out.append(Tamper("footer format: another version", _footer("format", b"graphattn-shards/2")))
    return out


def same_size_change(src: str, dst: str) -> None:
    """The shard with one letter of its footer's schema text changed: the same size, a valid
    file, another schema name; only the sha256 of the done marker tells."""
    data = open(src, "rb").read()
    at = data.rindex(b"name: ") + len(b"name: ")
    open(dst, "wb").write(data[:at] + (b"X" if data[at : at + 1] != b"X" else b"Y") + data[at + 1 :])


def damage_pages(src: str, dst: str) -> None:
    """A shard whose footer reads but whose compressed pages do not."""
    data = bytearray(open(src, "rb").read())
    data[100:2000] = bytes((b * 7 + 3) % 256 for b in data[100:2000])
    open(dst, "wb").write(bytes(data))
