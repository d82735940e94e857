"""A shard's sha256 is checked once per version of the file (#38 item 5): a verified stamp keyed by
device, inode, size, mtime and ctime stands for the hash on later runs; a changed file, or a stamp
that does not match in every respect, means hashing again, never trusting."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import pytest
import yaml

from graphattn.cli import main
from graphattn.shards import stamp, verify
from graphattn.shards.dataset import ShardDataset
from graphattn.shards.verify import ShardFormatError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import train_cases  # noqa: E402
from shard_tamper import same_size_change  # noqa: E402

STAMP = ".shard-00000.parquet.verified.json"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """A compile directory of 9 documents in 3 shards."""
    root = tmp_path_factory.mktemp("stamp")
    rng = random.Random(0)
    with open(root / "docs.jsonl", "w") as handle:
        for i in range(9):
            handle.write(json.dumps(train_cases.make_graph(rng, i).to_dict()) + "\n")
    (root / "schema.yaml").write_text(yaml.safe_dump(train_cases.SCHEMA, sort_keys=False))
    argv = ["compile", str(root / "docs.jsonl"), "--schema", str(root / "schema.yaml"), "--shard-size", "3"]
    assert main([*argv, "--tokenizer", train_cases.TOKENIZER, "--out", str(root / "shards"), "-q"]) == 0
    return root / "shards"


@pytest.fixture
def hashed(monkeypatch, tmp_path) -> list[str]:
    """The paths hashed from here on, in a process that has checked nothing yet (as a new run);
    stamps that cannot lie beside their shard go to a cache directory of this test."""
    monkeypatch.setenv("GRAPHATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(verify, "_VERIFIED", {})
    calls: list[str] = []
    real = verify.file_sha256

    def counting(path: str) -> str:
        calls.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(verify, "file_sha256", counting)
    return calls


def _settled(directory: Path) -> Path:
    """A copy of the compile directory whose shards were written a while ago (a fresh file is
    hashed but never stamped: a write in the same clock tick could hide behind the stamp)."""
    past = time.time_ns() - 60 * 10**9
    for shard in directory.glob("*.parquet"):
        os.utime(shard, ns=(past, past))
    return directory


def _copy(compiled: Path, tmp_path: Path, name: str = "shards") -> Path:
    return _settled(Path(shutil.copytree(compiled, tmp_path / name)))


def _new_run(monkeypatch) -> None:
    monkeypatch.setattr(verify, "_VERIFIED", {})


def test_a_shard_is_hashed_once_per_version_of_the_file(compiled, tmp_path, hashed, monkeypatch):
    directory = _copy(compiled, tmp_path)
    ShardDataset(directory)
    assert sorted(hashed) == ["shard-00000.parquet", "shard-00001.parquet", "shard-00002.parquet"]
    record = json.loads((directory / STAMP).read_text())
    shard = directory / "shard-00000.parquet"
    status = shard.stat()
    marker = json.loads((directory / "shard-00000.done.json").read_text())
    assert record == {
        "format": stamp.STAMP_FORMAT,
        "path": os.path.realpath(shard),
        "sha256": marker["sha256"],
        "device": status.st_dev,
        "inode": status.st_ino,
        "bytes": status.st_size,
        "mtime_ns": status.st_mtime_ns,
        "ctime_ns": status.st_ctime_ns,
    }
    for _ in range(2):  # later runs (and resumes) read the stamps, not the bytes
        _new_run(monkeypatch)
        hashed.clear()
        ShardDataset(directory)
        assert hashed == []
    assert main(["inspect", str(directory), "-q"]) == 0 and hashed == []
    assert sorted(p.name for p in directory.glob("*.parquet")) == [f"shard-0000{i}.parquet" for i in range(3)]


def test_a_changed_file_is_hashed_again_even_with_its_times_put_back(compiled, tmp_path, hashed, monkeypatch):
    directory = _copy(compiled, tmp_path)
    ShardDataset(directory)
    shard = directory / "shard-00001.parquet"
    before = shard.stat()
    same_size_change(str(shard), str(shard))  # rewritten in place: same inode, same size
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime put back; ctime cannot be
    after = shard.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    _new_run(monkeypatch)
    hashed.clear()
    with pytest.raises(ShardFormatError, match="sha256 differs from the one its done marker shard-00001.done.json"):
        ShardDataset(directory)
    assert "shard-00001.parquet" in hashed
    assert main(["inspect", str(directory), "-q"]) == 2


def test_a_touched_file_is_hashed_again_and_stamped_anew(compiled, tmp_path, hashed, monkeypatch):
    directory = _copy(compiled, tmp_path)
    ShardDataset(directory)
    shard = directory / "shard-00002.parquet"
    later = time.time_ns() - 30 * 10**9
    os.utime(shard, ns=(later, later))
    _new_run(monkeypatch)
    hashed.clear()
    ShardDataset(directory)
    assert hashed == ["shard-00002.parquet"]
    assert json.loads((directory / ".shard-00002.parquet.verified.json").read_text())["mtime_ns"] == later
    _new_run(monkeypatch)
    hashed.clear()
    ShardDataset(directory)
    assert hashed == []


def _forged(record: dict, directory: Path) -> list[tuple[str, object]]:
    """Stamps that must not stand for a hash: each differs from a true one in one respect."""
    other = json.loads((directory / ".shard-00001.parquet.verified.json").read_text())
    cases: list[tuple[str, object]] = [
        ("another file's stamp", other),
        ("another path", {**record, "path": record["path"] + "x"}),
        ("another sha256", {**record, "sha256": other["sha256"]}),
        ("a bool for an int", {**record, "device": bool(record["device"])} if record["device"] in (0, 1) else None),
        ("a float mtime", {**record, "mtime_ns": float(record["mtime_ns"])}),
        ("no ctime", {k: v for k, v in record.items() if k != "ctime_ns"}),
        ("another inode", {**record, "inode": record["inode"] + 1}),
        ("another format", {**record, "format": "graphattn-verified/9"}),
        ("a list", [record]),
        ("not JSON", "{"),
        ("too large", {**record, "pad": "x" * (stamp.MAX_STAMP_BYTES + 1)}),
    ]
    return [(name, value) for name, value in cases if value is not None]


def test_a_stamp_that_does_not_match_is_ignored(compiled, tmp_path, hashed, monkeypatch):
    directory = _copy(compiled, tmp_path)
    ShardDataset(directory)
    record = json.loads((directory / STAMP).read_text())
    for name, value in _forged(record, directory):
        (directory / STAMP).write_text(value if isinstance(value, str) else json.dumps(value))
        _new_run(monkeypatch)
        hashed.clear()
        ShardDataset(directory)
        assert hashed == ["shard-00000.parquet"], name
    # a tampered shard with a stamp of its old version is refused: the stamp no longer matches
    shard = directory / "shard-00000.parquet"
    (directory / STAMP).write_text(json.dumps(record))
    same_size_change(str(shard), str(shard))
    _new_run(monkeypatch)
    with pytest.raises(ShardFormatError, match="sha256 differs"):
        ShardDataset(directory)


def test_a_copied_directory_brings_stamps_that_are_ignored(compiled, tmp_path, hashed, monkeypatch):
    first = _copy(compiled, tmp_path, "first")
    ShardDataset(first)
    second = Path(shutil.copytree(first, tmp_path / "second", copy_function=shutil.copy2))
    assert (second / STAMP).is_file()
    _new_run(monkeypatch)
    hashed.clear()
    ShardDataset(second)
    assert sorted(hashed) == ["shard-00000.parquet", "shard-00001.parquet", "shard-00002.parquet"]


def test_a_fresh_file_is_hashed_but_not_stamped(compiled, tmp_path, hashed):
    directory = Path(shutil.copytree(compiled, tmp_path / "fresh"))
    for shard in directory.glob("*.parquet"):
        os.utime(shard)  # just written, as far as the clock can tell
    ShardDataset(directory)
    assert len(hashed) == 3 and not list(directory.glob(".*.verified.json"))


def test_where_the_directory_cannot_take_a_stamp_it_goes_to_the_cache(compiled, tmp_path, hashed, monkeypatch):
    directory = _copy(compiled, tmp_path)
    (directory / STAMP).mkdir()  # this place cannot hold a stamp (root may write anywhere: a chmod would not tell)
    ShardDataset(directory)
    cached = list((tmp_path / "cache" / "verified").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["path"] == os.path.realpath(
        directory / "shard-00000.parquet"
    )
    _new_run(monkeypatch)
    hashed.clear()
    ShardDataset(directory)
    assert hashed == []


def test_many_shards_are_hashed_together_and_the_first_failure_in_order_is_named(compiled, tmp_path, hashed):
    directory = _copy(compiled, tmp_path)
    for index in (1, 2):
        shard = directory / f"shard-0000{index}.parquet"
        same_size_change(str(shard), str(shard))
    paths = [str(p) for p in sorted(directory.glob("*.parquet"))]
    with pytest.raises(ShardFormatError, match=r"shard-00001\.parquet: its sha256 differs"):
        verify.check_digests(paths, workers=3)
    assert "shard-00001.parquet" in hashed  # (files not yet started when it failed are not hashed at all)
    assert ShardDataset(directory, verify_sha256=False) is not None  # --no-verify-sha256 reads them unchecked


def test_compile_resume_hashes_a_finished_shard_once_per_version(compiled, tmp_path, hashed, monkeypatch):
    """`compile --resume` asks each finished shard `is_done`: the same stamps stand for the hash."""
    from graphattn.corpus.output import OutputDir

    directory = _copy(compiled, tmp_path)
    run = OutputDir(directory)
    assert all(run.is_done(i) for i in range(3))
    assert sorted(hashed) == [f"shard-0000{i}.parquet" for i in range(3)]
    _new_run(monkeypatch)
    assert all(run.is_done(i) for i in range(3))
    assert len(hashed) == 3  # the stamps held: nothing hashed again
    shard = directory / "shard-00001.parquet"
    same_size_change(str(shard), str(shard))
    _new_run(monkeypatch)
    assert not run.is_done(1) and hashed[-1] == "shard-00001.parquet"  # a changed file: hashed, not done
    assert run.is_done(0) and run.is_done(2)
