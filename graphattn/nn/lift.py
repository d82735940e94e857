"""Lift BERT / RoBERTa weights from a local Hugging Face checkpoint into an EtcEncoder.

Nobody trains ETC from scratch: ETC lifted RoBERTa. With no global tokens and a local radius
covering the whole input, an ETC layer is BERT self-attention, so every BERT tensor has a home:

    embeddings.word_embeddings / token_type_embeddings  -> same names (extra type rows start as row 0)
    embeddings.position_embeddings                      -> position_embeddings and global_position_embeddings
                                                           (kept or dropped by max_absolute_position_embeddings)
    embeddings.LayerNorm                                -> layer_norm and global_layer_norm
    encoder.layer.N.attention.self.{query,key,value}    -> layer.N.attention.{query,key,value} (+ global_* copies)
    encoder.layer.N.attention.output.dense / LayerNorm  -> layer.N.attention.output / attention_norm
    encoder.layer.N.intermediate.dense                  -> layer.N.intermediate
    encoder.layer.N.output.dense / LayerNorm            -> layer.N.output / output_norm

Whatever the EtcConfig shares or not, each per-side or per-kind module (global_query,
l2g_key, g2l_value, global_output, global_attention_norm, global_intermediate, ...) gets a copy
of its BERT tensor, so every sharing mode starts from the same function.

RoBERTa numbers positions from padding_idx + 1 (position ids 2, 3, ... with padding_idx 1), while
EtcEmbeddings numbers them from 0: lifting keeps the table from row padding_idx + 1 on, so ETC
position i is RoBERTa position padding_idx + 1 + i (exact for inputs whose padding comes last).
New tensors (relative key tables, relative biases) start at zero by default, which makes the
lifted encoder compute exactly what the checkpoint computes until training moves them
(`relative_init="normal"` draws them as etcmodel does). The pooler and pre-training heads are
reported as dropped and handed back in `LiftReport.unused` for heads that want them (MLM).

Only local files are read; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from graphattn.errors import GraphattnError
from graphattn.nn.config import EtcConfig
from graphattn.nn.encoder import EtcEncoder
from graphattn.nn.tensorbundle import CheckpointError  # one error type for every checkpoint

BERT_TYPES = ("bert",)
ROBERTA_TYPES = ("roberta", "xlm-roberta", "camembert")  # same layout, positions offset by padding_idx + 1
_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
}
_PER_LAYER = {  # ETC name inside layer.N -> HF name inside encoder.layer.N
    "attention.query": "attention.self.query",
    "attention.key": "attention.self.key",
    "attention.value": "attention.self.value",
    "attention.output": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "intermediate": "intermediate.dense",
    "output": "output.dense",
    "output_norm": "output.LayerNorm",
}
_COPIES = {  # ETC modules that exist only when a side or attention kind has its own -> HF name
    "attention.global_query": "attention.self.query",
    **{
        f"attention.{kind}_{part}": f"attention.self.{part}"
        for kind in ("global", "l2g", "g2l")
        for part in ("key", "value")
    },
    "attention.global_output": "attention.output.dense",
    "global_attention_norm": "attention.output.LayerNorm",
    "global_intermediate": "intermediate.dense",
    "global_output": "output.dense",
    "global_output_norm": "output.LayerNorm",
}


@dataclass
class LiftReport:
    """What lifting did to every tensor: copied (ETC name <- HF name), created fresh, dropped."""

    source: str
    model_type: str
    copied: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    created: list[tuple[str, str]] = field(default_factory=list)  # (ETC name, how it was initialised)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (HF name, why)
    unused: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # dropped tensors, e.g. the MLM head

    def __str__(self) -> str:
        lines = [
            f"lifted {self.model_type} from {self.source}: {len(self.copied)} copied, "
            f"{len(self.created)} created, {len(self.dropped)} dropped"
        ]
        for title, rows in (
            ("copied", [f"{etc} <- {hf} {list(shape)}" for etc, hf, shape in self.copied]),
            ("created", [f"{etc}: {how}" for etc, how in self.created]),
            ("dropped", [f"{hf}: {why}" for hf, why in self.dropped]),
        ):
            if rows:
                lines.append(f"  {title}:")
                lines.extend(f"    {row}" for row in _collapse_layers(rows))
        return "\n".join(lines)


def _collapse_layers(rows: list[str]) -> list[str]:
    """One line per pattern over layers: 'layer.*.output <- encoder.layer.*.output.dense (x12)'."""
    counts: dict[str, int] = {}
    for row in rows:
        key = re.sub(r"(_layer_)\d+/", r"\1*/", re.sub(r"(layer)\.\d+\.", r"\1.*.", row))  # ours, TensorFlow's
        counts[key] = counts.get(key, 0) + 1
    return [f"{key} (x{n})" if n > 1 else key for key, n in counts.items()]


# -- reading a checkpoint -------------------------------------------------------------------


REQUIRED_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
NUMERIC_KEYS = (
    "max_position_embeddings",
    "type_vocab_size",
    "pad_token_id",
    "layer_norm_eps",
    "initializer_range",
    "hidden_dropout_prob",
)


def _read_json_object(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{what} is not UTF-8 text ({err.reason} at byte {err.start})", file=str(path)) from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{what} is not valid JSON: {err.msg}", file=str(path), line=err.lineno) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} must hold a JSON object, got a {type(data).__name__}", file=str(path))
    return data


def read_hf_config(checkpoint_dir: str | os.PathLike) -> dict[str, Any]:
    """config.json as a dict, with the sizes lifting needs present and positive integers."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(
            "no config.json: expected a local Hugging Face checkpoint directory (save_pretrained output)",
            file=str(checkpoint_dir),
        )
    return check_hf_config(_read_json_object(path, "config.json"), str(path))


