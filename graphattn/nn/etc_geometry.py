"""The shape of an etcmodel checkpoint, read from its tensors' entries (no tensor bytes, no module
built) and proven against etc_config.json before `load_etc_checkpoint` builds an encoder.

Why: the config alone cannot be trusted to size the encoder. A `num_hidden_layers` typo would
otherwise build thousands of layers before a tensor is found missing, and a config with fewer
layers than the checkpoint would load the first ones and leave the rest behind. Here the layer
indices must run 0..N-1 without a gap or a non-canonical number in every place a layer has
tensors, and the layer count, hidden size, heads, head size, feed-forward size, vocabularies and
position table must each equal what the config says; each difference is one `CheckpointError`
naming the config key and the tensor that shows it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from graphattn.nn.tensorbundle import CheckpointError, TensorBundle

SCOPE = "etc_document_bert/"
LAYERS = SCOPE + "global_local_transformer_layers/"
# etcmodel creates the position tables while EtcModel is being constructed, outside its name
# scope: eager (TF2) checkpoints hold them at the top level, graph-mode ones may hold them scoped.
POSITION_TABLES = ("position_emb_lookup_long/embedding_table", "position_emb_lookup_global/embedding_table")
_LAYER = re.compile(
    re.escape(LAYERS) + r"(fused_att_layer|feed_forward_layer|long_feed_forward_layer|global_feed_forward_layer)_(\d+)/"
)
ATTENTION = "fused_global_local_att/"
RELATIVE_TABLE = ATTENTION + "long_qkv_attention/qkv_relative_attention/relative_emb_table"


def present(names: set[str] | list[str], unscoped: str) -> str | None:
    """The name a position table has in this checkpoint, scoped or not (None: absent)."""
    return next((n for n in (SCOPE + unscoped, unscoped) if n in names), None)


def layer_count(names: list[str], index_path: Path) -> int:
    """How many layers the tensors hold: indices 0..N-1 in every layer scope that appears."""
    seen: dict[str, set[int]] = {}
    for name in names:
        match = _LAYER.match(name)
        if match is None:
            continue
        kind, digits = match.groups()
        if len(digits) > 6 or digits != str(int(digits)):  # 6 digits: far past any bound on layers
            raise CheckpointError(f"layer number {digits[:12]!r} is not canonical", file=index_path, tensor=name)
        seen.setdefault(kind, set()).add(int(digits))
    if "fused_att_layer" not in seen:
        raise CheckpointError(f"no layer under {LAYERS}fused_att_layer_0/", file=index_path)
    count = max(max(indices) for indices in seen.values()) + 1
    for kind, indices in sorted(seen.items()):
        if len(indices) < count:  # the first gap, without building range(count): a number can be huge
            gap = next(i for i, n in enumerate(sorted(indices) + [count]) if i != n)
            raise CheckpointError(
                f"layer {gap} is missing: {kind}_{gap}/ is absent while layers up to {count - 1} are present",
                file=index_path,
                tensor=f"{LAYERS}{kind}_{gap}/",
            )
    return count


def _shape(bundle: TensorBundle, name: str, rank: int) -> tuple[int, ...]:
    if name not in bundle:
        raise CheckpointError(
            "missing from the checkpoint (it gives the encoder's sizes)", file=bundle.index_path, tensor=name
        )
    shape = bundle.entry(name).shape
    if len(shape) != rank or 0 in shape:
        raise CheckpointError(
            f"shape {list(shape)}, expected {rank} non-zero dimensions", file=bundle.index_path, tensor=name
        )
    return shape


def checkpoint_geometry(bundle: TensorBundle) -> dict[str, tuple[int, str]]:
    """etcmodel config key -> (the value the tensors imply, the tensor that shows it)."""
    names = bundle.names()
    layers = layer_count(names, bundle.index_path)
    token = SCOPE + "token_emb_lookup/embedding_table"
    norm = SCOPE + "long_emb_layer_norm/gamma"
    segment = SCOPE + "segment_emb_lookup/embedding_table"
    relative = f"{LAYERS}fused_att_layer_0/{RELATIVE_TABLE}"
    ffn = f"{LAYERS}feed_forward_layer_0/dense_layers/layer_0/kernel"
    if ffn not in bundle:
        ffn = f"{LAYERS}long_feed_forward_layer_0/dense_layers/layer_0/kernel"
    vocab, embedding = _shape(bundle, token, 2)
    (hidden,) = _shape(bundle, norm, 1)
    rel_vocab, heads, head_size = _shape(bundle, relative, 3)
    out: dict[str, tuple[int, str]] = {
        "num_hidden_layers": (layers, f"{LAYERS}fused_att_layer_0..{layers - 1}/"),
        "hidden_size": (hidden, norm),
        "vocab_size": (vocab, token),
        "embedding_size": (embedding, token),
        "segment_vocab_size": (_shape(bundle, segment, 2)[0], segment),
        "relative_vocab_size": (rel_vocab, relative),
        "num_attention_heads": (heads, relative),
        "att_size_per_head": (head_size, relative),
        "intermediate_size": (_shape(bundle, ffn, 2)[1], ffn),
    }
    position = present(set(names), POSITION_TABLES[0])
    out["max_absolute_position_embeddings"] = (
        _shape(bundle, position, 2)[0] if position else 0,
        position or POSITION_TABLES[0],
    )
    return out


def check_geometry(etc: dict[str, Any], bundle: TensorBundle, config_path: Path) -> None:
    """Every size etc_config.json states equals the tensors'; else one line naming both."""
    for key, (found, evidence) in checkpoint_geometry(bundle).items():
        said = etc[key]
        if key == "embedding_size" and said is None:
            said = etc["hidden_size"]
        if key == "att_size_per_head" and said is None:
            said = etc["hidden_size"] // etc["num_attention_heads"]
        if said != found:
            raise CheckpointError(
                f"{said} contradicts the checkpoint, whose tensors hold {found} ({evidence})",
                file=config_path,
                path=(key,),
            )


__all__ = ["LAYERS", "POSITION_TABLES", "SCOPE", "check_geometry", "checkpoint_geometry", "layer_count", "present"]
