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

from graphattn.hf.inputs import check_int, check_segments
from graphattn.hf.kv import (
    GENERATE_OWNED,
    cache_argument,
    encode_after,
    expand_size,
    fill,
    new_cache,
    shared_prefix_cache,
    tokens_of,
)

MAX_CONTINUATIONS = 1 << 16


def _is_tree(prompt) -> bool:
    """A prompt of segments `[(parent, tokens), ...]` rather than one list of token ids."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and isinstance(prompt[0], (list, tuple))


def _tree_paths(model, prompt, vocab: int, device) -> list[tuple[torch.Tensor, tuple, tuple]]:
    """Per leaf of a segment tree: its root-to-leaf tokens and per layer the keys and values of all
    but the last, each segment computed once after its ancestors (positions continue from the
    parent's end)."""
    parents, arrays = check_segments(prompt, "prompt")
    tokens = [tokens_of(a, f"prompt[{i}] tokens", vocab, device) for i, a in enumerate(arrays)]
    starts: list[int] = []
    paths: list[list[int]] = []
    states: list[tuple] = []
    with torch.no_grad():
        for i, parent in enumerate(parents):
            starts.append(starts[parent] + tokens[parent].numel() if parent >= 0 else 0)
            paths.append([*paths[parent], i] if parent >= 0 else [i])
            states.append(encode_after(model, tokens[i], starts[i], [states[j] for j in paths[i][:-1]]))
    inner = set(parents)
    leaves = []
    for leaf in (i for i in range(len(parents)) if i not in inner):
        path = paths[leaf]
        layers = range(len(states[leaf][0]))
        keys = tuple(torch.cat([states[j][0][layer] for j in path], dim=2)[:, :, :-1] for layer in layers)
        values = tuple(torch.cat([states[j][1][layer] for j in path], dim=2)[:, :, :-1] for layer in layers)
        leaves.append((torch.cat([tokens[j] for j in path]), keys, values))
    return leaves


def _decode(model, tokens: torch.Tensor, keys: tuple, values: tuple, n: int, generate_kwargs: dict):
    """`generate` for n rows of `tokens` from the keys and values of all but the last (generate
    computes that one and picks the first new token), shared by the rows."""
    cache = new_cache()
    if tokens.numel() > 1:
        for layer, (k, v) in enumerate(zip(keys, values)):
            fill(cache, layer, k, v)
        cache = shared_prefix_cache(cache, n * expand_size(model, generate_kwargs))  # beams: n x num_beams rows
    kwargs = {cache_argument(model): cache}
    return model.generate(input_ids=tokens[None].expand(n, -1), **kwargs, **generate_kwargs)


def generate_tree(model, prompt, n: int, **generate_kwargs):
    """`n` continuations of `prompt` from one prefill: the prompt's keys and values are computed once
    and shared by reference by the n rows. Returns what `model.generate` returns for the n rows
    (the prompt, then the new tokens); greedy decoding equals `generate(num_return_sequences=n)`'s,
    and sampling draws from the same logits.

    `prompt` is a list of token ids, or a tree of segments `[(parent_index, tokens), ...]` (as
    `pack_tree` takes them: a shared prompt, branches, branches of branches): every segment is
    computed once, n continuations are decoded from each leaf, and a list of `generate`'s outputs
    comes back, one per leaf in segment order."""
    n = check_int(n, "n", 1, MAX_CONTINUATIONS)
    owned = sorted(set(generate_kwargs) & {*GENERATE_OWNED, "num_return_sequences"})
    if owned:
        raise ValueError(f"generate_kwargs: {owned[0]} is built from prompt and n; do not pass it")
    device = next(model.parameters()).device
    vocab = check_int(getattr(model.config, "vocab_size", None), "model.config.vocab_size", 1, 1 << 40)
    if _is_tree(prompt):
        paths = _tree_paths(model, prompt, vocab, device)
        return [_decode(model, tokens, keys, values, n, generate_kwargs) for tokens, keys, values in paths]
    tokens = tokens_of(prompt, "prompt", vocab, device)
    keys = values = ()
    if tokens.numel() > 1:
        with torch.no_grad():
            keys, values = encode_after(model, tokens[:-1], 0, [])
    return _decode(model, tokens, keys, values, n, generate_kwargs)
