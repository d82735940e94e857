"""`graphattn train` flags that would do nothing are refused in one line, and `--set` (issue 39
items 5 and 6): --tokenizer / --set with compiled shards, --schema of another geometry with shards,
--hidden-size / --layers / --heads with --init-from, --trust-undigested without --resume; the
--init-from refusal of another distance clipping names the --set that fixes it, which works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import run_main as _run

from graphattn.cli import main

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "examples" / "data"
CHECKPOINT = REPO / "tests" / "fixtures" / "etc" / "finetune_tiny"
TOKENIZER = str(DATA / "tokenizer.json")  # the shipped 3,000 ids the checkpoint has
HOTPOT = DATA / "hotpotqa_sample.json"


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """hotpotqa shards with relative distances clipped at 3 (the checkpoint was pre-trained with 12)."""
    out = tmp_path_factory.mktemp("flags") / "k3"
    argv = ["compile", HOTPOT, "--schema", "hotpotqa", "--tokenizer", TOKENIZER, "--out", out, "-q"]
    assert main([str(a) for a in [*argv, "--set", "relative_pos_max_distance=3"]]) == 0
    return out


def _refused(capsys, argv: list, *says: str) -> str:
    code, _, err = _run(capsys, argv)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("graphattn train: error: "), err
    for text in says:
        assert text in err, err
    return err


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--tokenizer", TOKENIZER], ["--tokenizer", "compiled shards", "leave --tokenizer out"]),
        (["--set", "local_radius=8"], ["--set local_radius=8", "compile them again with it"]),
        (["--schema", "hotpotqa"], ["--schema hotpotqa: its relative_pos_max_distance is 12", "compiled with 3"]),
        (["--trust-undigested"], ["--trust-undigested applies to --resume"]),
        (["--init-from", CHECKPOINT, "--hidden-size", "64"], ["--hidden-size shapes a random encoder", "--init-from"]),
        (["--init-from", CHECKPOINT, "--layers", "2", "--heads", "2"], ["leave --layers, --heads out"]),
    ],
)
def test_a_flag_that_would_do_nothing_is_refused(capsys, shards, tmp_path, extra, says):
    run = tmp_path / "run"
    _refused(capsys, ["train", "--data", shards, "--out", run, "--steps", "1", *extra], *says)
    assert not run.exists()  # refused before the run directory was made


def test_schema_of_the_same_geometry_with_shards_is_taken(capsys, shards, tmp_path):
    """--schema with shards picks targets: allowed when it is the schema they were compiled with."""
    schema = tmp_path / "k3.yaml"
    schema.write_text((REPO / "schemas" / "hotpotqa.yaml").read_text().replace("max_distance: 12", "max_distance: 3"))
    argv = ["train", "--data", shards, "--out", tmp_path / "run", "--steps", "1", "--schema", schema]
    code, _, err = _run(capsys, [*argv, "--hidden-size", "16", "--layers", "1", "--heads", "2", "-q"])
    assert code == 0, err


def test_the_init_from_refusal_names_the_set_that_fixes_it_and_the_set_works(capsys, shards, tmp_path):
    err = _refused(
        capsys,
        ["train", "--data", shards, "--out", tmp_path / "refused", "--steps", "1", "--init-from", CHECKPOINT],
        "clips relative distances at 3",
        "compile the shards again with --set relative_pos_max_distance=12 ",
    )
    assert "relative_vocab_size=N" not in err  # hotpotqa's 32 rows hold k = 12's 27 labels and its own
    run = tmp_path / "run"
    argv = ["train", "--data", HOTPOT, "--schema", "hotpotqa", "--tokenizer", TOKENIZER, "--out", run, "--steps", "1"]
    sets = ["--set", "relative_pos_max_distance=3", "--set", "relative_pos_max_distance=12"]  # the last one wins
    code, out, err = _run(capsys, [*argv, *sets, "--init-from", CHECKPOINT, "--batch-size", "1", "-q"])
    assert code == 0, err
    recorded = json.loads((run / "run.json").read_text())
    assert "--set relative_pos_max_distance=3 --set relative_pos_max_distance=12" in recorded["schema_text"]
    assert recorded["encoder"]["relative_pos_max_distance"] == 12


def test_set_with_raw_records_compiles_with_it(capsys, tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--data", HOTPOT, "--schema", "hotpotqa", "--tokenizer", TOKENIZER, "--out", run, "--steps", "1"]
    tiny = ["--hidden-size", "16", "--layers", "1", "--heads", "2", "--batch-size", "1", "-q"]
    code, out, err = _run(capsys, [*argv, "--set", "relative_pos_max_distance=5", *tiny])
    assert code == 0, err
    recorded = json.loads((run / "run.json").read_text())
    assert recorded["encoder"]["relative_pos_max_distance"] == 5
    assert recorded["schema_text"].startswith("# ") and "--set relative_pos_max_distance=5" in recorded["schema_text"]
    _refused(
        capsys,
        [*argv, "--overwrite", "--set", "relative_pos_max_distanc=5", *tiny],
        "--set relative_pos_max_distanc=5: unknown key",
    )
    assert (run / "run.json").is_file() and (run / "compiled" / "run.json").is_file()  # refused before --overwrite


def test_eval_data_of_another_geometry_is_refused_before_training(capsys, shards, tmp_path):
    other = tmp_path / "k12"
    argv = ["compile", HOTPOT, "--schema", "hotpotqa", "--tokenizer", TOKENIZER, "--out", other, "-q"]
    assert _run(capsys, argv)[0] == 0
    run = tmp_path / "run"
    _refused(
        capsys,
        ["train", "--data", shards, "--out", run, "--steps", "1", "--eval-data", other],
        "--eval-data: ",
        "relative_pos_max_distance 12 in the --eval-data shards, 3 in the --data shards",
    )
    assert not run.exists()