def check_hf_config(hf: Any, source: str = "config.json") -> dict[str, Any]:
    """`hf` if it is a config dict with the sizes lifting needs (positive integers) and numbers
    where numbers belong; else a CheckpointError naming the key."""
    if not isinstance(hf, dict):
        raise CheckpointError(f"a Hugging Face config must be a JSON object, got a {type(hf).__name__}", file=source)
    for key in REQUIRED_SIZES:
        value = hf.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            found = "missing" if key not in hf else f"{value!r}"
            raise CheckpointError(
                f"config.json needs {key} as a positive integer, found {found} "
                f"(the sizes a BERT/RoBERTa config.json holds: {', '.join(REQUIRED_SIZES)})",
                file=source,
                path=(key,),
            )
    for key in NUMERIC_KEYS:
        if key in hf and (isinstance(hf[key], bool) or not isinstance(hf[key], (int, float))):
            raise CheckpointError(f"config.json's {key} must be a number, got {hf[key]!r}", file=source, path=(key,))
    return hf


def read_hf_weights(checkpoint_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of model.safetensors or pytorch_model.bin (sharded checkpoints too)."""
    root = Path(checkpoint_dir)
    for index_name, loader in (
        ("model.safetensors.index.json", _load_safetensors),
        ("pytorch_model.bin.index.json", _load_torch_bin),
    ):
        index = root / index_name
        if index.is_file():
            weight_map = _read_json_object(index, index_name).get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise CheckpointError(
                    f"{index_name} needs a weight_map from tensor names to shard file names",
                    file=str(index),
                    path=("weight_map",),
                )
            shards = sorted(set(weight_map.values()))
            missing = [name for name in shards if not (root / name).is_file()]
            if missing:
                raise CheckpointError(
                    f"{index_name} names shard files that are not there: {', '.join(missing[:3])}", file=str(index)
                )
            return {name: tensor for shard in shards for name, tensor in loader(root / shard).items()}
    for file_name, loader in (("model.safetensors", _load_safetensors), ("pytorch_model.bin", _load_torch_bin)):
        if (root / file_name).is_file():
            return loader(root / file_name)
    raise CheckpointError("no model.safetensors or pytorch_model.bin in the checkpoint directory", file=str(root))


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(
            f"not a readable safetensors file ({_first_line(err)}); expected the model.safetensors "
            "that save_pretrained writes (a truncated download? fetch it again)",
            file=str(path),
        ) from None


def _load_torch_bin(path: Path) -> dict[str, torch.Tensor]:
    import warnings

    try:
        with warnings.catch_warnings():  # the unpickler's notes on protocols say nothing a user can act on
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - a damaged file fails inside the unpickler in many ways
        why = _first_line(err)  # (IndexError, KeyError, UnicodeDecodeError, ...): each is this file's fault
        if why.startswith("Weights only load failed"):  # torch's advice (weights_only=False) would run the file's code
            why = "it holds something other than tensors, or is damaged; graphattn loads weights only, never code"
        raise CheckpointError(
            f"not a readable PyTorch checkpoint ({why}); expected the pytorch_model.bin that "
            "save_pretrained writes (a truncated download? fetch it again)",
            file=str(path),
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"expected a state dict of tensors, got {type(state).__name__}", file=str(path))
    return state


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def _normalise_names(state: dict[str, torch.Tensor], model_type: str) -> dict[str, torch.Tensor]:
    """Strip the task model's prefix (bert. / roberta.) and rename TF-era gamma/beta."""
    prefix = "bert." if model_type in BERT_TYPES else "roberta."
    out = {}
    for name, tensor in state.items():
        if name.startswith(prefix):
            name = name[len(prefix) :]
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))
        out[name] = tensor
    return out


