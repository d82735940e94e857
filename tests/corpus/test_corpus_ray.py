"""The Ray engine on a local Ray instance with 2 CPUs: its shards equal the local engine's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from corpus_helpers import TOKENIZER, directory_bytes, make_corpus, small_schema

from graphattn.corpus.output import OutputDir
from graphattn.corpus.pipeline import CompileOptions, run_compile

ray = pytest.importorskip("ray", reason="Ray is the optional graphattn[ray] extra")


def test_ray_engine_writes_the_local_engines_bytes(tmp_path):
    expected = make_corpus(tmp_path / "docs", seed=2)
    schema = small_schema(tmp_path / "small.yaml")
    common = dict(inputs=[str(tmp_path / "docs")], schema=schema, tokenizer=TOKENIZER, shard_size=6, progress=False)
    local = run_compile(CompileOptions(out=str(tmp_path / "local"), **common), print_fn=None)
    try:
        distributed = run_compile(
            CompileOptions(out=str(tmp_path / "ray"), engine="ray", workers=2, **common), print_fn=None
        )
    except Exception as err:  # noqa: BLE001
        if "could not start or join" in str(err):
            pytest.skip(f"a local Ray instance cannot start on this machine: {err}")
        raise
    assert not ray.is_initialized(), "the engine stops the Ray instance it started"
    assert distributed.documents == local.documents == len(expected)
    assert distributed.shards == local.shards > 2
    assert directory_bytes(tmp_path / "ray") == directory_bytes(tmp_path / "local")

    # --resume on the Ray engine: the actors compile only the shards without a valid marker.
    out = OutputDir(tmp_path / "ray")
    out.marker_path(1).unlink()
    shard = out.shard_path(2)
    shard.write_bytes(shard.read_bytes()[:-10])  # a torn file: its marker no longer matches
    options = CompileOptions(out=str(tmp_path / "ray"), engine="ray", workers=2, resume=True, **common)
    resumed = run_compile(options, print_fn=None)
    assert (resumed.shards_resumed, resumed.compiled_documents) == (local.shards - 2, 12)
    assert directory_bytes(tmp_path / "ray") == directory_bytes(tmp_path / "local")


def test_the_local_engine_never_imports_ray(tmp_path):
    make_corpus(tmp_path / "docs", seed=3)
    docs = tmp_path / "docs" / "a_docs.jsonl"  # DocGraph records: no spaCy to load, a short subprocess
    code = (
        "import sys\n"
        "from graphattn.cli import main\n"
        f"assert main(['compile', {str(docs)!r}, '--schema', 'etc-sentences', '--out', {str(tmp_path / 'out')!r},"
        f" '--tokenizer', {TOKENIZER!r}, '--workers', '2', '--shard-size', '10', '--quiet']) == 0\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_the_local_instance_runs_actors_at_the_drivers_priority():
    """Ray starts workers at niceness 15; on a machine shared with other work, actors at that
    priority would yield to every other process while the local engine's workers do not."""
    from graphattn.corpus.ray_engine import start_ray

    try:
        assert start_ray(1, None), "no Ray instance was running, so this call started one"
    except Exception as err:  # noqa: BLE001
        if "could not start or join" in str(err):
            pytest.skip(f"a local Ray instance cannot start on this machine: {err}")
        raise
    try:
        niceness = ray.get(ray.remote(num_cpus=1)(lambda: os.nice(0)).remote())
        assert niceness == os.nice(0)
    finally:
        ray.shutdown()
