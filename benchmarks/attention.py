"""Benchmark: graphattn's global-local attention beside the peers a user would pick instead.

For each long length L (G = L/16 globals, one per 16-token sentence, one document, soft g2l
(--hard-g2l for ETC's pre-training masks), r = 84, 12 heads, d = 64, batch 1, fp32, 32 labels
with a^K and a label bias):

    blocked      graphattn.kernels.global_local_attention(backend="blocked"), checks included;
                 the default: fp32 on the fused C++ kernel (built at first use), one chunk at a
                 time on each of torch.get_num_threads() worker threads (a fixed deal, so
                 results repeat bit for bit)
    blocked-layer the same backend as a model's later layers call it: prepared once per batch
                 (outside the timing), chunk label indices cached by the first call
    blocked-eager the blocked backend's PyTorch path (fused=False: where no C compiler is, and
                 for fp64 and bf16 tiles), its chunks one after another, each op on torch's
                 intra-op threads
    blocked-bf16 the default on bf16 copies of the inputs (outputs bf16): with gradients fp32 on the
                 fused kernel, without them bf16 tiles on the PyTorch path where the CPU
                 multiplies bf16 in hardware
    flex         torch FlexAttention, compiled; its BlockMask build is timed apart ("flex mask")
                 and added ("flex+mask"). CPU FlexAttention has no backward: fwd only.
    dense-sdpa   [G+L, G+L] label-bias + mask tensor, then scaled_dot_product_attention
                 (the bias build is part of the time). Skipped where it would not fit.
    longformer   HF transformers LongformerSelfAttention on G+L tokens (window 2*84, the first G
                 tokens global, no label bias). It includes its Q/K/V projections, counted in
                 its GFLOP/s.
    triton bf16  (CUDA only) graphattn's fused kernels on bf16 / fp16 copies of the inputs, labels
    triton fp16  from the compact structure (the timed call includes the einsum of the label table)

Then, for --mask-lengths (default 4K and 16K), the FlexAttention BlockMask built from the compact
structure (graphattn.kernels.structure: document and owner ranges, the band, link tiles) beside
torch's create_block_mask evaluating the mask_mod on every pair; and, for --encoder-lengths
(default 4K), one forward of a 12-layer ETC-base encoder with backend="flex", before (every layer
validated its side inputs and rebuilt the BlockMask with create_block_mask) and after (prepared
once per forward, BlockMask from the structure).

Time: median and min wall time of --repeats runs after the warm-up; the methods take turns
so that load from other processes falls on all of them alike. GFLOP/s, % of matmul and the
time ratio use the min (the run least disturbed by other processes), and the matmul rate is the
best of 7 rounds measured in the same run; the load average is printed before and after. Peak memory: each (method, L,
mode) runs once more in a fresh subprocess (the flex rows share one) with glibc told to mmap
every allocation above 64 KiB and return freed memory at once (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_), so the resident set follows live memory; after a warm-up the peak-RSS
counter is reset (/proc/self/clear_refs) and peak = VmHWM after one call - VmRSS before it. Inputs and outputs
that exist before the call are excluded; everything the call allocates (outputs, scratch,
autograd state, compiled kernels' buffers, and the buffers the blocked backward keeps between
calls, released before the measured call) counts. GFLOP/s counts only the nonzero work:
4*d flops per allowed (query, key) pair and head (q.k and p.v), x3.5 for forward+backward.

Last, one row per L of the default's speed: the blocked backend's GFLOP/s as a share of the fp32
matmul rate, forward and forward+backward, and FlexAttention's forward time over the blocked
backend's. --documents N splits the L tokens into N equal documents; with --hard-g2l and
--documents 2 the shape is band-heavy (issue 40's speed shape).

Usage: python benchmarks/attention.py [--quick] [--lengths 1024 4096] [--no-memory]
                                      [--hard-g2l] [--documents 2]
                                      [--mask-lengths 4096 16384] [--encoder-lengths 4096]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphattn.compact import CompactBatch, CompactSideInputs  # noqa: E402
from graphattn.contract import SideInputs  # noqa: E402
from graphattn.kernels import (  # noqa: E402
    blocked,
    blocked_fused,
    dense,
    flex,
    global_local_attention,
    prepare_attention,
    triton_available,
)
from graphattn.kernels.structure import compact_to_side  # noqa: E402

HEADS, DIM, RADIUS, MAX_DISTANCE, VOCAB, TOKENS_PER_GLOBAL = 12, 64, 84, 12, 32, 16
DENSE_MAX_ELEMENTS = 12 * 4352 * 4352  # dense SDPA up to L = 4096 ([H, N, N] fp32 ~ 0.9 GB per copy)


@dataclass
class Inputs:
    states: list[torch.Tensor]
    side: SideInputs
    compact: CompactBatch
    key_table: torch.Tensor
    bias_table: torch.Tensor
    hidden: torch.Tensor  # [1, G+L, 768] for Longformer


def make_compact(length: int, hard_g2l: bool, device: str = "cpu", documents: int = 1) -> CompactBatch:
    """`documents` equal documents (one by default), one global per 16-token sentence (its
    owner), soft l2g: the structure of etcmodel's side inputs with breakpoints at the ends (the
    same eight tensors). Hard g2l with several documents is band-heavy: each global sees only its
    own sentence, and no long token sees across a document's end."""
    num_global = length // TOKENS_PER_GLOBAL
    zeros = lambda n: np.zeros(n, np.int32)  # noqa: E731
    doc_of = lambda tokens: (tokens * documents // length).astype(np.int32)  # noqa: E731
    side = CompactSideInputs(
        local_radius=RADIUS,
        max_distance=MAX_DISTANCE,
        levels=("sentence",),
        owners=(np.arange(length) // TOKENS_PER_GLOBAL)[None].astype(np.int32),
        long_doc=doc_of(np.arange(length)),
        long_segment=zeros(length),
        global_doc=doc_of(np.arange(num_global) * TOKENS_PER_GLOBAL),
        global_segment=zeros(num_global),
        global_blockable=np.zeros(num_global, bool),
        long_hard_l2g=np.zeros(length, bool),
        global_hard_g2l=np.full(num_global, hard_g2l),
    )
    return CompactBatch.from_instances([side], length, num_global).to_torch().map(lambda t: t.to(device))


def make_inputs(
    length: int, hard_g2l: bool, device: str = "cpu", dtype=torch.float32, grad: bool = False, documents: int = 1
) -> Inputs:
    num_global = length // TOKENS_PER_GLOBAL
    compact = make_compact(length, hard_g2l, device, documents)
    side = compact_to_side(compact)
    gen = torch.Generator().manual_seed(0)
    rand = lambda *s, std=1.0: (torch.randn(*s, generator=gen) * std).to(device, dtype).requires_grad_(grad)  # noqa: E731
    states = [rand(1, HEADS, n, DIM) for n in (num_global,) * 3 + (length,) * 3]
    return Inputs(
        states,
        side,
        compact,
        rand(VOCAB, HEADS, DIM, std=0.1),
        rand(VOCAB, HEADS, std=0.1),
        rand(1, num_global + length, HEADS * DIM),
    )


def nonzero_pairs(side: SideInputs) -> int:
    """Allowed (query, key) pairs of the ETC pattern, summed over the batch (per head)."""
    length, radius = side.long_length, side.local_radius
    keys = torch.arange(length)[:, None] + torch.arange(-radius, radius + 1)[None]
    inside = ((keys >= 0) & (keys < length)).to(side.l2l_att_mask.device)
    l2l = int(((side.l2l_att_mask != 0) & inside).sum())
    return l2l + sum(int((getattr(side, f"{n}_att_mask") != 0).sum()) for n in ("g2g", "l2g", "g2l"))


# -- methods: each returns (run, flops_of_one_forward) ------------------------------------------
def graphattn_method(backend: str):
    def build(inp: Inputs, backward: bool):
        def run():
            out = global_local_attention(*inp.states, inp.side, inp.key_table, inp.bias_table, backend=backend)
            if backward:
                (out[0].sum() + out[1].sum()).backward()

        return run, nonzero_pairs(inp.side) * HEADS * 4 * DIM

    return build


def blocked_layer(inp: Inputs, backward: bool):
    """The default blocked backend as each layer of a model after the first calls it: the batch
    prepared once (outside the timed call) and its chunk label indices already cached."""
    prepared = prepare_attention(
        inp.compact, num_heads=HEADS, head_dim=DIM, vocab_size=VOCAB, backend="blocked", device=inp.hidden.device
    )

    def run():
        out = prepared.attend(*inp.states, inp.key_table, inp.bias_table)
        if backward:
            (out[0].sum() + out[1].sum()).backward()

    return run, nonzero_pairs(inp.side) * HEADS * 4 * DIM


def blocked_with(**options):
    """The blocked backend with plan options (fused=False: its eager PyTorch path)."""

    def build(inp: Inputs, backward: bool):
        def run():
            out = blocked.attention(*inp.states, inp.side, inp.key_table, inp.bias_table, 1 / math.sqrt(DIM), **options)
            if backward:
                (out[0].sum() + out[1].sum()).backward()

        return run, nonzero_pairs(inp.side) * HEADS * 4 * DIM

    return build


def blocked_bf16(inp: Inputs, backward: bool):
    """The default blocked backend on bf16 copies of the inputs (as an autocast model feeds it)."""
    make = lambda t: t.detach().to(torch.bfloat16).requires_grad_(backward)  # noqa: E731
    states, key_table, bias_table = [make(t) for t in inp.states], make(inp.key_table), make(inp.bias_table)

    def run():
        for t in states + [key_table, bias_table]:
            t.grad = None
        out = global_local_attention(*states, inp.side, key_table, bias_table, backend="blocked")
        if backward:
            (out[0].float().sum() + out[1].float().sum()).backward()

    return run, nonzero_pairs(inp.side) * HEADS * 4 * DIM


def triton_half(dtype: torch.dtype):
    """The Triton kernels on half-precision copies of the inputs (tensor cores), prepared once."""

    def build(inp: Inputs, backward: bool):
        make = lambda t: t.detach().to(dtype).requires_grad_(backward)  # noqa: E731
        states, key_table, bias_table = [make(t) for t in inp.states], make(inp.key_table), make(inp.bias_table)
        attention = prepare_attention(
            inp.compact,
            num_heads=HEADS,
            head_dim=DIM,
            vocab_size=VOCAB,
            backend="triton",
            dtype=dtype,
            device=states[0].device,
        )

        def run():
            with torch.set_grad_enabled(backward):
                out = attention.attend(*states, key_table, bias_table)
                if backward:
                    (out[0].float().sum() + out[1].float().sum()).backward()

        return run, nonzero_pairs(inp.side) * HEADS * 4 * DIM

    return build


def flex_prepared(inp: Inputs):
    """FlexAttention prepared from the compact structure (BlockMask built from it)."""
    return prepare_attention(
        inp.compact, num_heads=HEADS, head_dim=DIM, vocab_size=VOCAB, backend="flex", device=inp.hidden.device
    )


def flex_kernel(inp: Inputs, backward: bool):
    attention = flex_prepared(inp)

    def run():
        with torch.set_grad_enabled(backward):
            out = attention.attend(*inp.states, inp.key_table, inp.bias_table)
            if backward:
                (out[0].sum() + out[1].sum()).backward()

    return run, nonzero_pairs(inp.side) * HEADS * 4 * DIM


def flex_mask(inp: Inputs, backward: bool):
    def run():
        flex_prepared(inp)

    return run, 0


def flex_total(inp: Inputs, backward: bool):
    def run():
        with torch.set_grad_enabled(backward):
            out = flex_prepared(inp).attend(*inp.states, inp.key_table, inp.bias_table)
            if backward:
                (out[0].sum() + out[1].sum()).backward()

    return run, nonzero_pairs(inp.side) * HEADS * 4 * DIM


def dense_sdpa(inp: Inputs, backward: bool):
    from graphattn.kernels.blocked import label_tables

    num_global, length = inp.states[0].shape[2], inp.states[3].shape[2]
    scale = 1 / math.sqrt(DIM)

    def run():
        q, k, v = (torch.cat([inp.states[i], inp.states[i + 3]], 2) for i in range(3))
        labels, mask = dense.full_labels_and_mask(inp.side, num_global, length)
        table = label_tables(q, inp.key_table, inp.bias_table, scale)  # [B, H, N, V]
        bias = torch.gather(table, -1, labels[:, None].expand(-1, HEADS, -1, -1))
        bias = bias.masked_fill_(~mask[:, None], float("-inf"))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
        if backward:
            out.nan_to_num().sum().backward()

    return run, nonzero_pairs(inp.side) * HEADS * 4 * DIM


def longformer(inp: Inputs, backward: bool):
    from transformers import LongformerConfig
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    window = 2 * RADIUS
    config = LongformerConfig(
        hidden_size=HEADS * DIM, num_attention_heads=HEADS, attention_window=[window], attention_probs_dropout_prob=0.0
    )
    module = LongformerSelfAttention(config, layer_id=0).to(inp.hidden.device, inp.hidden.dtype).eval()
    num_global, tokens = inp.states[0].shape[2], inp.hidden.shape[1]
    padded = math.ceil(tokens / window) * window  # the module needs a multiple of its window
    hidden = torch.nn.functional.pad(inp.hidden.detach(), (0, 0, 0, padded - tokens)).requires_grad_(backward)
    mask = torch.zeros(1, padded, device=hidden.device, dtype=hidden.dtype)
    mask[:, :num_global] = 10000.0  # global
    mask[:, tokens:] = -10000.0  # padding
    is_masked, is_global = mask < 0, mask > 0

    def run():
        with torch.set_grad_enabled(backward):
            out = module(
                hidden,
                attention_mask=mask,
                is_index_masked=is_masked,
                is_index_global_attn=is_global,
                is_global_attn=True,
            )[0]
            if backward:
                out.sum().backward()

    local = (tokens - num_global) * (window + 1) + (
        tokens - num_global
    ) * num_global  # window (edges aside) + global keys
    pairs = local + num_global * tokens
    projections = 2 * tokens * (HEADS * DIM) ** 2 * 3 + 2 * num_global * (HEADS * DIM) ** 2 * 3
    return run, pairs * HEADS * 4 * DIM + projections


METHODS: dict[str, Callable] = {
    "blocked": graphattn_method("blocked"),
    "blocked-layer": blocked_layer,
    "blocked-eager": blocked_with(fused=False),
    "blocked-bf16": blocked_bf16,
    "flex": flex_kernel,
    "flex mask": flex_mask,
    "flex+mask": flex_total,
    "dense-sdpa": dense_sdpa,
    "longformer": longformer,
}


def skip_reason(method: str, length: int, backward: bool, device: str) -> str | None:
    if method.startswith("flex") and not flex.available():
        return "no FlexAttention in this torch"
    if method.startswith("flex") and backward and device == "cpu":
        return "no CPU backward"
    if method == "flex mask" and backward:
        return "-"
    if method == "dense-sdpa":
        tokens = length + length // TOKENS_PER_GLOBAL
        if HEADS * tokens * tokens > DENSE_MAX_ELEMENTS:
            return f"skipped: [H,N,N] = {HEADS * tokens * tokens * 4 / 2**30:.1f} GiB per copy"
    return None


def time_methods(
    builds: dict[str, Callable], inp: Inputs, backward: bool, repeats: int
) -> dict[str, tuple[float, float, int]]:
    """{name: (median s, min s, flops)}. Methods take turns (round robin) so that load from other
    processes on a shared machine falls on all of them alike."""
    runs = {}
    for name, build in builds.items():
        run, flops = build(inp, backward)
        run()  # warm-up (compiles flex, builds the fused kernel)
        runs[name] = (run, flops, [])
    tensors = inp.states + [inp.key_table, inp.bias_table, inp.hidden]
    for _ in range(repeats):
        for run, _, times in runs.values():
            for t in tensors:
                t.grad = None
            start = time.perf_counter()
            run()
            if inp.hidden.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return {name: (statistics.median(times), min(times), flops) for name, (_, flops, times) in runs.items()}


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    raise KeyError(key)


def _measure_peak(run: Callable[[], None]) -> float:
    """MB of resident memory one call adds at its peak (see the module docstring)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    run()
    return (_status_kib("VmHWM") - before) / 1024


def child_peak_memory(method: str, length: int, backward: bool, hard_g2l: bool, documents: int) -> None:
    """Run in a fresh process: print {row name: peak MB} as JSON. The three flex rows share one
    process so that FlexAttention compiles once."""
    inp = make_inputs(length, hard_g2l, grad=backward, documents=documents)
    rows = ["flex mask", "flex", "flex+mask"] if method.startswith("flex") else [method]
    peaks = {}
    for row in rows:
        run, _ = METHODS[row](inp, backward)
        run()  # warm-up: compiles, and first-touch of anything cached
        for t in inp.states + [inp.key_table, inp.bias_table, inp.hidden]:
            t.grad = None
        blocked_fused.release_workspace()  # what the backward keeps between calls counts in the call
        peaks[row] = _measure_peak(run)
    print(json.dumps(peaks))


_PEAKS: dict[tuple, dict] = {}


def peak_memory(method: str, length: int, backward: bool, hard_g2l: bool, documents: int) -> float | None:
    key = ("flex" if method.startswith("flex") else method, length, backward, hard_g2l, documents)
    if key not in _PEAKS:
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
        args = (
            [sys.executable, __file__, "--child", key[0], str(length), "bwd" if backward else "fwd"]
            + (["--hard-g2l"] if hard_g2l else [])
            + ["--documents", str(documents)]
        )
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            print(
                f"  [memory run of {method} L={length} failed: {proc.stderr.strip().splitlines()[-1:]}]",
                file=sys.stderr,
            )
            _PEAKS[key] = {}
        else:
            _PEAKS[key] = json.loads(proc.stdout.strip().splitlines()[-1])
    return _PEAKS[key].get(method)


def matmul_gflops(device: str, repeats: int = 7) -> float:
    """The machine's fp32 matmul rate: 2048^3 products, the best of `repeats` rounds of 5 (on a
    shared machine the best round is the one least disturbed)."""
    a, b = torch.randn(2048, 2048, device=device), torch.randn(2048, 2048, device=device)
    a @ b
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(5):
            a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 5 * 2 * 2048**3 / best / 1e9


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages (the number of runnable processes; 2 cores here)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def fmt(value: float | None, width: int, spec: str, suffix: str = "") -> str:
    """A right-aligned number with its unit, or a dash when there is none."""
    text = "-" if value is None else format(value, spec) + suffix
    return text.rjust(width)


def best_of(run: Callable[[], object], repeats: int, device: str) -> float:
    """Fastest of `repeats` calls after one warm-up, in seconds."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def block_mask_rows(lengths: list[int], hard_g2l: bool, device: str, repeats: int) -> None:
    """The BlockMask from the compact structure beside create_block_mask (mask_mod on every pair)."""
    print(
        f"\nFlexAttention BlockMask per batch (G = L/{TOKENS_PER_GLOBAL}, r = {RADIUS}, block {flex.BLOCK}): best of "
        f"{repeats}"
    )
    print(f"{'L':>6} {'from structure ms':>18} {'create_block_mask ms':>21} {'ratio':>7}  same blocks")
    for length in lengths:
        compact = make_compact(length, hard_g2l, device)
        side = compact_to_side(compact)
        num_global = compact.global_length
        structure = lambda: flex.block_mask_from_structure(compact, num_global, num_global, length)  # noqa: E731
        by_pairs = lambda: flex.block_mask_from_mask_mod(side, num_global, length)  # noqa: E731
        ours, theirs = best_of(structure, repeats, device), best_of(by_pairs, max(1, repeats // 2), device)
        same = torch.equal(structure().to_dense().bool(), by_pairs().to_dense().bool())
        print(f"{length:>6} {ours * 1e3:>18.1f} {theirs * 1e3:>21.1f} {theirs / ours:>6.0f}x  {same}", flush=True)


def encoder_rows(lengths: list[int], hard_g2l: bool, device: str, repeats: int) -> None:
    """A 12-layer ETC-base encoder's forward with backend="flex": per-layer preparation with
    create_block_mask (what every layer did before) against one preparation per forward."""
    from graphattn.nn import EtcConfig, EtcEncoder

    print(f"\n12-layer encoder forward, backend='flex', inference: best of {repeats}")
    print(f"{'L':>6} {'before ms':>10} {'after ms':>10} {'saved ms':>9} {'before/after':>12}")
    config = EtcConfig(
        local_radius=RADIUS,
        relative_pos_max_distance=MAX_DISTANCE,
        relative_vocab_size=VOCAB,
        hidden_dropout_prob=0.0,
        attention_backend="flex",
    )
    torch.manual_seed(0)
    encoder = EtcEncoder(config).to(device).eval()
    for length in lengths:
        compact = make_compact(length, hard_g2l, device)
        side = compact_to_side(compact)
        num_global = compact.global_length
        hidden = [torch.randn(1, n, config.hidden_size, device=device) for n in (num_global, length)]

        def before():
            global_hidden, long_hidden = hidden
            for layer in encoder.layer:  # each layer validated and built its own BlockMask
                attention = prepare_attention(
                    side,
                    num_heads=config.num_attention_heads,
                    head_dim=config.head_dim,
                    vocab_size=VOCAB,
                    backend="flex",
                    local_radius=RADIUS,
                    block_mask="mask_mod",
                )
                global_hidden, long_hidden = layer(global_hidden, long_hidden, attention)
            return long_hidden

        def after():
            attention = encoder.layer[0].attention.prepare(compact, torch.device(device))
            return encoder.run_layers(*hidden, attention)[1]

        with torch.no_grad():
            torch.testing.assert_close(before(), after())
            old, new = best_of(before, repeats, device), best_of(after, repeats, device)
        print(
            f"{length:>6} {old * 1e3:>10.0f} {new * 1e3:>10.0f} {(old - new) * 1e3:>9.0f} {old / new:>11.2f}x",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="L in 1024, 2048; 3 repeats")
    parser.add_argument("--lengths", type=int, nargs="+")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument(
        "--hard-g2l", action="store_true", help="global tokens see only the tokens they own (ETC pre-training)"
    )
    parser.add_argument(
        "--mask-lengths", type=int, nargs="*", help="L of the BlockMask comparison (default 4096 16384; none: skip)"
    )
    parser.add_argument(
        "--encoder-lengths", type=int, nargs="*", help="L of the 12-layer flex encoder rows (default 4096; none: skip)"
    )
    parser.add_argument("--documents", type=int, default=1, help="equal documents the L tokens are split into")
    parser.add_argument("--child", nargs=3, metavar=("METHOD", "L", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    hard_g2l = args.hard_g2l
    if args.child:
        method, length, mode = args.child
        child_peak_memory(method, int(length), mode == "bwd", hard_g2l, args.documents)
        return

    lengths = args.lengths or ([1024, 2048] if args.quick else [1024, 2048, 4096, 8192, 16384])
    repeats = args.repeats or 5
    device = "cuda" if torch.cuda.is_available() else "cpu"
    peak = matmul_gflops(device)
    print(
        f"device {device}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"fp32 matmul {peak:.0f} GFLOP/s; load average {load_average()}"
    )
    print(
        f"G = L/{TOKENS_PER_GLOBAL}, r = {RADIUS}, {HEADS} heads, d = {DIM}, B = 1, fp32 (triton: bf16 and fp16 "
        "copies, CUDA only), label bias, "
        f"{'hard' if hard_g2l else 'soft'} g2l, {args.documents} document{'s' if args.documents > 1 else ''}"
    )
    header = (
        f"{'L':>6} {'mode':>7} {'method':>13} {'median ms':>10} {'min ms':>8} {'peak MB':>8} {'GFLOP/s':>8} "
        f"{'% matmul':>8} {'time/blocked':>12} {'mem/blocked':>11}"
    )
    print(header)
    print("-" * len(header))
    methods = {name: METHODS[name] for name in args.methods}
    if device == "cuda" and triton_available():
        methods.update({"triton bf16": triton_half(torch.bfloat16), "triton fp16": triton_half(torch.float16)})
    speed = []  # (L, blocked fwd % matmul, blocked fwd+bwd % matmul, flex fwd / blocked fwd)
    for length in lengths:
        shares: dict[str, float | None] = {}
        for backward in (False, True):
            mode = "fwd+bwd" if backward else "fwd"
            skipped = {name: skip_reason(name, length, backward, device) for name in methods}
            builds = {name: build for name, build in methods.items() if not skipped[name]}
            inputs = make_inputs(length, hard_g2l, device, grad=backward, documents=args.documents)
            timings = time_methods(builds, inputs, backward, repeats)
            memory = {
                name: None
                if args.no_memory or device != "cpu"
                else peak_memory(name, length, backward, hard_g2l, args.documents)
                for name in builds
            }
            base_time = timings.get("blocked", (None, None))[1]
            base_memory = memory.get("blocked")
            for name in methods:
                if skipped[name]:
                    if skipped[name] != "-":
                        print(f"{length:>6} {mode:>7} {name:>13}   {skipped[name]}")
                    continue
                median, fastest, flops = timings[name]
                flops *= 3.5 if backward else 1.0
                gflops = flops / fastest / 1e9 if flops else None
                share = 100 * gflops / peak if gflops else None
                ratio_t = fastest / base_time if base_time else None
                ratio_m = memory[name] / base_memory if base_memory and memory[name] else None
                if name == "blocked":
                    shares[mode] = share
                if name == "flex" and not backward:
                    shares["flex/blocked"] = ratio_t
                print(
                    f"{length:>6} {mode:>7} {name:>13} {median * 1e3:>10.1f} {fastest * 1e3:>8.1f} "
                    f"{fmt(memory[name], 8, '.0f')} "
                    f"{fmt(gflops, 8, '.1f')} {fmt(share, 8, '.0f', '%')} {fmt(ratio_t, 12, '.2f', 'x')} "
                    f"{fmt(ratio_m, 11, '.2f', 'x')}",
                    flush=True,
                )
        speed.append((length, shares.get("fwd"), shares.get("fwd+bwd"), shares.get("flex/blocked")))
    print(f"load average after: {load_average()}")
    print(f"\nspeed of the default (blocked, fused CPU kernel) against the fp32 matmul rate ({peak:.0f} GFLOP/s):")
    for length, fwd, both, flex_ratio in speed:
        print(
            f"{length:>6}  fwd {fmt(fwd, 4, '.0f', '%')} of matmul  fwd+bwd {fmt(both, 4, '.0f', '%')} of matmul  "
            f"flex fwd time / blocked fwd time {fmt(flex_ratio, 6, '.2f', 'x')}"
        )
    if flex.available():
        mask_lengths = (
            args.mask_lengths if args.mask_lengths is not None else ([1024, 4096] if args.quick else [4096, 16384])
        )
        encoder_lengths = (
            args.encoder_lengths if args.encoder_lengths is not None else ([1024] if args.quick else [4096])
        )
        if mask_lengths:
            block_mask_rows(mask_lengths, hard_g2l, device, repeats)
        if encoder_lengths:
            encoder_rows(encoder_lengths, hard_g2l, device, max(1, repeats // 2))


if __name__ == "__main__":
    main()
