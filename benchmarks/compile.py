"""Compile speed and memory: graph -> ETC inputs, beside tokenizing the same text.

    python benchmarks/compile.py [--quick]

Rows (the ETC-base layout of schemas/etc-sentences.yaml: r=84, k=12, hard g2l):
  * one 4096-token document with 200 sentences (G = 200 of 256): HF `tokenizers` encode of its
    text (the peer: compiling should cost no more), compile_instance() to the eight dense tensors and to
    the compact form, each end to end (tokenization included) and without tokenization, and
    the etcmodel-compatible `side_inputs` primitive on the same breakpoints / sentence ids;
  * docs/s over 1,000 such documents (100 with --quick), tokenize vs compile;
  * a 1,000,000-token document with 60,000 sentences compiled to the compact form: time and
    peak memory (tracemalloc peak of Python/numpy allocations, and the process's max RSS).
Times are medians. Google's TensorFlow reference builds the eight tensors in about 10 ms under
tf.function on 2 cores (28 ms eager), per the project's issue; it is not run here (no TF).
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphattn import collate, compile_instance, load_schema  # noqa: E402
from graphattn.compile.assemble import assemble  # noqa: E402
from graphattn.compile.compiler import _prepare  # noqa: E402
from graphattn.compile.layout import build_layout  # noqa: E402
from graphattn.compile.side_inputs import side_inputs  # noqa: E402
from graphattn.compile.truncate import select  # noqa: E402
from graphattn.graph import DocGraph  # noqa: E402
from graphattn.tokenize import load_tokenizer  # noqa: E402

TOKENIZER = ROOT / "examples" / "data" / "tokenizer.json"
CORPUS = ROOT / "examples" / "data" / "corpus.txt"


def make_document(n_sentences: int, target_tokens: int, tokenizer, seed: int = 0, doc_id: str = "bench") -> DocGraph:
    """Sentences of corpus words, sized so the text is about `target_tokens` wordpieces."""
    words = CORPUS.read_text(encoding="utf-8").split()
    rng = np.random.default_rng(seed)
    probe = " ".join(words[:2000])
    pieces_per_word = len(tokenizer.encode(probe)) / 2000
    per_sentence = max(1, round(target_tokens / pieces_per_word / n_sentences))
    starts = rng.integers(0, len(words) - per_sentence, size=n_sentences)
    sentences = [" ".join(words[s : s + per_sentence]) for s in starts]
    lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=n_sentences)
    begins = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])
    text = " ".join(sentences)
    graph = DocGraph(text, doc_id=doc_id)
    graph.add_node("doc", "document", (0, len(text)))
    for i in range(n_sentences):
        graph.add_child("doc", f"s{i}", "sentence", (int(begins[i]), int(begins[i] + lengths[i])))
    return graph


def median_ms(fn, repeat: int) -> tuple[float, float]:
    """(median, best) of `repeat` runs in ms; the best is the steadier figure on a busy machine."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3, float(np.min(times)) * 1e3


def one_document(schema, tokenizer, repeat: int) -> list[tuple[str, float]]:
    graph = make_document(200, 4096, tokenizer)
    schema, tokenizer, table = _prepare(schema, tokenizer)
    raw = tokenizer.tokenizer
    text = graph.text
    layout = build_layout(graph, schema, tokenizer)
    selection = select([layout], schema)
    compact = assemble([layout], selection, schema, table, compact=True)
    L, G = compact.long_length, compact.global_length
    pad_long, pad_global = max(L, schema.max_long_length), max(G, schema.max_global_length)
    owners = np.zeros(pad_long, np.int32)
    owners[:L] = compact.side.owners[0]
    long_bp = np.zeros((1, pad_long), np.int32)
    long_bp[0, L - 1] = 1
    global_bp = np.zeros((1, pad_global), np.int32)
    global_bp[0, G - 1] = 1

    def etc_primitive(long_bp, global_bp, owners):
        k = schema.relative_pos_max_distance
        return side_inputs(long_bp, global_bp, owners[None], schema.local_radius, k, use_hard_g2l_mask=True)

    print(f"document: {L} long tokens, {G} globals, r={schema.local_radius}, k={schema.relative_pos_max_distance}")
    return [
        ("HF tokenizers encode (peer)", median_ms(lambda: raw.encode(text, add_special_tokens=False), repeat)),
        (
            "compile -> 8 dense tensors, end to end",
            median_ms(lambda: compile_instance(graph, schema, tokenizer), repeat),
        ),
        (
            "compile -> compact, end to end",
            median_ms(lambda: compile_instance(graph, schema, tokenizer, compact=True), repeat),
        ),
        (
            "  compile after tokenizing (layout w/o encode + dense)",
            _sum(
                median_ms(lambda: assemble([layout], selection, schema, table), repeat),
                _layout_without_encode(graph, schema, tokenizer, repeat),
            ),
        ),
        ("  8 dense tensors from compact (to_dense)", median_ms(lambda: compact.side.to_dense(), repeat)),
        (
            f"  8 tensors padded to L={pad_long}, G={pad_global} (collate)",
            median_ms(lambda: collate([compact], pad_to_long=pad_long, pad_to_global=pad_global), repeat),
        ),
        (
            f"  etcmodel-compatible side_inputs, L={pad_long}, G={pad_global} (peer)",
            median_ms(lambda: etc_primitive(long_bp, global_bp, owners), repeat),
        ),
    ]


