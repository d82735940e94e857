"""KV-cache helpers shared by `BlockCache` and `generate_tree`: the cache argument's name, a forward
that fills a cache, checked prompt tokens, and a cache whose prompt is shared by every row.

A shared-prefix layer keeps the prompt's keys and values once ([1, H, P, d]) and only each row's
own tokens; attention receives the prompt expanded (a view) beside them, so N rows decoding from
one prompt hold its keys once and never recompute them. transformers is imported on first use.
"""

from __future__ import annotations

import functools
import inspect

import torch

from graphattn.hf.inputs import int_array

GENERATE_OWNED = ("input_ids", "inputs_embeds", "attention_mask", "position_ids", "cache", "past_key_values")


def cache_argument(model) -> str:
    """The forward's name for the KV cache: `cache` (transformers >= 5.x) or `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def new_cache():
    """An empty DynamicCache of full layers (a sliding layer keeps every key: moved passages need them)."""
    from transformers import DynamicCache

    return DynamicCache()


def fill(cache, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Hand layer `layer` of an empty DynamicCache these keys and values as they are (its `update`
    would copy them once more)."""
    cache.update(keys[:, :, :0], values[:, :, :0], layer)  # creates the layer
    cache.layers[layer].keys, cache.layers[layer].values = keys, values


def encode_after(model, tokens: torch.Tensor, start: int, ancestors: list) -> tuple[tuple, tuple]:
    """Per layer the keys and values of `tokens` at positions `start`.. that see their ancestors'
    ((keys, values) per layer each, in order) before them; only the tokens' own are returned."""
    cache = new_cache()
    for layer in range(len(ancestors[0][0])) if ancestors else ():
        keys = torch.cat([a[0][layer] for a in ancestors], dim=2)
        fill(cache, layer, keys, torch.cat([a[1][layer] for a in ancestors], dim=2))
    n = tokens.numel()
    positions = torch.arange(start, start + n, device=tokens.device)[None]
    forward_cached(model, tokens[None], positions, cache, logits=False)
    if not ancestors:
        return tuple(layer.keys for layer in cache.layers), tuple(layer.values for layer in cache.layers)
    own = slice(-n, None)  # a copy: a view would keep the ancestors' copy alive
    return (
        tuple(layer.keys[:, :, own].clone() for layer in cache.layers),
        tuple(layer.values[:, :, own].clone() for layer in cache.layers),
    )


def forward_cached(model, tokens: torch.Tensor, positions: torch.Tensor, cache, logits: bool = True, **kwargs):
    """One forward of `tokens` [B, n] at `positions` [B or 1, n] that fills `cache`; the logits, or
    None with `logits=False` (then the decoder runs without its LM head: a 32K-vocabulary head over
    a 256-token passage costs more than the passage's layers)."""
    base = getattr(model, "model", None)
    if not logits and isinstance(base, torch.nn.Module) and cache_argument(base) == cache_argument(model):
        base(input_ids=tokens, position_ids=positions, use_cache=True, **{cache_argument(base): cache})
        return None
    out = model(input_ids=tokens, position_ids=positions, use_cache=True, **{cache_argument(model): cache}, **kwargs)
    return out.logits


def tokens_of(value, where: str, vocab: int, device) -> torch.Tensor:
    """A non-empty 1-D list of token ids below the vocabulary size, as a tensor on the model's device."""
    array = int_array(value, where)
    if array.size == 0:
        raise ValueError(f"{where}: expected at least one token id, got an empty list")
    if array.max() >= vocab:
        i = int((array >= vocab).argmax())
        raise ValueError(f"{where}[{i}]: token id {int(array[i])} is not below the vocabulary size {vocab}")
    return torch.from_numpy(array).to(device)


@functools.cache
def _shared_layer_class():
    """A DynamicLayer over a prompt shared by every row (defined on first use: transformers is
    imported only then)."""
    from transformers.cache_utils import DynamicLayer

    class SharedPrefixLayer(DynamicLayer):
        """The prompt's keys / values once ([1, H, P, d]) and each row's own tokens ([rows, H, S, d])."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int):
            super().__init__()
            self.lazy_initialization(keys, values)
            self.prefix_keys, self.prefix_values, self.rows = keys, values, rows
            self.keys = keys.new_empty(rows, keys.shape[1], 0, keys.shape[3])
            self.values = values.new_empty(rows, values.shape[1], 0, values.shape[3])

        def update(self, key_states, value_states, *args, **kwargs):
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            shape = (self.rows, -1, -1, -1)
            return (
                torch.cat([self.prefix_keys.expand(shape), self.keys], dim=-2),
                torch.cat([self.prefix_values.expand(shape), self.values], dim=-2),
            )

        def get_seq_length(self) -> int:
            return self.prefix_keys.shape[-2] + self.keys.shape[-2]

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.get_seq_length() + query_length, 0

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError("crop: pass a negative number of tokens to remove")
            remove = -tokens_to_remove
            own = self.keys.shape[-2]
            self.keys, self.values = (
                self.keys[..., : own - min(remove, own), :],
                self.values[..., : own - min(remove, own), :],
            )
            if remove > own:
                keep = self.prefix_keys.shape[-2] - (remove - own)
                self.prefix_keys, self.prefix_values = (
                    self.prefix_keys[..., :keep, :],
                    self.prefix_values[..., :keep, :],
                )

        def batch_repeat_interleave(self, repeats: int) -> None:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)
            self.rows *= repeats

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self.keys, self.values = self.keys[indices, ...], self.values[indices, ...]
            self.rows = self.keys.shape[0]

        def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
            self.batch_select_indices(beam_idx.to(self.keys.device))

        @property
        def shared_nbytes(self) -> int:
            return self.prefix_keys.nbytes + self.prefix_values.nbytes

    return SharedPrefixLayer


def shared_prefix_cache(cache, rows: int):
    """A DynamicCache whose layers share `cache`'s batch-1 keys and values across `rows` rows."""
    layer_class = _shared_layer_class()
    shared = new_cache()
    shared.layers = [layer_class(layer.keys, layer.values, rows) for layer in cache.layers]
    shared.layer_class_to_replicate = None
    return shared


def expand_size(model, generate_kwargs: dict) -> int:
    """The rows `generate` makes of each prompt row (max of num_beams and num_return_sequences), so a
    cache brought to it has as many."""
    config = generate_kwargs.get("generation_config") or getattr(model, "generation_config", None)
    sizes = [generate_kwargs.get(k, getattr(config, k, None)) for k in ("num_beams", "num_return_sequences")]
    return max(int(s) if isinstance(s, int) and s > 0 else 1 for s in sizes)
