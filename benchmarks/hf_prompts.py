"""Benchmark: structured prompts at inference (graphattn.hf.BlockCache, graphattn.hf.generate_tree).

1. Retrieval prompt on a small Llama (from a config, random weights, CPU): --passages passages of
   --passage-length tokens and a --question-token question. Time to first token with every
   passage already in the BlockCache (re-rotation + the question against the cached keys) beside
   a full prefill of the same tokens (one ordinary forward, logits of the last token only, as
   `generate` does), the first (cold) BlockCache prefill, the cache's memory, and the largest
   logit difference to one eager forward under the explicit block-attention mask.
2. N continuations of one --prompt-token prompt (GRPO-style): `generate_tree` (the prompt
   computed once) beside `generate` on the prompt repeated N times (what num_return_sequences
   does), greedy, --new-tokens each: prompt tokens computed and wall time; the outputs are compared.

Times are the best of --repeats rounds (the compared calls taking turns) after a warm-up. Usage:
    python benchmarks/hf_prompts.py [--passages 8] [--passage-length 256] [--question 32] [--threads N] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphattn.hf import BlockCache, generate_tree  # noqa: E402


def best(fns: dict, repeats: int) -> dict:
    """Best time of each function over `repeats` rounds that take turns (a slow minute on a shared
    machine then falls on all of them), after one warm-up call each."""
    for fn in fns.values():
        fn()
    times: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def small_llama(hidden: int, layers: int, vocab: int):
    import transformers as tf

    torch.manual_seed(0)
    heads = max(hidden // 64, 1)
    config = tf.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        intermediate_size=hidden * 8 // 3 // 32 * 32,
        max_position_embeddings=1 << 17,
        attention_dropout=0.0,
    )
    return tf.LlamaForCausalLM(config).eval()


def block_mask_logits(model, blocks, tail) -> torch.Tensor:
    """The tail's logits from one eager forward under the explicit block-attention mask."""
    ids = torch.tensor([t for b in blocks for t in b] + tail)[None]
    total = ids.shape[1]
    segment = torch.cat([torch.full((len(b),), i) for i, b in enumerate(blocks)] + [torch.full((len(tail),), -1)])
    q = torch.arange(total)
    allowed = (q[None] <= q[:, None]) & ((segment[:, None] == segment[None]) | (segment[:, None] == -1))
    mask = torch.zeros(total, total).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -len(tail) :]
    finally:
        model.set_attn_implementation("sdpa")


def retrieval(model, args, vocab: int) -> None:
    g = torch.Generator().manual_seed(1)
    blocks = [torch.randint(1, vocab, (args.passage_length,), generator=g).tolist() for _ in range(args.passages)]
    tail = torch.randint(1, vocab, (args.question,), generator=g).tolist()
    full = torch.tensor([t for b in blocks for t in b] + tail)[None]

    def cold():
        return BlockCache(model).prefill(blocks, tail, logits_to_keep=1)

    cache = BlockCache(model, max_tokens=args.passages * args.passage_length)
    for block in blocks:
        cache.encode(block)
    with torch.no_grad():
        times = best(
            {
                "cached": lambda: cache.prefill(blocks, tail, logits_to_keep=1),
                "full": lambda: model(input_ids=full, use_cache=True, logits_to_keep=1),
                "cold": cold,
            },
            args.repeats,
        )
    t_cached, t_full, t_cold = times["cached"], times["full"], times["cold"]
    diff = (cache.prefill(blocks, tail).logits - block_mask_logits(model, blocks, tail)).abs().max().item()
    n = full.shape[1]
    print(
        f"retrieval prompt: {args.passages} passages x {args.passage_length} + {args.question}-token question "
        f"= {n} tokens"
    )
    print(f"  full prefill (sdpa, causal)            {t_full * 1e3:9.1f} ms")
    print(f"  BlockCache prefill, passages cached    {t_cached * 1e3:9.1f} ms   ratio {t_full / t_cached:.1f}x less")
    print(f"  BlockCache prefill, cold (all encoded) {t_cold * 1e3:9.1f} ms")
    print(
        f"  cache memory: {cache.nbytes / 2**20:.2f} MiB for {cache.num_tokens} tokens "
        f"({cache.nbytes // max(cache.num_tokens, 1)} bytes/token)"
    )
    print(f"  max |logit - block-mask forward|: {diff:.2e}")


def continuations(model, args, vocab: int) -> None:
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(1, vocab, (args.prompt,), generator=g).tolist()
    n = args.continuations
    kwargs = dict(max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
    ours = generate_tree(model, prompt, n, **kwargs)
    theirs = model.generate(input_ids=torch.tensor([prompt]).expand(n, -1), **kwargs)
    times = best(
        {
            "tree": lambda: generate_tree(model, prompt, n, **kwargs),
            "repeat": lambda: model.generate(input_ids=torch.tensor([prompt]).expand(n, -1), **kwargs),
        },
        args.repeats,
    )
    t_tree, t_repeat = times["tree"], times["repeat"]
    ours_tokens, their_tokens = (args.prompt - 1) + n, n * args.prompt
    print(f"{n} continuations of a {args.prompt}-token prompt, {args.new_tokens} new tokens each (greedy):")
    print(
        f"  prompt tokens computed: generate_tree {ours_tokens}, repeated prompt {their_tokens} "
        f"({100 * (1 - ours_tokens / their_tokens):.0f}% fewer)"
    )
    print(
        f"  generate_tree {t_tree * 1e3:.1f} ms, generate on the repeated prompt {t_repeat * 1e3:.1f} ms "
        f"(ratio {t_repeat / t_tree:.1f}x); same tokens: {torch.equal(ours, theirs)}"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=int, default=8)
    parser.add_argument("--passage-length", type=int, default=256)
    parser.add_argument("--question", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=512, help="hidden size of the small Llama (64 per head)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens of the N-continuation run")
    parser.add_argument("--continuations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the test runs this)")
    args = parser.parse_args(argv)
    if args.quick:
        args.passages, args.passage_length, args.question, args.hidden, args.layers = 3, 16, 4, 64, 2
        args.vocab, args.prompt, args.continuations, args.new_tokens, args.repeats = 128, 12, 3, 4, 1
    for name in (
        "passages",
        "passage_length",
        "question",
        "hidden",
        "layers",
        "vocab",
        "prompt",
        "continuations",
        "new_tokens",
        "repeats",
    ):
        value = getattr(args, name)
        if not 1 <= value <= 1 << 20:
            parser.error(f"--{name.replace('_', '-')}: expected 1..{1 << 20}, got {value}")
    if args.vocab < 2:
        parser.error("--vocab: expected at least 2")
    if args.threads is not None:
        if not 1 <= args.threads <= 1024:
            parser.error(f"--threads: expected 1..1024, got {args.threads}")
        torch.set_num_threads(args.threads)
    model = small_llama(args.hidden, args.layers, args.vocab)
    print(
        f"small Llama: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {torch.get_num_threads()} threads"
    )
    retrieval(model, args, args.vocab)
    continuations(model, args, args.vocab)


if __name__ == "__main__":
    main()
