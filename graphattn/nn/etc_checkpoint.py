"""Load Google's pre-trained ETC checkpoints (etcmodel's TensorFlow `EtcModel`) into an EtcEncoder.

A checkpoint directory holds `etc_config.json` (etcmodel's EtcConfig as JSON) and a TensorFlow
checkpoint `model.ckpt.index` / `model.ckpt.data-*`, read by `graphattn.nn.tensorbundle` (no
TensorFlow). Names under `etc_document_bert/` are the encoder, mapped as follows (TF Dense
kernels are [in, out] and transposed to torch's [out, in]; `L` = `global_local_transformer_layers/`,
`A` = `L/fused_att_layer_N/fused_global_local_att/`):

    token_emb_lookup/embedding_table (+ /projection)   embeddings.word_embeddings (+ embedding_projection)
    segment_emb_lookup/embedding_table                  embeddings.token_type_embeddings
    position_emb_lookup_{long,global}/embedding_table   embeddings.{,global_}position_embeddings
    {long,global}_emb_layer_norm                        embeddings.{,global_}layer_norm
    A/long_query_projection, A/global_query_projection  attention.query, attention.global_query
    A/l2l_{key,value}_projection                        attention.key / value (l2l; l2g too when shared)
    A/g2g_{key,value}_projection                        attention.global_key / global_value (g2l too with share_kv)
    A/l2g_*, A/g2l_* (neither sharing switch)           attention.l2g_key ... attention.g2l_value
    A/long_qkv_attention/qkv_relative_attention/*       attention.relative_key_table, relative_bias_table
    A/global_qkv_attention/*                            attention.global_relative_key_table, ..._bias_table
    A/long_output_projection, A/global_output_projection  attention.output, attention.global_output
    L/fused_att_layer_N/layer_norm_{0,1}                attention_norm (long), global_attention_norm
    L/feed_forward_layer_N (or long_/global_ ... when not shared)   intermediate, output, output_norm (+ global_*)

etcmodel adds the per-label bias before the 1/sqrt(d) scale, graphattn after it: the bias tables
are divided by sqrt(head_dim) on the way in, so the scores are equal. The sizes (layers, hidden,
heads, vocabularies, ...) are read from the index entries and the sharing switches from the names
present (layer 0); both must agree with etc_config.json before an encoder is built
(`etc_geometry.py`; the config file itself is read by `etc_config_file.py`). A tensor under
etc_document_bert/ that no parameter takes is refused. Anything else is reported, never silently
dropped: the MLM and CPC heads under `cls/` go to `LiftReport.unused`
under the Hugging Face names `MlmHead.load_lifted` / `CpcHead.load_lifted` take; `global_step`
and optimizer slots as training state; any other name as unknown. A tensor the model needs and
the checkpoint lacks, a shape that differs, or a config the tensors contradict is a
`CheckpointError` naming the tensor, raised before the encoder is handed out.
"""

from __future__ import annotations

import errno
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphattn.nn.config import EtcConfig
from graphattn.nn.encoder import EtcEncoder
from graphattn.nn.etc_config_file import (
    CONFIG_FILE,
    apply_overrides,
    etc_config_from_etcmodel,
    read_etc_config,
)
from graphattn.nn.etc_geometry import LAYERS, POSITION_TABLES, SCOPE, check_geometry, present
from graphattn.nn.lift import LiftReport
from graphattn.nn.tensorbundle import CheckpointError, TensorBundle

CHECKPOINT_PREFIX = "model.ckpt"
MODEL_TYPE = "etcmodel"
MAX_SIZE = 1 << 16  # the largest relative vocabulary EtcConfig takes
MLM_HEAD = {
    "cls/predictions/transform/dense/kernel": "cls.predictions.transform.dense.weight",
    "cls/predictions/transform/dense/bias": "cls.predictions.transform.dense.bias",
    "cls/predictions/transform/LayerNorm/gamma": "cls.predictions.transform.LayerNorm.weight",
    "cls/predictions/transform/LayerNorm/beta": "cls.predictions.transform.LayerNorm.bias",
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/cpc/transform/dense/kernel": "cls.cpc.projection.weight",
    "cls/cpc/transform/dense/bias": "cls.cpc.projection.bias",
}
_OPTIMIZER_SLOT = re.compile(r"/(adam_[mv]|Adam(_\d+)?|lamb_[mv]|Momentum|accumulator)$", re.IGNORECASE)


def _exists(path: Path) -> bool:
    """Whether anything is at `path` (a file, a directory, a FIFO, a broken or looping symlink):
    what is there but unreadable is then named as what it is, never as missing."""
    return os.path.lexists(path)


