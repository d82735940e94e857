"""A compile directory's run.json says its format version and is read by it (#38 item 6): every
key of that version checked, nothing guessed from keys that are missing; a file without a
version, of another program or of a newer graphattn is one line that says which."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from graphattn.cli import main
from graphattn.shards.runfile import (
    RUN_FORMAT,
    RUN_FORMAT_VERSION,
    RunFileError,
    format_version,
    is_compile_directory,
    read_run,
)

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = str(REPO / "examples" / "data" / "tokenizer.json")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[Path, list[str]]:
    """A compile of two small text files, and the command that made it."""
    root = tmp_path_factory.mktemp("runfile")
    (root / "docs").mkdir()
    for name, text in (("a.txt", "A first sentence. And a second one."), ("b.txt", "Another text. Short.")):
        (root / "docs" / name).write_text(text)
    command = ["compile", str(root / "docs"), "--schema", "etc-sentences", "--tokenizer", TOKENIZER]
    command += ["--out", str(root / "out"), "-q"]
    assert main(command) == 0
    return root / "out", command


def test_compile_writes_the_current_version_and_reads_it_back(compiled):
    out, _ = compiled
    raw = json.loads((out / "run.json").read_text())
    assert raw["format"] == RUN_FORMAT == f"graphattn-run/{RUN_FORMAT_VERSION}"
    assert format_version(raw["format"]) == RUN_FORMAT_VERSION
    assert read_run(out / "run.json") == raw and is_compile_directory(out)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: {k: v for k, v in r.items() if k != "format"}, "has no format key, so it says no version"),
        (lambda r: {**r, "format": "graphattn-train/1"}, "'graphattn-train/1': a graphattn train run's"),
        (lambda r: {**r, "format": "graphattn-run/2"}, "written by a newer graphattn; this one reads versions 1"),
        (lambda r: {**r, "format": "graphattn-run/01"}, "'graphattn-run/01': not a compile run.json"),
        (lambda r: {**r, "format": 1}, "format '1': not a compile run.json"),
        (lambda r: {k: v for k, v in r.items() if k != "documents"}, r"documents must be a count .* got missing"),
        (lambda r: {**r, "shards": True}, "shards must be a count"),
        (lambda r: {**r, "shards": -1}, "shards must be a count"),
        (lambda r: {k: v for k, v in r.items() if k != "settings"}, "settings must be an object, got missing"),
        (lambda r: {**r, "inputs": [{"bytes": 3}]}, "inputs must be a list of input fingerprints"),
        (lambda r: [r], "must hold a JSON object, found list"),
    ],
)
def test_a_run_file_is_read_by_its_version_or_refused_in_one_line(compiled, tmp_path, change, message):
    out, _ = compiled
    path = tmp_path / "run.json"
    path.write_text(json.dumps(change(json.loads((out / "run.json").read_text()))))
    with pytest.raises(RunFileError, match=message) as err:
        read_run(path)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_damaged_huge_or_odd_run_files_are_one_line(tmp_path, monkeypatch):
    from graphattn.shards import runfile

    path = tmp_path / "run.json"
    path.write_text('{"format": "graphattn-run/1", ')
    with pytest.raises(RunFileError, match="run.json is damaged"):
        read_run(path)
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(RunFileError, match="run.json is damaged"):
        read_run(path)
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(RunFileError, match="run.json is damaged"):
        read_run(path)
    monkeypatch.setattr(runfile, "MAX_RUN_BYTES", 64)
    path.write_text(json.dumps({"format": RUN_FORMAT, "pad": "x" * 100}))
    with pytest.raises(RunFileError, match="larger than 64 bytes"):
        read_run(path)
    path.unlink()
    os.mkfifo(path)  # would block an open()
    with pytest.raises(RunFileError, match="run.json is not a regular file"):
        read_run(path)
    assert is_compile_directory(tmp_path)  # unreadable: shards here still need their markers
    path.unlink()
    with pytest.raises(RunFileError, match="no run.json here"):
        read_run(path)
    assert not is_compile_directory(tmp_path)


def test_resume_reads_the_run_by_its_version(compiled, tmp_path, capsys):
    import shutil

    out, command = compiled
    copy = Path(shutil.copytree(out, tmp_path / "out"))
    command = [*command[: command.index("--out")], "--out", str(copy), "-q", "--resume"]
    assert main(command) == 0
    run = json.loads((copy / "run.json").read_text())
    for change, says in (
        ({k: v for k, v in run.items() if k != "inputs"}, "inputs must be a list of input fingerprints"),
        ({**run, "format": "graphattn-run/7"}, "written by a newer graphattn"),
    ):
        (copy / "run.json").write_text(json.dumps(change))
        capsys.readouterr()
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert err.endswith("start a new run in an empty directory") and says in err and str(copy / "run.json") in err


def test_only_a_compile_run_file_asks_for_done_markers(compiled, tmp_path, capsys):
    import shutil

    out, _ = compiled
    copy = Path(shutil.copytree(out, tmp_path / "out"))
    (copy / "shard-00000.done.json").unlink()
    capsys.readouterr()
    assert main(["inspect", str(copy), "-q"]) == 2
    assert "done marker shard-00000.done.json is missing" in capsys.readouterr().err
    (copy / "run.json").write_text(json.dumps({"format": "graphattn-train/1"}))  # not a compile's
    assert not is_compile_directory(copy)
    assert main(["inspect", str(copy), "-q"]) == 0
    (copy / "run.json").unlink()
    assert main(["inspect", str(copy), "-q"]) == 0
