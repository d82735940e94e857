"""Benchmark: graphattn structures for Hugging Face models.

1. Building a batch's FlexAttention BlockMask from the structure (graphattn.hf.flex.build_block_mask:
   the structure's tiles, O(N + blocks)) beside torch's create_block_mask evaluating the same
   mask_mod on every pair, compiled (torch.compile(create_block_mask), timed after its first call) and not (skipped
   where its N x N intermediates would not fit), at --sizes tokens, for packed documents of mixed
   lengths (32..4096, causal) and for prefix trees (prompts with 8 completions, some branching
   again). "blocks ok" checks that our kept blocks cover theirs and our full blocks are theirs.
2. Packed vs padded training throughput on CPU (forward + backward of a small Llama, `small_llama`):
   --train-tokens of documents of 32..1024 tokens, as batches of 4 documents padded to the longest
   (sdpa, 2-D padding mask) or packed in order into rows of --pack-length tokens, one row per step
   (graphattn, chunked CPU path: SDPA per document); the two take turns --repeats times, tokens/s
   (real tokens only) from the min and the median pass. Then one packed row of --long-row tokens
   (32K) forward + backward on the tiny Llama: time and peak memory growth.
3. One prompt with 8 completions: tokens in a prefix tree vs 8 separate sequences, and the
   forward time of each on the tiny Llama.

Other times are the best of --repeats runs after a warm-up. Usage:
    python benchmarks/hf_masks.py [--sizes 4096 32768 131072] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphattn.hf import LayerRule, pack_documents, pack_tree, register  # noqa: E402
from graphattn.hf.flex import TILE, _tree_mask_mod, build_block_mask  # noqa: E402

DENSE_LIMIT = 16384  # uncompiled create_block_mask holds several N x N tensors


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def mixed_documents(total: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths, used = [], 0
    while used < total:
        n = int(torch.exp(torch.empty(1).uniform_(3.5, 8.3, generator=g)).item())  # about 32..4096
        n = min(n, total - used)
        lengths.append(n)
        used += n
    return pack_documents([[1] * n for n in lengths])


def prefix_trees(total: int, seed: int) -> dict:
    """Prompts of 256..2048 tokens, each with 8 completions of 64..1024; every other completion
    branches into 2 more; trees follow each other until `total` tokens."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))  # noqa: E731
    segments, used = [], 0
    while used < total:
        root = len(segments)
        n = min(rand(256, 2048), total - used)
        segments.append((-1, [1] * n))
        used += n
        for c in range(8):
            if used >= total:
                break
            n = min(rand(64, 1024), total - used)
            segments.append((root, [2] * n))
            used += n
            parent = len(segments) - 1
            for _ in range(2 if c % 2 else 0):
                if used >= total:
                    break
                n = min(rand(32, 256), total - used)
                segments.append((parent, [3] * n))
                used += n
    return pack_tree(segments)


def block_rows(sizes: list[int], repeats: int) -> list[tuple]:
    from torch.nn.attention.flex_attention import create_block_mask

    rule = LayerRule(hi=0)
    compiled = torch.compile(create_block_mask)
    rows = []
    for size in sizes:
        for kind, make in (("documents", mixed_documents), ("tree", prefix_trees)):
            structure = make(size, seed=size)["attention_mask"]
            mask_mod = _tree_mask_mod(structure, rule)

            def ours():
                structure._plans.clear()
                return build_block_mask(structure, rule, TILE)[0]

            ours()
            t_ours = best(ours, repeats)
            mine = ours()
            blocks_bytes = sum(
                t.numel() * t.element_size()
                for t in (mine.kv_num_blocks, mine.kv_indices, mine.full_kv_num_blocks, mine.full_kv_indices)
            )
            structure_bytes = sum(
                t.numel() * t.element_size() for t in (structure.positions, structure.enter, structure.exit)
            )
            args = (mask_mod, 1, None, size, size, "cpu")
            start = time.perf_counter()
            theirs = compiled(*args, BLOCK_SIZE=TILE)
            first = time.perf_counter() - start
            t_comp = best(lambda: compiled(*args, BLOCK_SIZE=TILE), repeats)
            t_eager = best(lambda: create_block_mask(*args, BLOCK_SIZE=TILE), 1) if size <= DENSE_LIMIT else None
            ok = _same_blocks(mine, theirs)
            rows.append((size, kind, t_ours, t_comp, first, t_eager, structure_bytes, blocks_bytes, ok))
            eager = f"{t_eager * 1e3:10.1f}" if t_eager is not None else f"{'skipped':>10}"
            print(
                f"{size:>7} {kind:>9} {t_ours * 1e3:9.1f} {t_comp * 1e3:11.1f} {first:9.1f}s {eager} "
                f"{t_comp / t_ours:8.1f}x {structure_bytes / 2**10:9.0f} {blocks_bytes / 2**20:9.1f}  {ok}",
                flush=True,
            )
    return rows