def find_checkpoint(path: str | os.PathLike) -> tuple[Path, Path]:
    """(etc_config.json, checkpoint prefix) for a checkpoint directory or the prefix itself."""
    path = Path(path)
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise CheckpointError("a symlink loop, not a checkpoint directory or prefix", file=path) from None
        if not _exists(path) and not _exists(Path(f"{path}.index")):
            raise CheckpointError(
                "no such checkpoint directory or prefix (nor a .index beside it)", file=path
            ) from None
    if path.is_dir():
        prefix = path / CHECKPOINT_PREFIX
        if not _exists(Path(f"{prefix}.index")):
            found = sorted(path.glob("*.index"))
            if len(found) != 1:
                raise CheckpointError(
                    f"expected {CHECKPOINT_PREFIX}.index (a TensorFlow checkpoint) in this directory, found "
                    f"{', '.join(p.name for p in found) or 'none'}",
                    file=path,
                )
            prefix = found[0].with_suffix("")
        folder = path
    else:
        prefix = Path(str(path)[: -len(".index")]) if str(path).endswith(".index") else path
        folder = prefix.parent
    config = folder / CONFIG_FILE
    if not _exists(config):
        raise CheckpointError(f"no {CONFIG_FILE} beside the checkpoint (etcmodel's EtcConfig as JSON)", file=folder)
    return config, prefix


