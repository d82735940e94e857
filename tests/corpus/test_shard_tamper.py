"""Tampered shards through the `graphattn` command: every reader refuses what is not valid data.

The shards are the train-test graphs (tests/train/train_cases.py: links, segments and one target
of each kind) compiled by `graphattn compile`. `shard_tamper.tampers` alters each column and
footer key, in ways that break a length, a range, a type or an agreement between columns, and
in ways that leave valid data (a flag flipped, a label swapped for another label). A tampered
file alone (no done marker) must be refused by inspect, train and evaluate with exit 2, one
line naming the file and no traceback, unless it is still valid data; inside the compile
directory (its done marker beside it) every tamper is refused, the valid ones by the sha256.
Most cases call the command in-process (`graphattn.cli.main`); a few run the installed command.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from graphattn.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import train_cases  # noqa: E402
from shard_tamper import Tamper, damage_pages, same_size_change, tampers  # noqa: E402

TINY = ["--steps", "1", "--hidden-size", "16", "--layers", "1", "--heads", "1", "--batch-size", "8", "-q"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """A compile directory of 6 train-test documents (one shard), and a model trained on it."""
    root = tmp_path_factory.mktemp("tamper")
    rng = random.Random(0)
    with open(root / "docs.jsonl", "w") as handle:
        for i in range(6):
            handle.write(json.dumps(train_cases.make_graph(rng, i).to_dict()) + "\n")
    (root / "schema.yaml").write_text(yaml.safe_dump(train_cases.SCHEMA, sort_keys=False))
    argv = ["compile", str(root / "docs.jsonl"), "--schema", str(root / "schema.yaml")]
    assert main([*argv, "--tokenizer", train_cases.TOKENIZER, "--out", str(root / "shards"), "-q"]) == 0
    assert main(["train", "--data", str(root / "shards"), "--out", str(root / "run"), *TINY]) == 0
    return root


@pytest.fixture(scope="module")
def cases(compiled) -> list[Tamper]:
    return tampers(str(compiled / "shards" / "shard-00000.parquet"))


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, err


def _refused(code: int, err: str, path: Path, what: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, f"{what}: exit {code}, {err}"
    assert len(lines) == 1 and "Traceback" not in err, f"{what}: {err}"
    assert str(path) in lines[0], f"{what}: the file is not named: {err}"


def _write(tamper: Tamper, compiled: Path, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    path = where / "shard-00000.parquet"
    tamper.write(str(compiled / "shards" / "shard-00000.parquet"), str(path))
    return path


def test_the_generator_covers_every_column_and_footer_key(compiled, cases):
    import pyarrow.parquet as pq

    names = " ".join(t.name for t in cases)
    for column in pq.ParquetFile(compiled / "shards" / "shard-00000.parquet").schema_arrow.names:
        assert f"{column}:" in names or f"column {column}" in names, column
    for key in ("format", "settings", "schema", "label_vocab", "layout", "shard"):
        assert f"footer {key}: missing" in names
    valid = [t for t in cases if t.valid]
    assert 10 <= len(valid) < len(cases) - 100


def test_every_tampered_shard_alone_is_refused_by_inspect_train_and_evaluate_unless_still_valid(
    compiled, cases, tmp_path, capsys
):
    for k, tamper in enumerate(cases):
        path = _write(tamper, compiled, tmp_path / f"t{k}")
        code, err = _run(capsys, ["inspect", str(path)])
        if tamper.valid:
            assert code == 0, f"{tamper.name}: valid data refused: {err}"
            continue
        _refused(code, err, path, f"inspect, {tamper.name}")
        code, err = _run(capsys, ["evaluate", "--model", str(compiled / "run"), "--data", str(path)])
        _refused(code, err, path, f"evaluate, {tamper.name}")
        code, err = _run(capsys, ["train", "--data", str(path), "--out", str(tmp_path / f"run{k}"), *TINY])
        _refused(code, err, path, f"train, {tamper.name}")
        assert not list((tmp_path / f"run{k}").glob("step-*")), f"train saved a checkpoint of {tamper.name}"


def test_in_the_compile_directory_the_done_marker_refuses_every_tamper(compiled, cases, tmp_path, capsys):
    """Valid-looking tampers (flags, swapped labels) are caught by the size and sha256 the marker
    records; --no-verify-sha256 reads them as they are."""
    for k, tamper in enumerate(cases):
        directory = tmp_path / f"d{k}"
        shutil.copytree(compiled / "shards", directory)
        path = _write(tamper, compiled, directory)
        code, err = _run(capsys, ["inspect", str(directory)])
        _refused(code, err, path, f"inspect, {tamper.name}")
        if tamper.valid:
            assert "changed after it was written" in err, err
            code, err = _run(capsys, ["inspect", str(directory), "--no-verify-sha256"])
            assert code == 0, err


def test_a_same_size_change_is_caught_by_the_sha256_alone(compiled, tmp_path, capsys):
    directory = tmp_path / "shards"
    shutil.copytree(compiled / "shards", directory)
    path = directory / "shard-00000.parquet"
    same_size_change(str(compiled / "shards" / "shard-00000.parquet"), str(path))
    assert path.stat().st_size == (compiled / "shards" / "shard-00000.parquet").stat().st_size
    for argv in (
        ["inspect", str(directory)],
        ["viz", str(directory), "--out", str(tmp_path / "x.png")],
        ["evaluate", "--model", str(compiled / "run"), "--data", str(directory)],
        ["train", "--data", str(directory), "--out", str(tmp_path / "run"), *TINY],
    ):
        code, err = _run(capsys, argv)
        _refused(code, err, path, argv[0])
        assert "sha256 differs from the one its done marker shard-00000.done.json records" in err
    (directory / "shard-00000.done.json").unlink()
    code, err = _run(capsys, ["inspect", str(directory)])
    _refused(code, err, path, "no marker")
    assert "done marker shard-00000.done.json is missing" in err


def _command(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["graphattn", *argv], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "case, commands",
    [
        ("link_global: item 0 is", ("inspect", "viz", "evaluate", "train")),
        ("footer label_vocab: empty", ("viz",)),
        ("pages", ("train",)),
    ],
)
def test_the_installed_command_refuses_a_tampered_shard_in_one_line(compiled, cases, tmp_path, case, commands):
    """As a user runs them; train with a DataLoader worker process, whose error comes back as its line."""
    path = tmp_path / "shards" / "shard-00000.parquet"
    path.parent.mkdir()
    source = str(compiled / "shards" / "shard-00000.parquet")
    if case == "pages":
        damage_pages(source, str(path))
    else:
        next(t for t in cases if t.name.startswith(case)).write(source, str(path))
    argvs = {
        "inspect": ["inspect", str(path)],
        "viz": ["viz", str(path), "--instance", "5", "--out", str(tmp_path / "x.png")],
        "evaluate": ["evaluate", "--model", str(compiled / "run"), "--data", str(path)],
        "train": ["train", "--data", str(path), "--out", str(tmp_path / "run"), "--workers", "1", *TINY],
    }
    for command in commands:
        done = _command(*argvs[command])
        _refused(done.returncode, done.stderr, path, command)
        if case == "pages":
            assert "row group 0 cannot be read" in done.stderr


def test_a_class_past_the_schemas_classes_never_reaches_the_loss(compiled, cases, tmp_path, capsys):
    """The class count comes from the schema that training uses, not only the column's dtype."""
    tamper = next(t for t in cases if t.name.startswith("target:supporting: item"))
    path = _write(tamper, compiled, tmp_path / "shards")
    code, err = _run(capsys, ["train", "--data", str(path), "--out", str(tmp_path / "run"), *TINY])
    _refused(code, err, path, "train")
    assert "column target:supporting" in err and "a class of the schema's 2" in err


