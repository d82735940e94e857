"""One registry of document formats: compile, viz and train read the same inputs, told apart the
same way, and say the same things about the ones they cannot read."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from ingest_samples import HOTPOT, NQ, WIKIHOP

from graphattn.cli import main
from graphattn.corpus.sources import plan_file
from graphattn.errors import GraphattnError, IngestError
from graphattn.ingest.formats import FORMATS, read_documents, sniff_format
from graphattn.viz.cli import load_instance, read_document

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
OPENKP = json.loads((DATA / "openkp_sample.jsonl").read_text().splitlines()[1])
pytestmark = pytest.mark.filterwarnings("ignore::graphattn.errors.LabelWarning")


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    out = {}
    for name, record in (("hotpotqa", HOTPOT), ("wikihop", WIKIHOP), ("nq", NQ), ("openkp", OPENKP)):
        path = tmp_path / f"{name}.jsonl.gz"
        with gzip.open(path, "wt") as handle:
            handle.write(json.dumps(record) + "\n" + json.dumps(record) + "\n")
        out[name] = path
    graph = {
        "doc_id": "g",
        "text": "One. Two.",
        "nodes": [{"id": "s0", "type": "sentence", "span": [0, 4]}],
        "edges": [],
    }
    (tmp_path / "graphs.json").write_text(json.dumps([graph, graph]))
    out["docgraph"] = tmp_path / "graphs.json"
    (tmp_path / "page.html").write_text("<html><body><p>Hello page.</p></body></html>")
    out["html"] = tmp_path / "page.html"
    (tmp_path / "notes.txt").write_text("Plain text here.")
    out["text"] = tmp_path / "notes.txt"
    return out


def test_compile_and_viz_tell_every_format_apart_the_same_way(files):
    for name, path in files.items():
        assert plan_file(str(path)).format == name, name
        graphs = list(read_documents(path))
        assert len(graphs) == (1 if FORMATS[name].per_file else 2), name
        assert read_document(path, "auto", 0).to_dict() == graphs[0].to_dict(), name  # viz reads what compile reads


def test_keys_decide_the_record_format():
    assert [sniff_format([record]) for record in (HOTPOT, WIKIHOP, NQ, OPENKP)] == [
        "hotpotqa",
        "wikihop",
        "nq",
        "openkp",
    ]
    assert sniff_format([{"title": "t"}]) is None


def test_the_same_messages_for_what_cannot_be_read(tmp_path):
    odd = tmp_path / "doc.xyz"
    odd.write_text("x")
    unknown = tmp_path / "other.jsonl"
    unknown.write_text('{"title": "t", "body": "b"}\n')
    for path, message in (
        (odd, "cannot tell how to read a .xyz file; pass --format"),
        (unknown, "cannot tell the JSON record format from its keys (body, title)"),
    ):
        assert message in plan_file(str(path)).problem[1]
        with pytest.raises(IngestError, match=message.replace("(", r"\(").replace(")", r"\)")):
            read_document(path, "auto")
    with pytest.raises(IngestError, match="no such file"):
        list(read_documents(tmp_path / "missing.json"))


def test_viz_draws_from_a_shard_directory_counting_across_its_shards(files, tmp_path, capsys):
    out = tmp_path / "shards"
    assert (
        main(
            [
                "compile",
                str(files["hotpotqa"]),
                "--schema",
                "hotpotqa",
                "--tokenizer",
                "default",
                "--out",
                str(out),
                "--shard-size",
                "1",
                "-q",
            ]
        )
        == 0
    )
    assert len(list(out.glob("*.parquet"))) == 2
    second = load_instance(out, index=1)
    assert "shard-00001.parquet row 0" in second.where and second.instance.global_node_ids[0] == "<cls>"
    with pytest.raises(GraphattnError, match="--instance 5 is out of range: the 2 shards hold 2"):
        load_instance(out, index=5)
    assert main(["viz", str(out), "--instance", "1", "--out", str(tmp_path / "mask.png"), "-q"]) == 0
    assert (tmp_path / "mask.png").is_file()
