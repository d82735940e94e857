"""`graphattn viz`: documents compiled on the way in, outputs by suffix, shards via graphattn.shards.dataset."""

import argparse
import json
import sys
import types

import matplotlib.image
import pytest
from viz_instances import hand_instance

from graphattn.errors import GraphattnError
from graphattn.viz import cli

TEXT = "The quick brown fox jumps. It was lazy.\n\nA dog barked at night."


def run_viz(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="graphattn viz")
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(list(argv)))


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "story.txt"
    path.write_text(TEXT)
    return path


def test_text_document_is_compiled_and_printed(text_file, capsys):
    assert run_viz(str(text_file), "--schema", "etc-sentences") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("labels:") and "belongs" in " ".join(lines[:4])
    rows = [line for line in lines if line.startswith(("G", "L")) and "│" in line]
    assert rows[0].startswith("G0 sentence:") and rows[-1].startswith("L")
    # every sentence global owns at least one token: its row has a `belongs` letter past the bar
    belongs = next(line for line in lines if "=belongs" in line).split("=belongs")[0].split()[-1]
    assert all(belongs in row.split("│")[2] for row in rows if row.startswith("G"))


def test_range_and_plain_style(text_file, capsys):
    assert run_viz(str(text_file), "--schema", "etc-sentences", "--queries", "l0:l4", "--keys", "l0:l6", "--style", "plain") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "■ allowed  □ masked"
    rows = [line for line in lines if "│" in line]
    assert [row.split()[0] for row in rows] == ["L0", "L1", "L2", "L3"]
    assert all(row.split("│")[1].split() == ["■"] * 6 for row in rows)  # radius 84 covers all


def test_docgraph_json_to_png_and_html(tmp_path, capsys):
    from graphattn.ingest.text import text_to_graph

    path = tmp_path / "graph.json"
    path.write_text(json.dumps(text_to_graph(TEXT, doc_id="story").to_dict()))
    png = tmp_path / "out.png"
    assert run_viz(str(path), "--schema", "etc-sentences", "--out", str(png)) == 0
    assert "wrote" in capsys.readouterr().out
    assert matplotlib.image.imread(png).shape[2] == 4
    html = tmp_path / "out.html"
    assert run_viz(str(path), "--schema", "etc-sentences", "--out", str(html), "--queries", "g0:g3") == 0
    page = html.read_text()
    assert 'id="graphattn-meta"' in page and '"initial":[0,3,' in page


def test_errors_name_the_problem(text_file, tmp_path):
    with pytest.raises(GraphattnError, match="--schema is required"):
        run_viz(str(text_file))
    with pytest.raises(GraphattnError, match="--queries 'l0:l999'"):
        run_viz(str(text_file), "--schema", "etc-sentences", "--queries", "l0:l999")
    with pytest.raises(GraphattnError, match="no such file"):
        run_viz(str(tmp_path / "missing.txt"), "--schema", "etc-sentences")
    odd = tmp_path / "doc.xyz"
    odd.write_text("x")
    with pytest.raises(GraphattnError, match="pass --format"):
        run_viz(str(odd), "--schema", "etc-sentences")
    bad = tmp_path / "bad.json"
    bad.write_text('{"text": "a",\n "nodes": [}')
    with pytest.raises(GraphattnError, match=r"bad.json:2: not valid JSON"):
        run_viz(str(bad), "--schema", "etc-sentences")
    with pytest.raises(GraphattnError, match="use .png or .svg"):
        run_viz(str(text_file), "--schema", "etc-sentences", "--out", str(tmp_path / "x.pdf"))


def test_shard_without_graphattn_data_says_what_is_missing(tmp_path, monkeypatch):
    shard = tmp_path / "part-0.parquet"
    shard.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "graphattn.shards.dataset", None)  # as if the module did not exist
    with pytest.raises(GraphattnError, match="needs the graphattn.shards.dataset module"):
        run_viz(str(shard))


def test_shard_instance_is_read_through_graphattn_data(tmp_path, monkeypatch, capsys):
    shard = tmp_path / "part-0.parquet"
    shard.write_bytes(b"")
    asked = []

    def read_instance(path, index, compact=False):
        asked.append((str(path), index, compact))
        return hand_instance((2, 2), radius=1, max_distance=1)

    monkeypatch.setitem(sys.modules, "graphattn.shards.dataset", types.SimpleNamespace(read_instance=read_instance))
    assert run_viz(str(shard), "--instance", "3", "--style", "letters") == 0
    assert asked == [(str(shard), 3, True)]  # the compact form: a long instance never expands
    assert "G1 sentence:s0" in capsys.readouterr().out
