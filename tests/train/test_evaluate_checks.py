"""`graphattn evaluate` refuses shards the run cannot read as it was trained (another relative
distance, another tokenizer), refuses shards without gold labels (pointing to `graphattn
predict`), and scores a partly labelled set on its labelled documents, saying how many it
skipped. One tiny HotpotQA run (relative_pos_max_distance 3) is trained once for the module."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from graphattn.cli import main
from graphattn.errors import GraphattnError
from graphattn.schema import load_schema
from graphattn.train.run_match import check_shards_match

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
TOKENIZER = str(DATA / "tokenizer.json")
TINY = ["--hidden-size", "32", "--layers", "1", "--heads", "2", "--batch-size", "2", "--precision", "fp32", "-q"]


def hotpotqa_schema(folder: Path, distance: int) -> str:
    """The shipped HotpotQA schema with relative_pos_max_distance `distance`."""
    text = Path(load_schema("hotpotqa").source).read_text(encoding="utf-8")
    changed, count = re.subn(r"(?m)^relative_pos_max_distance: *\d+", f"relative_pos_max_distance: {distance}", text)
    assert count == 1
    path = folder / f"hotpotqa-{distance}.yaml"
    path.write_text(changed, encoding="utf-8")
    return str(path)


def records(folder: Path, name: str, labelled: list[bool]) -> str:
    """The HotpotQA sample's records, those not `labelled` without supporting_facts and answer."""
    sample = json.loads((DATA / "hotpotqa_sample.json").read_text(encoding="utf-8"))
    out = [
        record if keep else {k: v for k, v in record.items() if k not in ("supporting_facts", "answer")}
        for record, keep in zip(sample, labelled)
    ]
    path = folder / name
    path.write_text(json.dumps(out), encoding="utf-8")
    return str(path)


def compile_into(out: Path, source: str, schema: str, tokenizer: str = TOKENIZER) -> str:
    assert main(["compile", source, "--schema", schema, "--tokenizer", tokenizer, "--out", str(out), "--quiet"]) == 0
    return str(out)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """A run trained one step on the labelled sample compiled with distance 3, and its shards."""
    folder = tmp_path_factory.mktemp("evaluate-checks")
    schema3 = hotpotqa_schema(folder, 3)
    sample = records(folder, "labelled.json", [True, True])
    shards = compile_into(folder / "shards3", sample, schema3)
    run = str(folder / "run")
    assert main(["train", "--data", shards, "--out", run, "--steps", "1", *TINY]) == 0
    return {"folder": folder, "schema3": schema3, "sample": sample, "shards": shards, "run": run}