# -- configuration ----------------------------------------------------------------------------


def _position_offset(hf: dict[str, Any], model_type: str) -> int:
    return int(hf.get("pad_token_id", 1)) + 1 if model_type in ROBERTA_TYPES else 0


def _model_type(hf: dict[str, Any], source: str) -> str:
    model_type = str(hf.get("model_type", ""))
    if model_type not in BERT_TYPES + ROBERTA_TYPES:
        raise GraphattnError(
            f"model_type {model_type!r} cannot be lifted; expected one of {', '.join(BERT_TYPES + ROBERTA_TYPES)}",
            file=source,
            path=("model_type",),
        )
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise GraphattnError(
            f"position_embedding_type {hf['position_embedding_type']!r} is not liftable (only 'absolute')",
            file=source,
            path=("position_embedding_type",),
        )
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise GraphattnError(
            "decoder / cross-attention checkpoints cannot be lifted into an encoder", file=source, path=("is_decoder",)
        )
    return model_type


def etc_config_from_hf(hf: dict[str, Any], keep_absolute_positions: bool = True, **overrides: Any) -> EtcConfig:
    """An EtcConfig with the checkpoint's sizes; ETC's local/relative defaults unless overridden.

    type_vocab_size is at least 16 (schemas use ETC's type ids up to 7); positions keep every
    row the checkpoint can serve (RoBERTa: max_position_embeddings - padding_idx - 1)."""
    model_type = _model_type(hf, "config.json")
    check_hf_config(hf)
    act = str(hf.get("hidden_act", "gelu"))
    if act not in _ACTIVATIONS:
        raise GraphattnError(
            f"hidden_act {act!r} has no EtcConfig equivalent ({', '.join(_ACTIVATIONS)})", path=("hidden_act",)
        )
    positions = int(hf.get("max_position_embeddings", 512)) - _position_offset(hf, model_type)
    derived = dict(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        num_hidden_layers=int(hf["num_hidden_layers"]),
        num_attention_heads=int(hf["num_attention_heads"]),
        intermediate_size=int(hf["intermediate_size"]),
        type_vocab_size=max(int(hf.get("type_vocab_size", 2)), EtcConfig.type_vocab_size),
        hidden_act=_ACTIVATIONS[act],
        layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
        hidden_dropout_prob=float(hf.get("hidden_dropout_prob", 0.1)),
        max_absolute_position_embeddings=positions if keep_absolute_positions else 0,
    )
    return EtcConfig(**{**derived, **overrides})


# -- copying ------------------------------------------------------------------------------------


