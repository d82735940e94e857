"""N continuations of one prompt from one prefill (`generate_tree`): GRPO-style rollouts.

transformers' `generate(num_return_sequences=N)` repeats the prompt N times before the prefill,
so the shared prompt is computed N times. Here it is computed once (batch 1), and its keys and
values are shared by the N rows: each cache layer keeps the prompt's [1, H, P, d] once and only
the continuations per row, and hands attention the prompt expanded (a view) beside them. The
continuations then compute exactly what N separate generations from that prompt compute: the
logits every sampling step draws from are the same, so the same seed draws the same tokens.
"""

from __future__ import annotations

import torch

from graphattn.hf.inputs import check_int
from graphattn.hf.kv import (
    GENERATE_OWNED,
    cache_argument,
    expand_size,
    forward_cached,
    new_cache,
    shared_prefix_cache,
    tokens_of,
)

MAX_CONTINUATIONS = 1 << 16


def generate_tree(model, prompt, n: int, **generate_kwargs):
    """`n` continuations of `prompt` (a 1-D list of token ids) from one prefill: the prompt's keys
    and values are computed once and shared by reference by the n rows. Returns what
    `model.generate` returns for the n rows (the prompt, then the new tokens); greedy decoding
    equals `generate(num_return_sequences=n)`'s, and sampling draws from the same logits."""
    n = check_int(n, "n", 1, MAX_CONTINUATIONS)
    owned = sorted(set(generate_kwargs) & {*GENERATE_OWNED, "num_return_sequences"})
    if owned:
        raise ValueError(f"generate_kwargs: {owned[0]} is built from prompt and n; do not pass it")
    device = next(model.parameters()).device
    vocab = check_int(getattr(model.config, "vocab_size", None), "model.config.vocab_size", 1, 1 << 40)
    tokens = tokens_of(prompt, "prompt", vocab, device)
    cache = new_cache()
    if tokens.numel() > 1:  # all but the last token: generate computes that one and picks the first new token
        with torch.no_grad():
            positions = torch.arange(tokens.numel() - 1, device=device)[None]
            forward_cached(model, tokens[None, :-1], positions, cache, logits=False)
        cache = shared_prefix_cache(cache, n * expand_size(model, generate_kwargs))  # beams: n x num_beams rows
    kwargs = {cache_argument(model): cache}
    return model.generate(input_ids=tokens[None].expand(n, -1), **kwargs, **generate_kwargs)