def refused(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_the_runs_own_shards_are_scored(made, capsys):
    capsys.readouterr()
    assert main(["evaluate", "--model", made["run"], "--data", made["shards"]]) == 0
    out = capsys.readouterr().out
    assert "on 2 instance(s) of 2 document(s)" in out and "skipped 0" in out and "no gold label" not in out


def test_shards_compiled_with_another_relative_distance_are_refused(made, capsys, tmp_path):
    shards4 = compile_into(tmp_path / "shards4", made["sample"], hotpotqa_schema(tmp_path, 4))
    err = refused(capsys, ["evaluate", "--model", made["run"], "--data", shards4])
    assert (
        f"{shards4}/shard-00000.parquet: --data: relative_pos_max_distance 4 in the shards, 3 in the run: "
        "compile them with the run's schema"
    ) in err
    # train's --eval-data check is the same comparison, between two sets of shards
    with pytest.raises(GraphattnError, match="relative_pos_max_distance 4 in the --eval-data shards, 3 in the --data"):
        check_shards_match(made["shards"], shards4, flag="--eval-data")
    check_shards_match(made["shards"], made["shards"], flag="--eval-data")  # the same shards fit


def test_eval_shards_without_the_models_targets_are_refused(made):
    # raw --data compiled later with --schema wikihop: only the targets can be compared yet
    with pytest.raises(
        GraphattnError,
        match=r"--eval-data: the --eval-data shards' schema 'hotpotqa' has no target "
        r"'answer' like the model's \(choice\) \(its targets: supporting \(global_labels\), answer \(span\)\)",
    ):
        check_shards_match(None, made["shards"], flag="--eval-data", schema="wikihop")
    check_shards_match(None, made["shards"], flag="--eval-data", schema="hotpotqa", targets=["supporting"])


@pytest.fixture(scope="module")
def other_tokenizer(made) -> str:
    """A 400-id WordPiece tokenizer trained on the example corpus (the run's has 3,000 ids)."""
    path = made["folder"] / "tokenizer-400.json"
    argv = ["tokenizer", "train", str(DATA / "corpus.txt"), "--vocab-size", "400", "--out", str(path), "-q"]
    assert main(argv) == 0
    return str(path)


def test_shards_compiled_with_another_tokenizer_are_refused(made, other_tokenizer, capsys, tmp_path):
    shards = compile_into(tmp_path / "other", made["sample"], made["schema3"], other_tokenizer)
    err = refused(capsys, ["evaluate", "--model", made["run"], "--data", shards])
    assert "--data: tokenizer " in err and "compile them with the run's tokenizer" in err
    assert f"'{other_tokenizer}' (400 ids" in err and f"'{TOKENIZER}' (3000 ids" in err


def test_a_run_that_predates_the_tokenizer_fingerprint_compares_the_model_vocabulary(
    made, other_tokenizer, capsys, tmp_path
):
    run = tmp_path / "old-run"
    run.mkdir()
    for item in Path(made["run"]).iterdir():  # the checkpoint is linked, run.json rewritten without the new keys
        (run / item.name).symlink_to(item)
    (run / "run.json").unlink()
    recorded = json.loads((Path(made["run"]) / "run.json").read_text(encoding="utf-8"))
    del recorded["tokenizer_sha256"], recorded["tokenizer_vocab_size"]
    (run / "run.json").write_text(json.dumps(recorded), encoding="utf-8")
    shards = compile_into(tmp_path / "other", made["sample"], made["schema3"], other_tokenizer)
    err = refused(capsys, ["evaluate", "--model", str(run), "--data", shards])
    assert re.search(r"\(400 ids, sha256 [0-9a-f]{12}\) in the shards, '[^']+' \(3000 ids\) in the run", err), err


def test_shards_without_any_gold_label_are_refused_with_a_pointer_to_predict(made, capsys, tmp_path):
    source = records(tmp_path, "unlabelled.json", [False, False])
    shards = compile_into(tmp_path / "unlabelled", source, made["schema3"])
    err = refused(capsys, ["evaluate", "--model", made["run"], "--data", shards])
    assert (
        "--data: none of the 2 document(s) has a gold label for supporting, answer (compiled from records without "
        f"answers): there is nothing to score; `graphattn predict --model {made['run']} {shards} --out FILE`"
    ) in err


def test_a_partly_labelled_set_is_scored_on_its_labelled_documents(made, capsys, tmp_path):
    source = records(tmp_path, "part.json", [True, False])
    shards = compile_into(tmp_path / "part", source, made["schema3"])
    capsys.readouterr()
    argv = ["evaluate", "--model", made["run"], "--data", shards, "--json", str(tmp_path / "m.json")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "skipped 1 of 2 document(s): no gold label for any target" in out
    assert re.search(r"supporting +set_f1 +sp_f1 [0-9.]+ .* n 1  skipped 1", out), out
    report = json.loads((tmp_path / "m.json").read_text(encoding="utf-8"))
    assert report["skipped_documents"] == 1 and report["documents"] == 2
    for name in ("supporting", "answer"):
        assert report["scores"][name]["n"] == 1 and report["scores"][name]["unlabelled"] == 1
    # the labelled document alone scores what the partly labelled set scores
    alone = compile_into(tmp_path / "alone", records(tmp_path, "one.json", [True]), made["schema3"])
    assert main(["evaluate", "--model", made["run"], "--data", alone, "--json", str(tmp_path / "one.json")]) == 0
    one = json.loads((tmp_path / "one.json").read_text(encoding="utf-8"))
    assert one["scores"]["supporting"]["sp_f1"] == report["scores"]["supporting"]["sp_f1"]
    assert one["skipped_documents"] == 0


def test_an_unlabelled_hotpotqa_record_compiles_to_an_ignored_supporting_target(made, tmp_path):
    from graphattn.shards.dataset import read_instance

    source = records(tmp_path, "part.json", [True, False])
    shards = Path(compile_into(tmp_path / "part", source, made["schema3"]))
    labelled, unlabelled = (read_instance(str(shards / "shard-00000.parquet"), i) for i in (0, 1))
    assert (labelled.targets["supporting"] == 1).any() and (labelled.targets["supporting"] == 0).any()
    assert (unlabelled.targets["supporting"] == -100).all()
    assert int(unlabelled.targets["answer_type"]) == -100


def test_an_nq_record_without_annotations_compiles_to_ignored_targets(tmp_path):
    from graphattn.shards.dataset import ShardDataset

    record = json.loads((DATA / "nq_sample.jsonl").read_text(encoding="utf-8").splitlines()[0])

    def windows(name: str, data: dict) -> list:
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(data) + "\n", encoding="utf-8")
        dataset = ShardDataset(compile_into(tmp_path / name, str(tmp_path / f"{name}.jsonl"), "nq"))
        return [dataset[i].targets for i in range(len(dataset))]

    labelled = windows("labelled", record)
    assert all((t["long_answer"] != -100).any() for t in labelled)  # a long answer or the null global, per window
    unlabelled = windows("unlabelled", {k: v for k, v in record.items() if k != "annotations"})
    assert len(unlabelled) == len(labelled)
    for targets in unlabelled:  # not "no long answer" at the null global: no label at all
        assert (targets["long_answer"] == -100).all()
        assert all(int(targets[f"answer_{part}"]) == -100 for part in ("start", "end", "type"))


def test_train_resume_refuses_shards_the_checkpoint_was_not_trained_on(made, tmp_path):
    from graphattn.train.finetune import fine_tune

    options = dict(hidden_size=32, layers=1, heads=2, batch_size=2, precision="fp32", progress=False, print_fn=None)
    out = tmp_path / "run"
    fine_tune(made["shards"], out, steps=1, **options)
    shards4 = compile_into(tmp_path / "shards4", made["sample"], hotpotqa_schema(tmp_path, 4))
    with pytest.raises(GraphattnError, match="--data: relative_pos_max_distance 4 in the shards, 3 in the run"):
        fine_tune(shards4, out, steps=2, resume=True, **options)
    assert json.loads((out / "run.json").read_text(encoding="utf-8"))["data"][0].startswith(made["shards"])