_BOMB = "".join(f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 10)}]\n" for k in range(1, 9)).encode()  # 10**9 values


@pytest.mark.parametrize(
    "text, says",
    [
        (b"::: [", "no readable relation schema"),  # not YAML; next: aliases that multiply (the bounded loader)
        (b"a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + _BOMB, "no readable relation schema"),
    ],
)
def test_a_footer_schema_that_is_no_schema_is_read_but_not_trained_on(compiled, tmp_path, capsys, text, says):
    """Shards may carry any schema text (write_shards); inspect reads them, train needs a schema."""
    from shard_tamper import _footer

    path = _write(Tamper("schema text", _footer("schema", text)), compiled, tmp_path / "shards")
    code, err = _run(capsys, ["inspect", str(path)])
    assert code == 0, err
    code, err = _run(capsys, ["train", "--data", str(path), "--out", str(tmp_path / "run"), *TINY])
    _refused(code, err, path, "train")
    assert says in err


def test_a_damaged_page_is_named_by_every_reader(compiled, tmp_path, capsys):
    """A footer that reads and pages that do not: the file and row group, in one line, everywhere."""
    path = tmp_path / "shards" / "shard-00000.parquet"
    path.parent.mkdir()
    damage_pages(str(compiled / "shards" / "shard-00000.parquet"), str(path))
    for argv in (
        ["inspect", str(path)],
        ["viz", str(path), "--out", str(tmp_path / "x.png")],
        ["evaluate", "--model", str(compiled / "run"), "--data", str(path)],
        ["train", "--data", str(path), "--out", str(tmp_path / "run"), *TINY],
    ):
        code, err = _run(capsys, argv)
        _refused(code, err, path, argv[0])
        assert "damaged shard: row group 0 cannot be read" in err, err
