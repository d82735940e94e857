"""Every benchmark script starts: it imports what it times and answers --help (timings are not tested)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARK_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
BENCHMARKS = sorted(BENCHMARK_DIR.glob("*.py"))


def test_there_are_benchmarks():
    assert len(BENCHMARKS) >= 8


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.name)
def test_a_benchmark_script_imports_and_answers_help(script):
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:"), proc.stdout[:200]


def test_the_compile_benchmark_times_layout_on_every_text_a_cut_asks_for():
    """Its tokenizer-free layout row answers each text from a first run's encodings: a prefix and
    the pieces that grow it, not the whole text's encoding for every call (which a cut refuses)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compile_benchmark", BENCHMARK_DIR / "compile.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tokenizer = bench.load_tokenizer(bench.TOKENIZER)
    schema = bench.load_schema("etc-sentences")
    graph = bench.make_document(200, 4096, tokenizer)
    median, best = bench._layout_without_encode(graph, schema, tokenizer, 1)
    assert median > 0 and best > 0


def test_the_ingest_benchmark_times_its_two_pages_taking_turns():
    """The 10 MB / 100 KB ratio comes from runs that alternate, so a slow minute falls on both."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ingest_benchmark", BENCHMARK_DIR / "ingest.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    order = []
    wall, cpu = bench._interleaved({"small": lambda: order.append("small"), "large": lambda: order.append("large")}, 3)
    assert order == ["small", "large"] * 3
    assert set(wall) == set(cpu) == {"small", "large"} and all(v >= 0 for v in [*wall.values(), *cpu.values()])


def test_the_corpus_benchmark_floor_writes_the_token_ids_of_every_record(tmp_path):
    """The read+encode+write peer really reads each record, encodes its text and writes the ids."""
    import importlib.util

    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    spec = importlib.util.spec_from_file_location("corpus_benchmark", BENCHMARK_DIR / "corpus.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    texts = bench.generate(tmp_path / "records.jsonl", 5)
    seconds, cpu = bench.read_tokenize_write_peer(tmp_path / "records.jsonl", tmp_path / "floor", 2)
    assert seconds > 0 and cpu > 0
    shards = sorted((tmp_path / "floor").glob("*.parquet"))
    assert [len(pq.read_table(p)) for p in shards] == [2, 2, 1]
    written = [ids for p in shards for ids in pq.read_table(p).column("ids").to_pylist()]
    tokenizer = Tokenizer.from_file(str(bench.TOKENIZER))
    assert written == [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]


@pytest.mark.slow
def test_the_hf_masks_benchmark_prints_its_three_tables_at_a_tiny_size():
    """Our BlockMask covers create_block_mask's blocks (full ones equal), with a ratio per row;
    packed vs padded training tokens/s in one run (real tokens, min and median pass, their ratio);
    a tree's token saving on one prompt with 8 completions."""
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK_DIR / "hf_masks.py"), "--quick"], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    rows = [line.split() for line in lines if line.strip().startswith("1024 ")]
    assert [r[1] for r in rows] == ["documents", "tree"]
    assert all(r[-1] == "True" and r[-4].endswith("x") for r in rows), rows
    speed = {
        line.split(",")[0].strip(): line.split()[-3:]
        for line in lines
        if line.strip().startswith(("padded sdpa, batches of 4 documents", "packed graphattn, rows of 1024 tokens"))
    }
    assert set(speed) == {"padded sdpa", "packed graphattn"}, lines
    assert speed["packed graphattn"][0] == "100%" and speed["padded sdpa"][0].endswith("%")
    ratio = next(line.split()[-2:] for line in lines if line.strip().startswith("ratio packed / padded"))
    expected = float(speed["packed graphattn"][1]) / float(speed["padded sdpa"][1])
    assert ratio[0].endswith("x") and abs(float(ratio[0][:-1]) - expected) < 0.01 + 0.01 * expected, (ratio, speed)
    assert any("prefix tree: 192 tokens" in line and "70% fewer tokens" in line for line in lines)
    bad = subprocess.run(
        [sys.executable, str(BENCHMARK_DIR / "hf_masks.py"), "--sizes", "7"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "--sizes: expected 128.." in bad.stderr


def test_the_hf_prompts_benchmark_prints_its_two_tables_at_a_tiny_size():
    """The cached prefill beside the full one (a ratio), the cache's memory, the logits equal to the
    block-mask forward, and N continuations from one prefill giving the repeated prompt's tokens."""
    script = str(BENCHMARK_DIR / "hf_prompts.py")
    proc = subprocess.run([sys.executable, script, "--quick"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any("passages cached" in line and "x less" in line for line in lines), lines
    assert any("cache memory: 0.05 MiB for 48 tokens (1024 bytes/token)" in line for line in lines), lines
    diff = next(line for line in lines if "max |logit - block-mask forward|" in line)
    assert float(diff.split()[-1]) < 1e-4
    assert any("generate_tree 14, repeated prompt 36 (61% fewer)" in line for line in lines), lines
    assert any("same tokens: True" in line for line in lines), lines
    bad = subprocess.run([sys.executable, script, "--passages", "0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--passages: expected 1.." in bad.stderr
