"""`graphattn predict` and `graphattn.train.Predictor` on tiny runs of the bundled samples:
records and shards give the same lines, answers are whole words of their documents, the
HotpotQA file has the official structure, evaluate scores what predict writes, and the errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from graphattn.cli import main
from graphattn.errors import GraphattnError
from graphattn.train import metrics as m

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
TOKENIZER = str(DATA / "tokenizer.json")
HOTPOT = DATA / "hotpotqa_sample.json"
TINY = ["--hidden-size", "32", "--layers", "1", "--heads", "2", "--batch-size", "2", "--lr", "3e-3"]
TINY += ["--dropout", "0", "--precision", "fp32", "--no-progress"]


def compiled(source: Path, schema: str, out: Path) -> Path:
    assert main(["compile", str(source), "--schema", schema, "--tokenizer", TOKENIZER, "--out", str(out), "-q"]) == 0
    return out


def trained(shards: Path, out: Path, steps: int) -> Path:
    assert main(["train", "--data", str(shards), "--out", str(out), "--steps", str(steps), *TINY]) == 0
    return out


@pytest.fixture(scope="module")
def hotpot(tmp_path_factory) -> tuple[Path, Path]:
    """(shards, run) of the HotpotQA sample, trained 12 steps."""
    base = tmp_path_factory.mktemp("hotpot")
    shards = compiled(HOTPOT, "hotpotqa", base / "shards")
    return shards, trained(shards, base / "run", 12)


@pytest.fixture(scope="module")
def openkp(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("openkp")
    shards = compiled(DATA / "openkp_sample.jsonl", "openkp-dom", base / "shards")
    return shards, trained(shards, base / "run", 2)


def predict(capsys, *argv) -> tuple[int, str, str]:
    code = main(["predict", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def texts_of(source: Path) -> dict[str, str]:
    """Each document's text as the reader builds it (what char offsets index)."""
    from graphattn.ingest.json import read_json

    return {g.doc_id: g.text for g in read_json(str(source), "hotpotqa")}


def assert_whole_words(text: str, answer: dict) -> None:
    start, end = answer["char_start"], answer["char_end"]
    assert 0 <= start < end <= len(text) and text[start:end] == answer["text"]
    assert not (start > 0 and text[start - 1].isalnum() and text[start].isalnum()), answer
    assert not (end < len(text) and text[end - 1].isalnum() and text[end].isalnum()), answer


def test_records_and_shards_give_the_same_lines_of_whole_word_answers(hotpot, tmp_path, capsys):
    shards, run = hotpot
    code, out, _ = predict(capsys, "--model", run, HOTPOT, "--out", tmp_path / "raw.jsonl", "--n-best", 8)
    assert code == 0 and "predicted 2 of 2 document(s)" in out and "documents/s" in out
    assert predict(capsys, "--model", run, shards, "--out", tmp_path / "shards.jsonl", "--n-best", 8, "-q")[0] == 0
    raw = lines(tmp_path / "raw.jsonl")
    assert raw == lines(tmp_path / "shards.jsonl")
    texts = texts_of(HOTPOT)
    assert [r["id"] for r in raw] == list(texts)
    for record in raw:
        answer = record["answer"]
        assert answer["type"] in ("null", "span", "yes", "no") and len(answer["n_best"]) == 8
        for candidate in answer["n_best"]:
            assert_whole_words(texts[record["id"]], candidate)
        if answer["type"] == "span":
            assert_whole_words(texts[record["id"]], answer)
        assert answer["n_best"][0]["score"] >= answer["n_best"][-1]["score"]
        support = record["supporting"]
        assert len(support["node_ids"]) == len(support["scores"]) == len(support["facts"])
        assert "truncation" not in record  # the sample fits


def test_the_hotpotqa_file_has_the_official_structure(hotpot, tmp_path, capsys):
    shards, run = hotpot
    out = tmp_path / "pred.json"
    code, printed, _ = predict(capsys, "--model", run, shards, "--out", out, "--format", "hotpotqa", "-q")
    assert code == 0 and "wrote 2 prediction(s)" in printed
    # what hotpot_evaluate_v1.py's eval() reads: prediction['answer'][id] and set(map(tuple, prediction['sp'][id]))
    prediction = json.loads(out.read_text(encoding="utf-8"))
    assert set(prediction) == {"answer", "sp"}
    gold = json.loads(HOTPOT.read_text(encoding="utf-8"))
    for dp in gold:
        assert isinstance(prediction["answer"][dp["_id"]], str)
        facts = set(map(tuple, prediction["sp"][dp["_id"]]))
        sentences = {title: len(sents) for title, sents in dp["context"]}
        for title, index in facts:  # never a sentence the document does not have
            assert isinstance(index, int) and 0 <= index < sentences[title]