def _sum(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] + b[0], a[1] + b[1]


def _layout_without_encode(graph, schema, tokenizer, repeat: int) -> tuple[float, float]:
    """build_layout time minus the tokenizer calls inside it: each text it asks for (the whole
    text, or the prefix and pieces of a cut) is answered from a first run's encodings."""

    class Recorded:
        def __init__(self, inner):
            self.inner, self.seen = inner, {}

        def encode(self, text):
            if text not in self.seen:
                self.seen[text] = self.inner.encode(text)
            return self.seen[text]

        def encode_batch(self, texts):
            return [self.encode(text) for text in texts]

        def __getattr__(self, name):
            return getattr(self.inner, name)

    recorded = Recorded(tokenizer)
    build_layout(graph, schema, recorded)  # records what is asked
    return median_ms(lambda: build_layout(graph, schema, recorded), repeat)


def throughput(schema, tokenizer, n_docs: int) -> list[tuple[str, float]]:
    graphs = [make_document(200, 4096, tokenizer, seed=i, doc_id=f"d{i}") for i in range(min(n_docs, 20))]
    raw = tokenizer.tokenizer
    start = time.perf_counter()
    for i in range(n_docs):
        raw.encode(graphs[i % len(graphs)].text, add_special_tokens=False)
    tokenize_s = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(n_docs):
        compile_instance(graphs[i % len(graphs)], schema, tokenizer)
    compile_s = time.perf_counter() - start
    return [
        (f"tokenize {n_docs} docs (docs/s)", n_docs / tokenize_s),
        (f"compile {n_docs} docs, dense (docs/s)", n_docs / compile_s),
    ]


def million(schema_raw: dict, tokenizer, n_tokens: int, n_sentences: int) -> list[tuple[str, float]]:
    schema = load_schema({**schema_raw, "max_long_length": 2 * n_tokens, "max_global_length": 2 * n_sentences})
    start = time.perf_counter()
    graph = make_document(n_sentences, n_tokens, tokenizer, doc_id="million")
    build_s = time.perf_counter() - start
    gc.collect()
    start = time.perf_counter()
    inst = compile_instance(graph, schema, tokenizer, compact=True)
    seconds = time.perf_counter() - start
    del inst
    gc.collect()
    tracemalloc.start()  # a second run for memory: tracing slows allocation down
    inst = compile_instance(graph, schema, tokenizer, compact=True)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"1M case: {inst.long_length} long tokens, {inst.global_length} globals; "
        f"compact side inputs {inst.side.nbytes / 2**20:.1f} MiB; "
        f"dense would need {8 * inst.long_length * inst.global_length / 2**30:.0f} GiB for l2g+g2l"
    )
    return [
        ("1M doc: build the DocGraph (s)", build_s),
        ("1M doc: compile -> compact, incl. tokenizing (s)", seconds),
        ("1M doc: tracemalloc peak during compile (MiB)", peak / 2**20),
        ("1M doc: process max RSS (MiB)", rss_mb),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, 100 docs, a 100K-token long case")
    parser.add_argument("--schema", default="etc-sentences")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(TOKENIZER)
    schema = load_schema(args.schema)
    repeat, n_docs = (20, 100) if args.quick else (100, 1000)
    rows = one_document(schema, tokenizer, repeat)
    base_median, base_best = rows[0][1]
    print(f"\n{'4096 tokens / 200 sentences':58s} {'median ms':>10s} {'x tok':>6s} {'best ms':>8s} {'x tok':>6s}")
    for name, (median, best) in rows:
        print(f"{name:58s} {median:10.2f} {median / base_median:6.2f} {best:8.2f} {best / base_best:6.2f}")
    rows = throughput(schema, tokenizer, n_docs)
    print(f"\n{'throughput':58s} {'docs/s':>9s} {'x tokenize':>11s}")
    for name, rate in rows:
        print(f"{name:58s} {rate:9.1f} {rate / rows[0][1]:11.2f}")
    import yaml

    raw = yaml.safe_load(Path(schema.source).read_text()) if schema.source else {}
    n_tokens, n_sentences = (100_000, 6_000) if args.quick else (1_000_000, 60_000)
    print()
    for name, value in million(raw, tokenizer, n_tokens, n_sentences):
        print(f"{name.replace('1M', f'{n_tokens // 1000}K') if args.quick else name:58s} {value:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
