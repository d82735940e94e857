"""`graphattn viz`: documents compiled on the way in, outputs by suffix, shards via graphattn.shards.dataset."""

import argparse
import json
import subprocess
import sys

import matplotlib.image
import pytest

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
    assert (
        run_viz(
            str(text_file), "--schema", "etc-sentences", "--queries", "l0:l4", "--keys", "l0:l6", "--style", "plain"
        )
        == 0
    )
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


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    from graphattn.corpus.pipeline import CompileOptions, run_compile

    root = tmp_path_factory.mktemp("viz-shard")
    for name, text in (("a.txt", TEXT), ("b.txt", "One more sentence here. And the last one.")):
        (root / name).write_text(text)
    run_compile(
        CompileOptions(
            inputs=[str(root / "a.txt"), str(root / "b.txt")],
            schema="etc-sentences",
            out=str(root / "out"),
            progress=False,
        ),
        print_fn=None,
    )
    return root / "out" / "shard-00000.parquet"


def test_shard_instance_is_read_compact_and_without_torch(shard):
    code = (
        "import sys; from graphattn.cli import main; "
        f"assert main(['viz', {str(shard)!r}, '--instance', '0', '--style', 'letters']) == 0; "
        "print('torch loaded' if 'torch' in sys.modules else 'no torch')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "G0 sentence:" in out and out.rstrip().endswith("no torch")
    with pytest.raises(GraphattnError, match="instance 5 is out of range: the shard holds 1"):
        run_viz(str(shard), "--instance", "5")


def test_an_instance_of_a_shard_directory_is_found_in_the_shard_that_holds_it(tmp_path):
    texts = ["Alpha bravo. Charlie delta.", "Echo foxtrot golf. Hotel.", "India juliett. Kilo lima mike."]
    for i, text in enumerate(texts):
        (tmp_path / f"d{i}.txt").write_text(text)
    out = tmp_path / "out"
    compile_cmd = ["graphattn", "compile", str(tmp_path), "--schema", "etc-sentences", "--out", str(out)]
    subprocess.run([*compile_cmd, "--shard-size", "1", "-q"], check=True, capture_output=True)
    assert len(list(out.glob("*.parquet"))) == 3
    for index in range(3):
        proc = subprocess.run(
            ["graphattn", "viz", str(out), "--instance", str(index), "--style", "letters"],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        assert f"instance {index} (shard-0000{index}.parquet row 0)" in proc.stdout + proc.stderr
    proc = subprocess.run(["graphattn", "viz", str(out), "--instance", "3"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--instance 3 is out of range: the 3 shards hold 3" in proc.stderr
    assert "Traceback" not in proc.stderr