def test_evaluate_scores_the_answers_predict_writes(hotpot, tmp_path, capsys):
    from graphattn.train.evaluate import evaluate_model

    shards, run = hotpot
    assert predict(capsys, "--model", run, shards, "--out", tmp_path / "p.jsonl", "-q")[0] == 0
    records = {r["id"]: r for r in lines(tmp_path / "p.jsonl")}
    gold = {dp["_id"]: dp for dp in json.loads(HOTPOT.read_text(encoding="utf-8"))}
    answers = [m.answer_scores(records[i]["answer"]["text"], gold[i]["answer"]) for i in gold]
    facts = [
        m.set_scores(set(map(tuple, records[i]["supporting"]["facts"])), set(map(tuple, gold[i]["supporting_facts"])))
        for i in gold
    ]
    report = evaluate_model(str(run), [str(shards)]).scores
    for key, value in m.mean_scores(answers).items():
        assert report["answer"][key] == pytest.approx(value), key
    for key, value in m.mean_scores(facts).items():
        assert report["supporting"][f"sp_{key}"] == pytest.approx(value), key


def test_the_python_api_reads_records_graphs_and_files_alike(hotpot, tmp_path):
    from graphattn.ingest.json import read_json
    from graphattn.train import Predictor

    shards, run = hotpot
    said = []
    predictor = Predictor.from_run(run, batch_size=1, progress=False, print_fn=said.append)
    from_file = list(predictor.predict(str(HOTPOT)))
    assert predictor.stats.predicted == 2 and said and said[-1].startswith("predicted 2 of 2 document(s)")
    from_records = list(predictor.predict(json.loads(HOTPOT.read_text(encoding="utf-8"))))
    from_graphs = list(predictor.predict(list(read_json(str(HOTPOT), "hotpotqa"))))
    batched = Predictor.from_run(run, batch_size=8, progress=False, print_fn=said.append)
    from_shards = list(batched.predict(str(shards)))
    strip = lambda records: [{k: v for k, v in r.items() if k not in ("source", "line")} for r in records]  # noqa: E731
    assert strip(from_file) == strip(from_records) == strip(from_graphs) == strip(from_shards)
    assert {r["source"] for r in from_records + from_graphs} == {"<python>"}
    streamed = list(predictor.predict(iter(json.loads(HOTPOT.read_text(encoding="utf-8")))))  # a generator of records
    assert strip(streamed) == strip(from_file)
    with pytest.raises(GraphattnError, match=r"documents\[1\]: expected a record"):
        list(predictor.predict([{"_id": "x"}, 3]))
    with pytest.raises(GraphattnError, match="no documents to predict"):
        list(predictor.predict([]))


def test_keyphrases_are_whole_words_ranked_and_distinct(openkp, tmp_path, capsys):
    shards, run = openkp
    assert predict(capsys, "--model", run, shards, "--out", tmp_path / "k.jsonl", "--n-best", 5, "-q")[0] == 0
    records = lines(tmp_path / "k.jsonl")
    assert len(records) == 2
    from graphattn.shards.dataset import ShardDataset

    texts = {inst.doc_ids[0]: inst.texts[0] for inst in ShardDataset(str(shards))}
    for record in records:
        phrases = record["keyphrases"]
        assert 1 <= len(phrases) <= 5
        assert len({m.keyphrase_key(p["text"]) for p in phrases}) == len(phrases)
        assert [p["score"] for p in phrases] == sorted((p["score"] for p in phrases), reverse=True)
        for phrase in phrases:
            assert_whole_words(texts[record["id"]], phrase)
    official = tmp_path / "openkp.jsonl"
    assert predict(capsys, "--model", run, shards, "--out", official, "--format", "openkp", "-q")[0] == 0
    candidates = lines(official)  # what OpenKP's evaluation reads: url and KeyPhrases, lists of words
    assert [c["url"] for c in candidates] == [r["id"] for r in records]
    for candidate, record in zip(candidates, records):
        assert candidate["KeyPhrases"] == [p["text"].split() for p in record["keyphrases"]]


