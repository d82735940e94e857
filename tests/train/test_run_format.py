"""run.json of a training run says its format version ("graphattn-train/<version>") and is read by
the rules of that version: version 2 (what train writes now) must hold every key, version 1 (older
runs) may lack what version 1 did not always write; nothing is guessed from a missing key, and a
newer or unknown format is refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_cases import tiny_config  # noqa: E402

from graphattn.errors import GraphattnError  # noqa: E402
from graphattn.train.rundir import (  # noqa: E402
    RESUME_SETTINGS,
    RUN_FORMAT,
    check_same_settings,
    read_run_file,
    run_format_version,
)


def current() -> dict:
    return {
        "format": RUN_FORMAT,
        "encoder": tiny_config().to_dict(),
        "targets": ["answer"],
        "schema_name": "wikihop",
        "schema_text": "name: wikihop\n",
        "data": ["/data/shards"],
        "tokenizer": None,
        "max_ngram": None,
        "settings": {key: None for key in RESUME_SETTINGS},
    }


def read(tmp_path: Path, run: dict) -> dict:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    return read_run_file(path)


def refused(tmp_path: Path, run: dict, *phrases: str) -> str:
    with pytest.raises(GraphattnError) as caught:
        read(tmp_path, run)
    line = str(caught.value)
    assert "\n" not in line and str(tmp_path / "run.json") in line, line
    for phrase in phrases:
        assert phrase in line, (phrase, line)
    return line


def test_the_current_version_is_written_whole_and_read_back():
    assert RUN_FORMAT == "graphattn-train/2" and run_format_version(RUN_FORMAT) == 2


def test_version_2_needs_every_key(tmp_path):
    assert read(tmp_path, current())["settings"]["seed"] is None
    for key in ("settings", "max_ngram", "tokenizer", "data"):
        run = current()
        del run[key]
        refused(tmp_path, run, f"$.{key}: missing from run.json (format version 2 records it)")
    run = current()
    del run["settings"]["seed"]
    refused(tmp_path, run, "$.settings.seed: missing from the settings")
    run = current()
    del run["encoder"]["max_absolute_position_embeddings"]
    refused(tmp_path, run, "$.encoder.max_absolute_position_embeddings: expected an integer")
    refused(tmp_path, {**current(), "data": "/data/shards"}, "$.data: expected shard paths")


def test_version_1_is_read_by_its_own_rules(tmp_path):
    old = current()
    old["format"] = "graphattn-train/1"
    for key in ("settings", "max_ngram", "schema_name", "data", "tokenizer"):
        del old[key]
    del old["encoder"]["max_absolute_position_embeddings"]
    run = read(tmp_path, old)
    assert run["settings"] is None and run["max_ngram"] is None
    with pytest.raises(GraphattnError, match=r"records no settings to compare with \(format version 1"):
        check_same_settings(run["settings"], {}, tmp_path)


@pytest.mark.parametrize(
    "value, phrase",
    [
        ("graphattn-train/3", "written by a newer graphattn; this one reads versions 1 and 2"),
        ("graphattn-train/01", "expected graphattn-train/<version>"),
        ("graphattn-train", "expected graphattn-train/<version>"),
        (None, "expected graphattn-train/<version>"),
    ],
)
def test_an_unknown_format_is_refused(tmp_path, value, phrase):
    refused(tmp_path, {**current(), "format": value}, phrase)