class _Lifter:
    """Copies tensors into an encoder, checking shapes and writing the report as it goes."""

    def __init__(self, encoder: EtcEncoder, hf_state: dict[str, torch.Tensor], report: LiftReport):
        self.params = dict(encoder.named_parameters())
        self.hf_state, self.report, self.used = hf_state, report, set()

    def hf(self, name: str) -> torch.Tensor:
        if name not in self.hf_state:
            raise GraphattnError(f"the checkpoint has no tensor {name!r}", file=self.report.source, path=(name,))
        self.used.add(name)
        return self.hf_state[name]

    def copy(self, etc_name: str, hf_name: str, value: torch.Tensor | None = None) -> None:
        target = self.params[etc_name]
        value = self.hf(hf_name) if value is None else value
        if tuple(value.shape) != tuple(target.shape):
            raise GraphattnError(
                f"size mismatch: checkpoint tensor {hf_name} has shape {tuple(value.shape)} but {etc_name} "
                f"has shape {tuple(target.shape)}; check the EtcConfig sizes against config.json",
                file=self.report.source,
                path=(hf_name,),
            )
        with torch.no_grad():
            target.copy_(value.to(target.dtype))
        self.report.copied.append((etc_name, hf_name, tuple(value.shape)))

    def copy_linear(self, etc_module: str, hf_module: str) -> None:
        for suffix in ("weight", "bias"):
            self.copy(f"{etc_module}.{suffix}", f"{hf_module}.{suffix}")

    def copy_rows(self, etc_name: str, hf_name: str, start: int, what: str) -> None:
        """Rows start.. of an HF table into an ETC table with as many or more rows. Extra type
        rows start as a copy of row 0 (so a new type begins where the checkpoint's type 0 is);
        extra vocabulary rows keep the encoder's fresh initialisation."""
        target, source = self.params[etc_name], self.hf(hf_name)[start:]
        if source.shape[1:] != target.shape[1:] or source.shape[0] == 0:
            raise GraphattnError(
                f"size mismatch: checkpoint tensor {hf_name} "
                f"has shape {tuple(self.hf_state[hf_name].shape)} but {etc_name} "
                f"has shape {tuple(target.shape)}",
                file=self.report.source,
                path=(hf_name,),
            )
        rows = target.shape[0]
        if source.shape[0] >= rows:
            self.copy(etc_name, hf_name, source[:rows])
            if source.shape[0] > rows and what == "positions":
                self.report.dropped.append(
                    (f"{hf_name}[{start + rows}:]", f"beyond max_absolute_position_embeddings={rows}")
                )
            elif source.shape[0] > rows:
                raise GraphattnError(
                    f"size mismatch: checkpoint tensor {hf_name} has {source.shape[0]} {what} rows but {etc_name} "
                    f"has only {rows} (shape {tuple(target.shape)})",
                    file=self.report.source,
                    path=(hf_name,),
                )
            return
        if what == "positions":
            raise GraphattnError(
                f"size mismatch: {etc_name} wants {rows} positions (shape {tuple(target.shape)}) but checkpoint tensor "
                f"{hf_name} (shape {tuple(self.hf_state[hf_name].shape)}) serves {source.shape[0]}",
                file=self.report.source,
                path=(hf_name,),
            )
        with torch.no_grad():
            target[: source.shape[0]].copy_(source.to(target.dtype))
            if what == "token type":
                target[source.shape[0] :].copy_(source[:1].to(target.dtype).expand(rows - source.shape[0], -1))
        self.report.copied.append((f"{etc_name}[:{source.shape[0]}]", hf_name, tuple(source.shape)))
        how = "initialised as row 0 (a new type starts as type 0)" if what == "token type" else "freshly initialised"
        self.report.created.append(
            (f"{etc_name}[{source.shape[0]}:]", f"{rows - source.shape[0]} new {what} rows, {how}")
        )