def test_errors_are_one_line_and_exit_codes_say_what_happened(hotpot, tmp_path, capsys):
    shards, run = hotpot
    out = tmp_path / "p.jsonl"

    def refused(message: str, *argv) -> None:
        code, _, err = predict(capsys, *argv)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()

    refused("no such file or directory", "--model", run, tmp_path / "missing.json", "--out", out)
    refused("--model", "--model", tmp_path / "norun", HOTPOT, "--out", out)
    refused("--format nq: NQ's official prediction file", "--model", run, HOTPOT, "--out", out, "--format", "nq")
    refused("does not exist", "--model", run, HOTPOT, "--out", tmp_path / "no" / "p.jsonl")
    wikihop = compiled(DATA / "wikihop_sample.json", "wikihop", tmp_path / "wikihop")
    # shards of another schema than the run's
    refused("the inputs: the shards' schema 'wikihop' has no target", "--model", run, wikihop, "--out", out)
    refused("--format wikihop needs a choice target", "--model", run, HOTPOT, "--out", out, "--format", "wikihop")
    (tmp_path / "empty").mkdir()
    refused("no document files found in", "--model", run, tmp_path / "empty", "--out", out)
    refused("mix compiled shards", "--model", run, shards, HOTPOT, "--out", out)
    from tokenizers import Tokenizer

    other = Tokenizer.from_file(TOKENIZER)
    other.add_tokens(["zzyzx"])  # one id more: another tokenizer
    other.save(str(tmp_path / "other.json"))
    refused(
        "is not the tokenizer the run was trained with",
        "--model",
        run,
        HOTPOT,
        "--out",
        out,
        "--tokenizer",
        tmp_path / "other.json",
    )


def test_a_document_that_does_not_compile_is_named_and_the_exit_code_is_1(hotpot, tmp_path, capsys):
    _, run = hotpot
    good = json.loads(HOTPOT.read_text(encoding="utf-8"))
    source = tmp_path / "three.jsonl"
    bad = {"_id": "broken", "question": "?", "context": "not a list", "answer": "x"}
    source.write_text("\n".join(json.dumps(r) for r in [good[0], bad, good[1]]) + "\n", encoding="utf-8")
    code, out, err = predict(
        capsys, "--model", run, source, "--out", tmp_path / "p.jsonl", "--input-format", "hotpotqa"
    )
    assert code == 1, err
    assert "predicted 2 of 3 document(s)" in out
    assert f"not predicted: {source}:2 (document 1)" in err and "1 of 3 document(s) got no prediction" in err
    assert [r["id"] for r in lines(tmp_path / "p.jsonl")] == ["sample-hotpot-1", "sample-hotpot-2"]


def test_a_run_whose_tokenizer_path_is_gone_asks_for_it(hotpot, tmp_path, capsys, monkeypatch):
    _, run = hotpot
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    recorded = json.loads((copy / "run.json").read_text())
    recorded["tokenizer"] = "moved/tokenizer.json"
    (copy / "run.json").write_text(json.dumps(recorded))
    assert (copy / "tokenizer.json").is_file()  # train kept the tokenizer: the recorded path is not needed
    assert predict(capsys, "--model", copy, HOTPOT, "--out", tmp_path / "p.jsonl")[0] == 0
    (copy / "tokenizer.json").unlink()
    code, _, err = predict(capsys, "--model", copy, HOTPOT, "--out", tmp_path / "p.jsonl")
    assert code == 2 and "tokenizer 'moved/tokenizer.json': no such file" in err and "--tokenizer" in err
    assert predict(capsys, "--model", copy, HOTPOT, "--out", tmp_path / "p.jsonl", "--tokenizer", TOKENIZER)[0] == 0


def test_windows_are_merged_into_one_record_per_document(tmp_path, capsys):
    schema = (Path(__file__).resolve().parents[2] / "graphattn" / "schemas" / "nq.yaml").read_text(encoding="utf-8")
    schema = schema.replace("max_long_length: 4096", "max_long_length: 96").replace("stride: 2048", "stride: 48")
    (tmp_path / "nq-small.yaml").write_text(schema, encoding="utf-8")
    source = DATA / "nq_sample.jsonl"
    shards = compiled(source, str(tmp_path / "nq-small.yaml"), tmp_path / "shards")
    run = trained(shards, tmp_path / "run", 1)
    code, out, err = predict(capsys, "--model", run, source, "--out", tmp_path / "p.jsonl", "-q")
    assert code == 0, err
    records = lines(tmp_path / "p.jsonl")
    from graphattn.ingest.json import read_json

    graphs = list(read_json(str(source), "nq"))
    assert [r["id"] for r in records] == [g.doc_id for g in graphs] and "predicted 2 of 2 document(s)" in out
    for record, graph in zip(records, graphs):
        assert record["windows"] > 1  # several instances, one record
        for answer in record["answer"]["n_best"]:
            assert_whole_words(graph.text, answer)
        chosen = record["long_answer"]
        assert chosen["node_id"] is None or graph.node(chosen["node_id"]).type == "candidate"
        keys = [(a["char_start"], a["char_end"]) for a in record["answer"]["n_best"]]
        assert len(keys) == len(set(keys))  # windows overlap: a span they share is listed once