def _same_blocks(ours, theirs) -> bool:
    """Our kept blocks (partial + full) cover theirs; our full blocks equal theirs."""

    def dense(counts, indices):
        n = counts.shape[-1]
        out = torch.zeros(n, indices.shape[-1], dtype=torch.bool)
        keep = torch.arange(indices.shape[-1])[None, :] < counts[0, 0, :, None]
        rows = torch.arange(n)[:, None].expand_as(keep)
        out[rows[keep], indices[0, 0][keep].long()] = True
        return out

    our_full = dense(ours.full_kv_num_blocks, ours.full_kv_indices)
    their_full = dense(theirs.full_kv_num_blocks, theirs.full_kv_indices)
    our_any = our_full | dense(ours.kv_num_blocks, ours.kv_indices)
    their_any = their_full | dense(theirs.kv_num_blocks, theirs.kv_indices)
    return bool((our_any | ~their_any).all()) and torch.equal(our_full, their_full)


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    )
    return LlamaForCausalLM(config)


DOC_LENGTHS = (32, 1024)  # the training row's documents: lengths uniform in this range
PADDED_BATCH = 4  # documents per padded batch, padded to the longest


def small_llama():
    """The training row's decoder: Llama, hidden 128, 2 layers, 4 query / 2 key-value heads of 32,
    FFN 256, vocabulary 256 (small enough for several alternating rounds on a shared CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    )
    return LlamaForCausalLM(config)


def training_batches(total: int, pack_length: int) -> tuple[int, list[dict], list[dict]]:
    """Documents of DOC_LENGTHS until `total` tokens, as padded batches (PADDED_BATCH documents in
    order, padded to the longest, a [B, N] padding mask) and as packed rows (in order, a new row
    when the next document does not fit `pack_length`; one row per step). Returns the real tokens
    and both lists of batches."""
    g = torch.Generator().manual_seed(1)
    docs, used = [], 0
    while used < total:
        n = int(torch.randint(DOC_LENGTHS[0], DOC_LENGTHS[1] + 1, (1,), generator=g))
        docs.append(torch.randint(3, 256, (n,), generator=g).tolist())
        used += n
    padded = []
    for start in range(0, len(docs), PADDED_BATCH):
        group = docs[start : start + PADDED_BATCH]
        width = max(len(d) for d in group)
        ids = torch.tensor([d + [0] * (width - len(d)) for d in group])
        mask = (torch.arange(width)[None] < torch.tensor([len(d) for d in group])[:, None]).long()
        padded.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
    rows, row, used = [], [], 0
    for doc in docs:  # the rows pack_documents(docs, max_length=pack_length) makes, one batch each
        if used + len(doc) > pack_length:
            rows.append(row)
            row, used = [], 0
        row.append(doc)
        used += len(doc)
    packed = [pack_documents(r, max_length=pack_length, return_labels=True) for r in rows + [row]]
    return sum(len(d) for d in docs), padded, packed


def packed_vs_padded(total: int, pack_length: int, rounds: int) -> dict:
    """Forward + backward over the same documents, padded (sdpa) and packed (graphattn's CPU path),
    taking turns `rounds` times after a warm-up (a slow minute of a shared machine falls on both);
    the structures' plans are rebuilt inside every timed pass. Seconds per pass, both routes."""
    import statistics

    name = register()
    tokens, padded, packed = training_batches(total, pack_length)
    model = small_llama()

    def run_padded():
        model.set_attn_implementation("sdpa")
        for batch in padded:
            model(**batch, use_cache=False).loss.backward()

    def run_packed():
        model.set_attn_implementation(name)
        for batch in packed:
            batch["attention_mask"]._plans.clear()
            model(**batch, use_cache=False).loss.backward()

    times = {"padded": [], "packed": []}
    run_padded()
    run_packed()
    for _ in range(rounds):
        for route, run in (("padded", run_padded), ("packed", run_packed)):
            model.zero_grad()
            start = time.perf_counter()
            run()
            times[route].append(time.perf_counter() - start)
    real = {
        route: tokens / sum(b["input_ids"].numel() for b in batches)
        for route, batches in (("padded", padded), ("packed", packed))
    }
    return {
        "tokens": tokens,
        "docs": sum(b["input_ids"].shape[0] for b in padded),
        "real": real,
        "min": {route: min(t) for route, t in times.items()},
        "median": {route: statistics.median(t) for route, t in times.items()},
    }


def long_row(total: int) -> tuple[float, float, float]:
    """One packed row of `total` tokens (documents 32..4096) through the tiny Llama, forward +
    backward on the chunked CPU path: seconds, the peak resident-set growth (MiB) and what one
    fp32 [heads, N, N] score tensor would take (MiB)."""
    import resource

    name = register()
    g = torch.Generator().manual_seed(3)
    docs, used = [], 0
    while used < total:
        n = min(int(torch.exp(torch.empty(1).uniform_(3.5, 8.3, generator=g)).item()), total - used)
        docs.append(torch.randint(3, 256, (n,), generator=g).tolist())
        used += n
    model = tiny_llama()
    model.set_attn_implementation(name)
    warm = pack_documents(docs[:2], return_labels=True)
    model(**warm, use_cache=False).loss.backward()  # first-call costs (imports, checkpoint set-up) apart
    model.zero_grad()
    batch = pack_documents(docs, return_labels=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    model(**batch, use_cache=False).loss.backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return seconds, peak - before, 4 * total * total * 4 / 2**20


def tree_savings(prompt: int, completion: int, repeats: int) -> tuple[int, int, float, float]:
    name = register()
    g = torch.Generator().manual_seed(2)
    prompt_ids = torch.randint(3, 256, (prompt,), generator=g).tolist()
    completions = [torch.randint(3, 256, (completion,), generator=g).tolist() for _ in range(8)]
    tree = pack_tree([(-1, prompt_ids)] + [(0, c) for c in completions])
    flat = torch.tensor([prompt_ids + c for c in completions])
    model = tiny_llama().eval()

    def run_tree():
        model.set_attn_implementation(name)
        with torch.no_grad():
            model(
                input_ids=tree["input_ids"],
                position_ids=tree["position_ids"],
                attention_mask=tree["attention_mask"],
                use_cache=False,
            )

    def run_flat():
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            model(input_ids=flat, use_cache=False)

    run_tree()
    run_flat()
    return tree["input_ids"].numel(), flat.numel(), best(run_tree, repeats), best(run_flat, repeats)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 32768, 131072])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-tokens", type=int, default=16384, help="tokens of the packed-vs-padded run")
    parser.add_argument("--pack-length", type=int, default=4096, help="tokens per packed row (one row per step)")
    parser.add_argument("--long-row", type=int, default=32768, help="tokens of the one-row CPU training run")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the test runs this)")
    parser.add_argument("--long-row-only", type=int, help=argparse.SUPPRESS)  # the fresh process of the long row
    args = parser.parse_args(argv)
    if args.long_row_only:
        print(json.dumps(long_row(args.long_row_only)))
        return
    if args.quick:
        args.sizes, args.repeats, args.train_tokens, args.pack_length, args.long_row = [1024], 1, 2048, 1024, 2048
        args.prompt, args.completion = 64, 16
    for name, value in (
        ("--sizes", min(args.sizes)),
        ("--train-tokens", args.train_tokens),
        ("--long-row", args.long_row),
    ):
        if not 128 <= value <= 1 << 20:
            parser.error(f"{name}: expected 128..{1 << 20}, got {value}")
    if not DOC_LENGTHS[1] <= args.pack_length <= 1 << 20:
        parser.error(
            f"--pack-length: expected {DOC_LENGTHS[1]}..{1 << 20} (a row holds the longest document), "
            f"got {args.pack_length}"
        )
    if not 1 <= args.repeats <= 1000:
        parser.error(f"--repeats: expected 1..1000, got {args.repeats}")
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (a machine shared with other jobs)"
    )
    print(f"\n1. BlockMask per batch (block {TILE}, causal), best of {args.repeats}; memory: structure KiB, blocks MiB")
    print(
        f"{'tokens':>7} {'kind':>9} {'ours ms':>9} {'compiled ms':>11} {'compile':>10} {'eager ms':>10} "
        f"{'ratio':>9} {'struct':>9} {'blocks':>9}  blocks ok"
    )
    block_rows(args.sizes, args.repeats)
    speed = packed_vs_padded(args.train_tokens, args.pack_length, args.repeats)
    tokens, real, fastest, median = speed["tokens"], speed["real"], speed["min"], speed["median"]
    print(
        f"\n2. training on CPU, forward+backward of a Llama (hidden 128, 2 layers, 4/2 heads of 32, FFN 256): "
        f"{tokens} tokens in {speed['docs']} documents of {DOC_LENGTHS[0]}..{DOC_LENGTHS[1]}, "
        f"{args.repeats} alternating rounds; tokens/s from the min and the median pass time"
    )
    print(f"   {'route':<42} {'real tokens':>11} {'min':>9} {'median':>9}")
    for route, label in (
        ("padded", f"padded sdpa, batches of {PADDED_BATCH} documents"),
        ("packed", f"packed graphattn, rows of {args.pack_length} tokens"),
    ):
        print(f"   {label:<42} {real[route]:>10.0%} {tokens / fastest[route]:>9.0f} {tokens / median[route]:>9.0f}")
    print(
        f"   {'ratio packed / padded':<42} {'':>11} {fastest['padded'] / fastest['packed']:>8.2f}x "
        f"{median['padded'] / median['packed']:>8.2f}x"
    )
    seconds, grown, dense = json.loads(
        subprocess.run(
            [sys.executable, __file__, "--long-row-only", str(args.long_row)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    print(
        f"   one packed row of {args.long_row} tokens, forward+backward (chunked CPU path): {seconds:.1f} s, "
        f"peak RSS +{grown:.0f} MiB in a fresh process (one fp32 [4 heads, N, N] score tensor: {dense:.0f} MiB)"
    )
    tree_tokens, flat_tokens, t_tree, t_flat = tree_savings(args.prompt, args.completion, args.repeats)
    print(f"\n3. one prompt of {args.prompt} tokens with 8 completions of {args.completion}")
    print(f"   8 sequences: {flat_tokens} tokens, forward {t_flat * 1e3:.1f} ms (sdpa)")
    print(
        f"   prefix tree: {tree_tokens} tokens, forward {t_tree * 1e3:.1f} ms (graphattn); "
        f"{1 - tree_tokens / flat_tokens:.0%} fewer tokens ({flat_tokens / tree_tokens:.2f}x)"
    )


if __name__ == "__main__":
    main()