def is_etc_checkpoint(path: str | os.PathLike) -> bool:
    """Whether `path` looks like an ETC checkpoint directory or prefix (etc_config.json beside a .index)."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    return _exists(folder / CONFIG_FILE) and (
        any(folder.glob("*.index")) if path.is_dir() else _exists(Path(f"{path}.index")) or path.suffix == ".index"
    )


def sharing_from_names(names: set[str]) -> dict[str, Any]:
    """The switches the tensors imply, read from layer 0 and the embeddings."""
    att = LAYERS + "fused_att_layer_0/fused_global_local_att/"
    has = lambda part: any(n.startswith(att + part) for n in names)  # noqa: E731
    return {
        "share_qkv_projections": not has("global_query_projection/"),
        "share_kv_projections": has("global_query_projection/") and not has("l2g_key_projection/"),
        "share_att_output_projection": not has("global_output_projection/"),
        "share_feed_forward_params": not any(n.startswith(LAYERS + "long_feed_forward_layer_0/") for n in names),
        "embedding_projection": SCOPE + "token_emb_lookup/projection/kernel" in names,
        "absolute_positions": bool(present(names, POSITION_TABLES[0])),
    }


def _check_agreement(etc: dict[str, Any], names: set[str], config_path: Path) -> None:
    found = sharing_from_names(names)
    said = {
        "share_qkv_projections": bool(etc["share_qkv_projections"]),
        "share_kv_projections": bool(etc["share_kv_projections"]) and not etc["share_qkv_projections"],
        "share_att_output_projection": bool(etc["share_att_output_projection"]),
        "share_feed_forward_params": bool(etc["share_feed_forward_params"]),
        "embedding_projection": etc["embedding_size"] not in (None, etc["hidden_size"]),
        "absolute_positions": etc["max_absolute_position_embeddings"] > 0,
    }
    evidence = {
        "share_qkv_projections": "global_query_projection",
        "share_kv_projections": "l2g_key_projection / global_query_projection",
        "share_att_output_projection": "global_output_projection",
        "share_feed_forward_params": "long_feed_forward_layer_0",
        "embedding_projection": "token_emb_lookup/projection (embedding_size)",
        "absolute_positions": "position_emb_lookup_long (max_absolute_position_embeddings)",
    }
    for key, value in said.items():
        if found[key] != value:
            present = found[key] if not key.startswith("share") else not found[key]
            field = "embedding_size" if key == "embedding_projection" else key
            raise CheckpointError(
                f"$.{field} contradicts the checkpoint: the config means {key}={value}, the tensors "
                f"{key}={found[key]} ({evidence[key]} {'present' if present else 'absent'})",
                file=config_path,
            )


def tensor_plan(config: EtcConfig) -> dict[str, tuple[str, str]]:
    """encoder parameter -> (TensorFlow name, how: "copy", "transpose", "bias_scale", or
    "position" for a position table found with or without the encoder's scope)."""
    plan: dict[str, tuple[str, str]] = {}

    def dense(ours: str, theirs: str) -> None:
        plan[f"{ours}.weight"] = (f"{theirs}/kernel", "transpose")
        plan[f"{ours}.bias"] = (f"{theirs}/bias", "copy")

    def norm(ours: str, theirs: str) -> None:
        plan[f"{ours}.weight"] = (f"{theirs}/gamma", "copy")
        plan[f"{ours}.bias"] = (f"{theirs}/beta", "copy")

    emb = "embeddings."
    plan[emb + "word_embeddings.weight"] = (SCOPE + "token_emb_lookup/embedding_table", "copy")
    if config.embedding_size not in (None, config.hidden_size):
        dense(emb + "embedding_projection", SCOPE + "token_emb_lookup/projection")
    plan[emb + "token_type_embeddings.weight"] = (SCOPE + "segment_emb_lookup/embedding_table", "copy")
    if config.max_absolute_position_embeddings:
        plan[emb + "position_embeddings.weight"] = (POSITION_TABLES[0], "position")
        plan[emb + "global_position_embeddings.weight"] = (POSITION_TABLES[1], "position")
    norm(emb + "layer_norm", SCOPE + "long_emb_layer_norm")
    norm(emb + "global_layer_norm", SCOPE + "global_emb_layer_norm")

    mode = config.projection_mode
    for n in range(config.num_hidden_layers):
        ours, block = f"layer.{n}.", f"{LAYERS}fused_att_layer_{n}/"
        att = block + "fused_global_local_att/"
        dense(ours + "attention.query", att + "long_query_projection/linear")
        dense(ours + "attention.key", att + "l2l_key_projection/linear")
        dense(ours + "attention.value", att + "l2l_value_projection/linear")
        if mode != "shared":
            dense(ours + "attention.global_query", att + "global_query_projection/linear")
            dense(ours + "attention.global_key", att + "g2g_key_projection/linear")
            dense(ours + "attention.global_value", att + "g2g_value_projection/linear")
        if mode == "per_kind":
            for kind in ("l2g", "g2l"):
                for part in ("key", "value"):
                    dense(ours + f"attention.{kind}_{part}", att + f"{kind}_{part}_projection/linear")
        for side, theirs in (("", "long_qkv_attention/qkv_relative_attention/"), ("global_", "global_qkv_attention/")):
            plan[ours + f"attention.{side}relative_key_table"] = (att + theirs + "relative_emb_table", "copy")
            plan[ours + f"attention.{side}relative_bias_table"] = (att + theirs + "relative_bias_table", "bias_scale")
        dense(ours + "attention.output", att + "long_output_projection")
        if not config.share_att_output_projection:
            dense(ours + "attention.global_output", att + "global_output_projection")
        norm(ours + "attention_norm", block + "layer_norm_0")
        norm(ours + "global_attention_norm", block + "layer_norm_1")
        if config.share_feed_forward_params:
            ffn = {"": f"{LAYERS}feed_forward_layer_{n}/"}
        else:
            ffn = {"": f"{LAYERS}long_feed_forward_layer_{n}/", "global_": f"{LAYERS}global_feed_forward_layer_{n}/"}
        for side, theirs in ffn.items():
            dense(ours + f"{side}intermediate", theirs + "dense_layers/layer_0")
            dense(ours + f"{side}output", theirs + "dense_layers/layer_1")
            norm(ours + f"{side}output_norm", theirs + "layer_norm")
    return plan


def _why_not_loaded(name: str) -> str:
    if name in MLM_HEAD:
        return "pre-training head (kept in LiftReport.unused)"
    if name == "global_step":
        return "training step counter"
    if _OPTIMIZER_SLOT.search(name):
        return "optimizer state"
    return "unknown: no counterpart in EtcEncoder"


def _finite(tensor: torch.Tensor, path: Path, name: str) -> None:
    """Every value finite (numpy's isfinite: about 30x faster than torch's on a CPU tensor, and one
    pass over the weights is most of what loading costs beside reading them)."""
    values = tensor.numpy()
    if np.isfinite(values).all():
        return
    bad = ~np.isfinite(values)
    first = [int(i) for i in np.unravel_index(int(bad.argmax()), values.shape)]
    raise CheckpointError(
        f"holds {int(bad.sum()):,} non-finite values (NaN or inf; the first at index {first}) under a valid "
        "checksum: the weights were saved broken",
        file=path,
        tensor=name,
    )


def _read_float(bundle: TensorBundle, name: str) -> torch.Tensor:
    """A float tensor of the checkpoint, as float32 in memory of its own, every value finite."""
    tensor = bundle.read(name)
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        raise CheckpointError(
            f"expected a float tensor, got {bundle.entry(name).dtype}", file=bundle.index_path, tensor=name
        )
    tensor = tensor.float()
    _finite(tensor, bundle.shard_paths[bundle.entry(name).shard], name)
    return tensor


def load_etc_checkpoint(path: str | os.PathLike, **overrides: Any) -> tuple[EtcEncoder, LiftReport]:
    """EtcEncoder with every weight of an etcmodel checkpoint (directory with etc_config.json +
    model.ckpt.*, or the prefix). `overrides` change EtcConfig fields that hold no weights
    (attention_backend, hidden_dropout_prob, gradient_checkpointing, local_radius, layer_norm_eps,
    initializer_range); any other is refused as the caller's argument.

    Order: the config is read and checked, the index read and checked, the sizes the tensors
    imply proven equal to the config's, and only then is an encoder built (on the meta device)
    and filled from tensors read into its own memory, each checked for its crc, shape and finite
    values. Every tensor under etc_document_bert/ must be used."""
    config_path, prefix = find_checkpoint(path)
    etc, unknown_keys = read_etc_config(config_path)
    with TensorBundle(prefix) as bundle:
        return _load(bundle, path, config_path, etc, unknown_keys, overrides)


def _load(bundle: TensorBundle, path, config_path: Path, etc: dict, unknown_keys: list[str], overrides: dict):
    names = set(bundle.names())
    if not any(n.startswith(SCOPE) for n in names):
        raise CheckpointError(f"no tensor under {SCOPE!r}: not an etcmodel EtcModel checkpoint", file=bundle.index_path)
    check_geometry(etc, bundle, config_path)  # sizes from the tensors, before any module exists
    _check_agreement(etc, names, config_path)
    config = apply_overrides(etc_config_from_etcmodel(etc, config_path), overrides)
    with torch.device("meta"):  # shapes only: every value comes from the checkpoint, no init pass
        encoder = EtcEncoder(config)
    own = encoder.state_dict()
    plan = tensor_plan(config)
    missing = sorted(set(own) - set(plan))
    if missing:  # a parameter this loader does not know how to fill: a bug here, not in the file
        raise CheckpointError(f"no TensorFlow name known for encoder parameter {missing[0]}", file=bundle.index_path)
    report = LiftReport(source=str(path), model_type=MODEL_TYPE)
    report.dropped.extend(
        (f"{config_path.name}: $.{key}", "not a key of etcmodel's EtcConfig: ignored, as etcmodel ignores it")
        for key in unknown_keys
    )
    for ours, (theirs, how) in plan.items():
        if how == "position":
            plan[ours] = (present(names, theirs) or SCOPE + theirs, "copy")
    used = {theirs for theirs, _ in plan.values()}
    unused = sorted(n for n in names - used if n.startswith(SCOPE) and not _OPTIMIZER_SLOT.search(n))
    if unused:  # a tensor of the encoder's scope no parameter takes: the config describes another model
        raise CheckpointError(
            f"under {SCOPE} but no parameter of the encoder {config_path.name} describes takes it "
            f"({len(unused)} such tensor{'s' if len(unused) > 1 else ''})",
            file=bundle.index_path,
            tensor=unused[0],
        )
    state: dict[str, torch.Tensor] = {}
    scale = 1.0 / math.sqrt(config.head_dim)
    for ours, (theirs, how) in plan.items():
        if theirs not in names:
            raise CheckpointError(
                f"missing from the checkpoint (the encoder's {ours} needs it)", file=bundle.index_path, tensor=theirs
            )
        entry = bundle.entry(theirs)
        expected = own[ours].shape if how != "transpose" else own[ours].shape[::-1]
        if tuple(entry.shape) != tuple(expected):  # checked on the index entry, before its bytes are read
            raise CheckpointError(
                f"shape {list(entry.shape)} does not fit the encoder's {ours} {list(own[ours].shape)}"
                f"{' (transposed)' if how == 'transpose' else ''} for the config in {config_path.name}",
                file=bundle.index_path,
                tensor=theirs,
            )
        tensor = _read_float(bundle, theirs)
        if how == "transpose":
            tensor = tensor.t()  # a view of the tensor's own memory: torch's Linear reads it as it is
        elif how == "bias_scale":
            tensor = tensor * scale  # etcmodel adds the bias before the 1/sqrt(d) scale
        state[ours] = tensor
        report.copied.append((ours, theirs, tuple(tensor.shape)))
    for name in sorted(names - used):
        report.dropped.append((name, _why_not_loaded(name)))
        if name in MLM_HEAD:
            rank = 2 if name.endswith("kernel") else 1
            if len(bundle.entry(name).shape) != rank:
                raise CheckpointError(
                    f"shape {list(bundle.entry(name).shape)}: a pre-training head's "
                    f"{'kernel has 2 dimensions' if rank == 2 else 'vector has 1 dimension'}",
                    file=bundle.index_path,
                    tensor=name,
                )
            value = _read_float(bundle, name)
            report.unused[MLM_HEAD[name]] = value.t().contiguous() if name.endswith("kernel") else value
    # Everything present and checked before the encoder gets any of it: nothing is half-loaded. The
    # tensors become the parameters (assign), in memory read for them alone (the checkpoint's files
    # can change or vanish afterwards); the Dense kernels are transposed views ([out, in] with
    # strides (1, out)), which Linear layers read as they are. `contiguous_parameters` lays them out afresh.
    encoder.load_state_dict(state, strict=True, assign=True)
    return encoder, report


def contiguous_parameters(module: torch.nn.Module) -> int:
    """Give every non-contiguous parameter (the transposed kernels of a loaded checkpoint) its own
    contiguous storage, as DDP's gradient buckets and code that `.view`s weights expect; returns
    how many were laid out afresh."""
    count = 0
    for param in module.parameters():
        if not param.is_contiguous():
            param.data = param.data.contiguous()
            count += 1
    return count


def extend_relative_vocab(encoder: EtcEncoder, size: int, report: LiftReport | None = None) -> list[str]:
    """Give every relative table `size` rows (a schema with more labels than the checkpoint has),
    new rows drawn as the encoder initialises (key tables N(0, initializer_range), biases 0);
    returns the names grown, also recorded in `report.created`."""
    config = encoder.config
    if not isinstance(size, int) or isinstance(size, bool) or size > MAX_SIZE:
        raise CheckpointError(f"relative vocabulary {size!r} is not an integer up to {MAX_SIZE}")
    if size <= config.relative_vocab_size:
        return []
    grown = []
    old = config.relative_vocab_size
    for n, layer in enumerate(encoder.layer):
        for name in (
            "relative_key_table",
            "relative_bias_table",
            "global_relative_key_table",
            "global_relative_bias_table",
        ):
            table = getattr(layer.attention, name, None)
            if table is None:
                continue
            extra = torch.zeros((size - old, *table.shape[1:]), dtype=table.dtype, device=table.device)
            if "key" in name:
                extra.normal_(std=config.initializer_range)
            setattr(layer.attention, name, torch.nn.Parameter(torch.cat((table.data, extra))))
            grown.append(f"layer.{n}.attention.{name}")
    new_config = config.with_changes(relative_vocab_size=size)
    encoder.config = new_config
    for module in encoder.modules():
        if getattr(module, "config", None) is config:
            module.config = new_config
    if report is not None:
        report.created.extend(
            (name, f"rows {old}..{size - 1} new (the schema has {size} relative labels)") for name in grown
        )
    return grown


def load_etc_for_schema(
    path: str | os.PathLike, *, local_radius: int, relative_pos_max_distance: int, relative_vocab_size: int, **overrides
) -> tuple[EtcEncoder, LiftReport]:
    """`load_etc_checkpoint` fitted to a schema's geometry: its local radius (no weight depends on
    it), the same distance clipping k as pre-training (else the relative tables would mean other
    distances: an error saying which schema to compile with), and new relative rows when the
    schema has more labels than the checkpoint (reported)."""
    encoder, report = load_etc_checkpoint(path, local_radius=local_radius, **overrides)
    trained_k = encoder.config.relative_pos_max_distance
    if relative_pos_max_distance != trained_k:
        hint = {12: "etc-sentences", 42: "etc-sentences-42relmaxdist"}.get(trained_k)
        flags = f"--set relative_pos_max_distance={trained_k}"
        if relative_vocab_size < 2 * trained_k + 3:  # the label table must grow too
            flags += f" --set relative_vocab_size=N (N at least 2k+3 = {2 * trained_k + 3} plus the schema's labels)"
        raise CheckpointError(
            f"the shards' schema clips relative distances at {relative_pos_max_distance}, the checkpoint was "
            f"pre-trained with relative_pos_max_distance={trained_k}: compile the shards again with {flags} "
            "(graphattn compile, or train on raw records)" + (f"; shipped {hint!r} says {trained_k}" if hint else ""),
            file=find_checkpoint(path)[0],
        )
    extend_relative_vocab(encoder, relative_vocab_size, report)
    contiguous_parameters(encoder)  # training writes every weight anyway; DDP buckets want this layout
    return encoder, report


__all__ = [
    "contiguous_parameters",
    "load_etc_for_schema",
    "extend_relative_vocab",
    "find_checkpoint",
    "is_etc_checkpoint",
    "load_etc_checkpoint",
    "read_etc_config",
]