def test_a_candidate_is_chosen_for_records_without_an_answer(tmp_path, capsys):
    shards = compiled(DATA / "wikihop_sample.json", "wikihop", tmp_path / "shards")
    run = trained(shards, tmp_path / "run", 1)
    records = json.loads((DATA / "wikihop_sample.json").read_text(encoding="utf-8"))
    for record in records:
        del record["answer"]
    (tmp_path / "unlabelled.json").write_text(json.dumps(records), encoding="utf-8")
    code, _, err = predict(capsys, "--model", run, tmp_path / "unlabelled.json", "--out", tmp_path / "p.jsonl", "-q")
    assert code == 0, err
    for record, predicted in zip(records, lines(tmp_path / "p.jsonl")):
        answer = predicted["answer"]
        assert answer["node_id"].startswith("c") and answer["text"].lower() in {c.lower() for c in record["candidates"]}
        assert answer["score"] is not None and answer["score"] > -1e30  # scored, not the masked floor
    official = tmp_path / "wikihop.json"
    unlabelled = tmp_path / "unlabelled.json"
    code, _, err = predict(capsys, "--model", run, unlabelled, "--out", official, "--format", "wikihop")
    assert code == 0, err
    chosen = json.loads(official.read_text(encoding="utf-8"))  # QAngaroo's form: {id: answer}
    assert chosen == {r["id"]: r["answer"]["text"] for r in lines(tmp_path / "p.jsonl")}


def test_a_cut_document_says_so_and_names_only_sentences_it_kept(tmp_path, capsys):
    schema = (Path(__file__).resolve().parents[2] / "graphattn" / "schemas" / "hotpotqa.yaml").read_text("utf-8")
    (tmp_path / "short.yaml").write_text(schema.replace("max_long_length: 4096", "max_long_length: 160"), "utf-8")
    shards = compiled(HOTPOT, str(tmp_path / "short.yaml"), tmp_path / "shards")
    run = trained(shards, tmp_path / "run", 1)
    out = tmp_path / "p.jsonl"
    assert predict(capsys, "--model", run, HOTPOT, "--out", out, "-q")[0] == 0
    gold = {dp["_id"]: dict(dp["context"]) for dp in json.loads(HOTPOT.read_text(encoding="utf-8"))}
    for record in lines(out):
        report = record["truncation"]
        assert report["long_tokens_after"] < report["long_tokens_before"] and report["messages"]
        dropped = set(report["dropped_nodes"])
        for node, (title, index) in zip(record["supporting"]["node_ids"], record["supporting"]["facts"]):
            assert node not in dropped and 0 <= index < len(gold[record["id"]][title])
    # every sentence a record could name, whatever the model says: its title and index exist in the record
    from graphattn.shards.dataset import ShardDataset
    from graphattn.train.predict_records import HOTPOT_SENTENCE, _title

    for inst in ShardDataset(str(shards)):
        ids, context = inst.global_node_ids, gold[inst.doc_ids[0]]
        sentences = [found for node in ids if (found := HOTPOT_SENTENCE.fullmatch(node))]
        assert sentences
        for found in sentences:
            title = _title(inst, ids.index(f"p{found[1]}.title"))
            assert 0 <= int(found[2]) < len(context[title])


def test_evaluate_scores_the_keyphrases_predict_writes(openkp, tmp_path, capsys):
    from graphattn.train.evaluate import evaluate_model

    shards, run = openkp
    assert predict(capsys, "--model", run, shards, "--out", tmp_path / "k.jsonl", "-q")[0] == 0
    records = {r["id"]: r for r in lines(tmp_path / "k.jsonl")}
    gold = {}
    for line in (DATA / "openkp_sample.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        phrases = record["KeyPhrases"]  # a list of word lists, or (as OpenKP ships VDOM) that list as a JSON string
        phrases = json.loads(phrases) if isinstance(phrases, str) else phrases
        gold[record["url"]] = [" ".join(words) for words in phrases]
    rows = [m.keyphrase_scores([p["text"] for p in records[url]["keyphrases"]], gold[url]) for url in gold]
    assert any(row["p@1"] > 0 for row in rows)  # the run has learned something to agree on
    report = evaluate_model(str(run), [str(shards)]).scores["keyphrases"]
    for key, value in m.mean_scores(rows).items():
        assert report[key] == pytest.approx(value), key
