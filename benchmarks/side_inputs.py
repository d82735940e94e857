"""Time the eight ETC side inputs at ETC's base setting: ours beside straightforward peers.

    python benchmarks/side_inputs.py [--quick] [--long 4096] [--globals 256] [--radius 84] [--distance 12]

One document of `--sentences` sentences (one global each) fills most of the long input; the
rest is padding. Peers, measured in the same run on the same inputs:
  numpy-broadcast  one broadcast comparison + cast per tensor, eight separate arrays (the
                   obvious port of etcmodel's TensorFlow ops to numpy)
  torch-broadcast  the same ops in torch on CPU
(etcmodel itself needs TensorFlow, which this project does not depend on; ETC's issue quotes
~10 ms under tf.function on 2 cores for the same tensors.) Every peer's output is checked equal
to ours before timing. Numbers on a shared machine are noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from graphattn.compile.side_inputs import example_ids_from_breakpoints, side_inputs  # noqa: E402
from graphattn.labels import relative_position_ids  # noqa: E402


def make_document(long_length: int, global_length: int, sentences: int) -> tuple[np.ndarray, ...]:
    real_long = long_length - long_length // 32  # ~3% padding
    long_bp = np.zeros((1, long_length), np.int32)
    long_bp[0, real_long - 1] = 1
    global_bp = np.zeros((1, global_length), np.int32)
    global_bp[0, min(sentences, global_length) - 1] = 1
    owner = np.minimum(np.arange(long_length, dtype=np.int32) * sentences // real_long, sentences - 1)[None]
    return long_bp, global_bp, owner


def numpy_broadcast(long_bp, global_bp, owner, r, k):
    long_ex, global_ex = example_ids_from_breakpoints(long_bp), example_ids_from_breakpoints(global_bp)
    long_length, global_length = long_ex.shape[1], global_ex.shape[1]
    offsets = np.arange(-r, r + 1)
    keys = np.arange(long_length)[:, None] + offsets[None, :]
    inside = (keys >= 0) & (keys < long_length)
    key_ex = long_ex[:, np.clip(keys, 0, long_length - 1)]
    l2l_mask = (inside & (key_ex == long_ex[:, :, None])).astype(np.int32)
    l2l_ids = np.tile(relative_position_ids(offsets, k), (1, long_length, 1))
    g2g_mask = (global_ex[:, :, None] == global_ex[:, None, :]).astype(np.int32)
    positions = np.arange(global_length)
    g2g_ids = relative_position_ids(positions[None, None, :] - positions[None, :, None], k)
    l2g_mask = (long_ex[:, :, None] == global_ex[:, None, :]).astype(np.int32)
    g2l_mask = np.ascontiguousarray(l2g_mask.transpose(0, 2, 1))
    l2g_ids = (owner[:, :, None] == positions[None, None, :]).astype(np.int32) + 2 * k + 1
    g2l_ids = np.ascontiguousarray(l2g_ids.transpose(0, 2, 1))
    return dict(
        l2l_att_mask=l2l_mask,
        g2g_att_mask=g2g_mask,
        l2g_att_mask=l2g_mask,
        g2l_att_mask=g2l_mask,
        l2l_relative_att_ids=l2l_ids,
        g2g_relative_att_ids=g2g_ids,
        l2g_relative_att_ids=l2g_ids,
        g2l_relative_att_ids=g2l_ids,
    )


def torch_broadcast(long_bp, global_bp, owner, r, k):
    long_bp, global_bp, owner = (torch.from_numpy(x) for x in (long_bp, global_bp, owner))
    long_ex = long_bp.flip(-1).cumsum(-1, dtype=torch.int32).flip(-1)
    global_ex = global_bp.flip(-1).cumsum(-1, dtype=torch.int32).flip(-1)
    long_length, global_length = long_ex.shape[1], global_ex.shape[1]
    offsets = torch.arange(-r, r + 1)
    keys = torch.arange(long_length)[:, None] + offsets[None, :]
    inside = (keys >= 0) & (keys < long_length)
    key_ex = long_ex[:, keys.clamp(0, long_length - 1)]
    l2l_mask = (inside & (key_ex == long_ex[:, :, None])).int()
    rel = lambda d: torch.where(d.clamp(-k, k) >= 0, d.clamp(-k, k), k - d.clamp(-k, k)).int()  # noqa: E731
    l2l_ids = rel(offsets).repeat(1, long_length, 1)
    g2g_mask = (global_ex[:, :, None] == global_ex[:, None, :]).int()
    positions = torch.arange(global_length)
    g2g_ids = rel(positions[None, None, :] - positions[None, :, None])
    l2g_mask = (long_ex[:, :, None] == global_ex[:, None, :]).int()
    g2l_mask = l2g_mask.transpose(1, 2).contiguous()
    l2g_ids = (owner[:, :, None] == positions[None, None, :]).int() + 2 * k + 1
    g2l_ids = l2g_ids.transpose(1, 2).contiguous()
    return dict(
        l2l_att_mask=l2l_mask,
        g2g_att_mask=g2g_mask,
        l2g_att_mask=l2g_mask,
        g2l_att_mask=g2l_mask,
        l2l_relative_att_ids=l2l_ids,
        g2g_relative_att_ids=g2g_ids,
        l2g_relative_att_ids=l2g_ids,
        g2l_relative_att_ids=g2l_ids,
    )


def best_ms(fn, number: int, repeat: int) -> float:
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--long", type=int, default=4096)
    parser.add_argument("--globals", type=int, default=256)
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--radius", type=int, default=84)
    parser.add_argument("--distance", type=int, default=12)
    args = parser.parse_args(argv)
    number, repeat = (5, 3) if args.quick else (20, 7)
    torch.set_num_threads(2)

    long_bp, global_bp, owner = make_document(args.long, args.globals, args.sentences)
    r, k = args.radius, args.distance
    ours = side_inputs(long_bp, global_bp, owner, r, k).as_dict()
    for name, peer in (("numpy-broadcast", numpy_broadcast), ("torch-broadcast", torch_broadcast)):
        for tensor, value in peer(long_bp, global_bp, owner, r, k).items():
            assert np.array_equal(np.asarray(value), ours[tensor]), f"{name} disagrees on {tensor}"

    rows = [
        ("graphattn side_inputs", lambda: side_inputs(long_bp, global_bp, owner, r, k)),
        ("graphattn, hard g2l+l2g", lambda: side_inputs(long_bp, global_bp, owner, r, k, True, None, True, None)),
        ("numpy-broadcast", lambda: numpy_broadcast(long_bp, global_bp, owner, r, k)),
        ("torch-broadcast", lambda: torch_broadcast(long_bp, global_bp, owner, r, k)),
    ]
    print(f"eight side inputs, L={args.long} G={args.globals} r={r} k={k}, best of {repeat}x{number}")
    print(f"{'implementation':26s} {'ms':>8s} {'x ours':>8s}")
    base = None
    for label, fn in rows:
        ms = best_ms(fn, number, repeat)
        base = base or ms
        print(f"{label:26s} {ms:8.3f} {ms / base:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
