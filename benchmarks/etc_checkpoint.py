"""Load an ETC-base-sized checkpoint: graphattn's TensorBundle loader beside torch.load of the same tensors.

The checkpoint is random, made by etcmodel itself (not committed; about 460 MB):

    TF_USE_LEGACY_KERAS=1 PYTHONPATH=/path/to/etcmodel_parent \\
        python tests/fixtures/etc/make_fixtures.py /tmp/etc_base --base
    python benchmarks/etc_checkpoint.py /tmp/etc_base

Rows (median of --repeats, page cache warm for both, alternating so a slow moment hits both):
  * read: every tensor of the bundle as torch tensors, every crc32c checked (TensorBundle.read)
    vs torch.load of a .pt holding the same tensors (written once here, beside the checkpoint
    unless --scratch says where);
  * load: load_etc_checkpoint (read + map onto an EtcEncoder, kernels transposed) vs torch.load +
    EtcEncoder + load_state_dict (what a graphattn-native checkpoint costs).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from graphattn.nn import EtcEncoder
from graphattn.nn.etc_checkpoint import load_etc_checkpoint
from graphattn.nn.tensorbundle import TensorBundle


def read_bundle(prefix: Path) -> dict[str, torch.Tensor]:
    bundle = TensorBundle(prefix)
    return {name: bundle.read(name) for name in bundle.names()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="directory with etc_config.json and model.ckpt.*")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scratch", type=Path, help="where to write the torch.save files (default: beside it)")
    args = parser.parse_args()
    scratch = args.scratch or args.checkpoint
    prefix = args.checkpoint / "model.ckpt"
    raw_pt, encoder_pt = scratch / "same_tensors.pt", scratch / "encoder_state.pt"
    tensors = {name: t.clone() for name, t in read_bundle(prefix).items() if isinstance(t, torch.Tensor)}
    torch.save(tensors, raw_pt)
    encoder, _ = load_etc_checkpoint(args.checkpoint)
    torch.save({k: v.contiguous() for k, v in encoder.state_dict().items()}, encoder_pt)
    config = encoder.config
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    del encoder, tensors

    def native() -> None:
        state = torch.load(encoder_pt, weights_only=True)
        with torch.device("meta"):
            model = EtcEncoder(config)
        model.load_state_dict(state, assign=True)

    def plain_encoder() -> None:  # what load_state_dict into a freshly initialised encoder costs
        state = torch.load(encoder_pt, weights_only=True)
        EtcEncoder(config).load_state_dict(state)

    runs = {
        "read: TensorBundle, every crc checked": lambda: read_bundle(prefix),
        "read: torch.load of the same tensors": lambda: torch.load(raw_pt, weights_only=True),
        "load: load_etc_checkpoint": lambda: load_etc_checkpoint(args.checkpoint),
        "load: torch.load + EtcEncoder(meta) + assign": native,
        "load: torch.load + EtcEncoder() + load_state_dict": plain_encoder,
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in times.items()}
    shape = f"{config.num_hidden_layers} layers, hidden {config.hidden_size}"
    print(f"{args.checkpoint}: {size / 1e6:.0f} MB of tensors, {shape}")
    print(f"{'what':52s} {'median s':>9s} {'best s':>8s}")
    for name, values in times.items():
        print(f"{name:52s} {median[name]:9.3f} {min(values):8.3f}")
    read = median["read: TensorBundle, every crc checked"] / median["read: torch.load of the same tensors"]
    load = median["load: load_etc_checkpoint"] / median["load: torch.load + EtcEncoder(meta) + assign"]
    print(f"ratio read {read:.2f}x, load {load:.2f}x torch.load (target: under 2x)")
    raw_pt.unlink()
    encoder_pt.unlink()


if __name__ == "__main__":
    main()
