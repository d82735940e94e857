"""The docs stand alone and say what the code does: no pointer outside the repository, examples
that parse and compile, walkthrough commands that print what the walkthrough shows."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    suffixes = (".py", ".md", ".yaml", ".json", ".js", ".html", ".toml", ".txt")
    return [REPO / n for n in names if n.endswith(suffixes) and (REPO / n).is_file() and not (REPO / n).is_symlink()]


def test_no_file_points_outside_the_repository():
    outside = re.compile(
        r"\.\./shared|shared[/]DESIGN|/work/shared|(?<![\w/])DESIGN\.md"
    )  # bare DESIGN.md: the outside file
    offenders = []
    for path in _tracked_text_files():
        if path == Path(__file__):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if outside.search(line.replace("docs/DESIGN.md", "")):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)


def test_design_sections_cited_in_docstrings_exist():
    sections = set(re.findall(r"^## (\d+)\. ", (DOCS / "DESIGN.md").read_text(), re.M))
    cited = set()
    for path in _tracked_text_files():
        cited |= set(re.findall(r"docs/DESIGN\.md §(\d+)", path.read_text(encoding="utf-8", errors="replace")))
    assert cited and cited <= sections, cited - sections


def _json_blocks(text: str) -> list[str]:
    return re.findall(r"```json\n(.*?)```", text, re.S)


def test_docgraph_example_in_formats_parses_and_compiles():
    from graphattn.compile import compile_instance
    from graphattn.graph import DocGraph

    data = json.loads(_json_blocks((DOCS / "FORMATS.md").read_text())[0])
    graph = DocGraph.from_dict(data, source="FORMATS.md")
    instance = compile_instance(graph, "etc-sentences", "default")
    assert instance.global_node_ids == ["s0", "s1"] and graph.span_text("s1") == "It was lazy."


def test_mapping_example_reads_as_the_formats_doc_says(tmp_path):
    from graphattn.ingest.json import read_json
    from graphattn.ingest.mapping import json_graph, load_mapping

    mapping = load_mapping(REPO / "examples" / "data" / "mapping-example.yaml")
    graphs = list(
        read_json(REPO / "examples" / "data" / "mapping-example.jsonl", lambda record: json_graph(record, mapping))
    )
    bridges = graphs[1]
    assert bridges.text == "Bridges of the old town\n\nThe stone bridge is the oldest. Floods never moved it."
    assert sorted(bridges.nodes) == ["doc", "s1", "sentence0", "sentence1", "sentence2"]
    assert bridges.nodes["s1"].attrs == {"heading": "Stone"}
    # the yaml shown in FORMATS.md is the example file, key for key
    shown = re.search(r"```yaml\n(.*?)```", (DOCS / "FORMATS.md").read_text(), re.S).group(1)
    import yaml

    assert yaml.safe_load(shown) == yaml.safe_load((REPO / "examples" / "data" / "mapping-example.yaml").read_text())
    example = REPO / "examples" / "data" / "mapping-example"
    argv = ["compile", f"{example}.jsonl", "--mapping", f"{example}.yaml", "--schema", "etc-sentences", "-q"]
    proc = subprocess.run(["graphattn", *argv, "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("compiled 2 of 2 documents; rejected 0"), proc.stderr


@pytest.mark.slow
def test_walkthrough_commands_print_what_it_shows(tmp_path):
    """Each `$ graphattn ...` block: the command's first output line and exit status."""
    commands = []  # (command, lines it printed) of every `$ ` line in the console blocks
    for block in re.findall(r"```console\n(.*?)```", (DOCS / "WALKTHROUGH.md").read_text(), re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif commands:
                commands[-1][1].append(line)
    runs = [(c, shown) for c, shown in commands if c.startswith("graphattn ")]
    assert len(runs) >= 6
    data = tmp_path / "examples" / "data"
    data.mkdir(parents=True)
    (data / "hotpotqa_sample.json").write_text((REPO / "examples" / "data" / "hotpotqa_sample.json").read_text())
    for command, shown in runs:
        proc = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True)
        assert "Traceback" not in proc.stdout + proc.stderr, command
        printed = (proc.stdout or proc.stderr).splitlines()
        assert printed[0] == shown[0], command
        assert proc.returncode == (1 if "wikihop" in command else 2 if "hotpotq " in command else 0), command