def lift_into(
    encoder: EtcEncoder,
    hf_state: dict[str, torch.Tensor],
    hf_config: dict[str, Any],
    *,
    relative_init: str = "zeros",
    source: str = "<state dict>",
) -> LiftReport:
    """Copy an HF BERT/RoBERTa state dict into `encoder` in place; returns the report."""
    model_type = _model_type(check_hf_config(hf_config, source), source)
    if relative_init not in ("zeros", "normal"):
        raise GraphattnError(
            f"relative_init must be 'zeros' or 'normal', got {relative_init!r}", path=("relative_init",)
        )
    cfg = encoder.config
    report = LiftReport(source=source, model_type=model_type)
    state = _normalise_names(hf_state, model_type)
    lifter = _Lifter(encoder, state, report)
    if cfg.num_hidden_layers != int(hf_config["num_hidden_layers"]):
        raise GraphattnError(
            f"the encoder has {cfg.num_hidden_layers} layers but the checkpoint has {hf_config['num_hidden_layers']}",
            file=source,
            path=("num_hidden_layers",),
        )
    if cfg.num_attention_heads != int(hf_config["num_attention_heads"]):
        raise GraphattnError(
            f"the encoder has {cfg.num_attention_heads} heads "
            f"but the checkpoint has {hf_config['num_attention_heads']}",
            file=source,
            path=("num_attention_heads",),
        )

    lifter.copy_rows("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight", 0, "vocabulary")
    lifter.copy_rows(
        "embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight", 0, "token type"
    )
    for etc_norm in ("embeddings.layer_norm", "embeddings.global_layer_norm"):
        lifter.copy_linear(etc_norm, "embeddings.LayerNorm")
    position_table = "embeddings.position_embeddings.weight"
    if cfg.max_absolute_position_embeddings:
        offset = _position_offset(hf_config, model_type)
        for etc_table in ("embeddings.position_embeddings.weight", "embeddings.global_position_embeddings.weight"):
            lifter.copy_rows(etc_table, position_table, offset, "positions")
    elif position_table in state:
        lifter.used.add(position_table)
        report.dropped.append((position_table, "max_absolute_position_embeddings=0 (relative positions only)"))
        report.unused[position_table] = state[position_table]

    for n in range(cfg.num_hidden_layers):
        for etc_name, hf_name in _PER_LAYER.items():
            lifter.copy_linear(f"layer.{n}.{etc_name}", f"encoder.layer.{n}.{hf_name}")
        for etc_name, hf_name in _COPIES.items():
            if f"layer.{n}.{etc_name}.weight" in lifter.params:
                lifter.copy_linear(f"layer.{n}.{etc_name}", f"encoder.layer.{n}.{hf_name}")
        _init_relative(encoder, n, relative_init, report)

    for name in sorted(set(state) - lifter.used):
        report.dropped.append((name, _why_dropped(name)))
        report.unused[name] = state[name]
    return report


def _init_relative(encoder: EtcEncoder, n: int, how: str, report: LiftReport) -> None:
    attention = encoder.layer[n].attention
    with torch.no_grad():
        for prefix in ("", "global_"):
            key_table = getattr(attention, f"{prefix}relative_key_table", None)
            if key_table is None:
                continue
            if how == "zeros":
                key_table.zero_()
            else:
                key_table.normal_(std=encoder.config.initializer_range)
            report.created.append(
                (
                    f"layer.{n}.attention.{prefix}relative_key_table",
                    "zeros (lifted output unchanged)" if how == "zeros" else "normal",
                )
            )
            bias_table = getattr(attention, f"{prefix}relative_bias_table", None)
            if bias_table is not None:
                bias_table.zero_()
                report.created.append((f"layer.{n}.attention.{prefix}relative_bias_table", "zeros"))


def _why_dropped(name: str) -> str:
    if name.startswith("pooler."):
        return "pooler (ETC heads read global tokens instead)"
    if name.startswith(("cls.", "lm_head.")):
        return "pre-training head (kept in LiftReport.unused)"
    if name.endswith(("position_ids", "token_type_ids")):
        return "buffer"
    return "no counterpart in EtcEncoder"


def lift_pretrained(
    checkpoint_dir: str | os.PathLike,
    config: EtcConfig | None = None,
    *,
    keep_absolute_positions: bool = True,
    relative_init: str = "zeros",
    **overrides: Any,
) -> tuple[EtcEncoder, LiftReport]:
    """EtcEncoder with weights lifted from a local BERT/RoBERTa checkpoint directory.

    Without `config` the encoder's sizes come from config.json (plus `overrides`, e.g.
    local_radius=84); with one, its sizes must agree with the checkpoint's."""
    source = str(checkpoint_dir)
    hf_config = read_hf_config(checkpoint_dir)
    _model_type(hf_config, source)
    if config is None:
        config = etc_config_from_hf(hf_config, keep_absolute_positions=keep_absolute_positions, **overrides)
    elif overrides:
        config = config.with_changes(**overrides)
    encoder = EtcEncoder(config)
    report = lift_into(encoder, read_hf_weights(checkpoint_dir), hf_config, relative_init=relative_init, source=source)
    return encoder, report
