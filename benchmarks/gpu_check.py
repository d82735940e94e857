"""One command for one CUDA GPU: the kernel tests without the interpreter, then the timings.

    python benchmarks/gpu_check.py [--lengths 4096 16384] [--budget 480] [--no-tests]

1. `pytest tests/kernels -m "not slow"` with TRITON_INTERPRET=0: the Triton tests then run the
   compiled kernels on CUDA (tests/kernels/conftest.py moves their inputs), the other backends'
   tests run as always.
2. At each L (G = L/16 globals, one per 16-token sentence, one document, r = 84, 12 heads,
   d = 64, bf16, 32 labels with a^K and a label bias), forward and forward+backward:

       triton      graphattn's fused kernels, labels from the compact structure
       flex        torch FlexAttention, compiled, BlockMask built from the compact structure
       sdpa        scaled_dot_product_attention with a dense [G+L, G+L] label-bias/mask tensor
       longformer  HF transformers' LongformerSelfAttention (window 2r, the first G tokens
                   global; its Q/K/V projections included in its time and flops)

   one Markdown table: median time (CUDA events), peak memory above the inputs, and TFLOP/s
   on the nonzero work (4 d flops per allowed pair and head, x3.5 forward+backward).

Everything is measured once the kernels are compiled (a warm-up call each). The whole run is
kept under --budget seconds (default 480, the 8 minutes a GPU check may take): rows that would
start past it are printed as skipped. Without CUDA it prints the table with every row skipped,
says why on stderr and exits 2 (nothing was measured); `--smoke` runs each method once, untimed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import attention as bench  # noqa: E402  (benchmarks/attention.py: inputs, flop counts, the peers)

from graphattn.kernels import prepare_attention  # noqa: E402

METHODS = ("triton", "flex", "sdpa", "longformer")
NO_GPU = 2  # exit status without CUDA: the table lists every row as skipped, nothing was measured


def run_kernel_tests(timeout: float) -> tuple[bool, str]:
    """tests/kernels without the interpreter; (passed, last lines of the report)."""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(ROOT / "tests" / "kernels"),
        "-q",
        "-m",
        "not slow",
        "-p",
        "no:cacheprovider",
        "-x",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"the kernel tests did not finish in {timeout:.0f} s"
    tail = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-3:]
    return done.returncode == 0, " / ".join(tail)


def _leaves(inp, dtype: torch.dtype, grad: bool):
    """The benchmark's inputs in `dtype`, as fresh leaves."""
    make = lambda t: t.detach().to(dtype).requires_grad_(grad)  # noqa: E731
    return [make(t) for t in inp.states], make(inp.key_table), make(inp.bias_table), make(inp.hidden)


def build(method: str, inp, backward: bool):
    """(run, flops of one forward) of a method on bf16 inputs."""
    states, key_table, bias_table, hidden = _leaves(inp, torch.bfloat16, backward)
    pairs = bench.nonzero_pairs(inp.side) * bench.HEADS * 4 * bench.DIM

    def with_grad(fn):
        def run():
            with torch.set_grad_enabled(backward):
                out = fn()
                if backward:
                    sum(o.float().sum() for o in out).backward()

        return run

    if method in ("triton", "flex"):
        attention = prepare_attention(
            inp.compact,
            num_heads=bench.HEADS,
            head_dim=bench.DIM,
            vocab_size=bench.VOCAB,
            backend=method,
            dtype=torch.bfloat16,
            device=states[0].device,
        )
        return with_grad(lambda: attention.attend(*states, key_table, bias_table)), pairs
    if method == "sdpa":
        inp_bf16 = bench.Inputs(states, inp.side, inp.compact, key_table, bias_table, hidden)
        return bench.dense_sdpa(inp_bf16, backward)
    inp_bf16 = bench.Inputs(states, inp.side, inp.compact, key_table, bias_table, hidden)
    return bench.longformer(inp_bf16, backward)


def measure(run, repeats: int) -> tuple[float, float]:
    """(median seconds, peak MB above what exists before the call)."""
    run()  # compiles
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 2**20


def smoke(lengths: list[int], methods: list[str], device: str) -> int:
    """Build and run each method once (forward; forward+backward where the device has one)."""
    for length in lengths:
        inp = bench.make_inputs(length, False, device, torch.float32)
        for method in methods:
            for backward in (False, True):
                if backward and method == "flex" and device == "cpu":
                    continue  # FlexAttention has no CPU backward
                run, flops = build(method, inp, backward)
                run()
                print(
                    f"smoke L={length} {'fwd+bwd' if backward else 'fwd'} {method}: ran ({flops / 1e9:.2f} GFLOP per "
                    "forward)",
                    flush=True,
                )
    return 0


def table(rows: list[tuple]) -> str:
    lines = [
        "| L | G | mode | method | median ms | peak MB | TFLOP/s (nonzero work) |",
        "|---:|---:|---|---|---:|---:|---:|",
    ]
    for length, mode, method, result in rows:
        if isinstance(result, str):
            lines.append(f"| {length} | {length // bench.TOKENS_PER_GLOBAL} | {mode} | {method} | {result} | | |")
        else:
            seconds, peak, tflops = result
            lines.append(
                f"| {length} | {length // bench.TOKENS_PER_GLOBAL} | {mode} | {method} | {seconds * 1e3:.2f} | "
                f"{peak:.0f} | {tflops:.1f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole check")
    parser.add_argument("--no-tests", action="store_true", help="skip the kernel tests")
    parser.add_argument(
        "--smoke", action="store_true", help="run every method once on this machine's device, untimed (tests use it)"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    cuda = torch.cuda.is_available()
    rows = []
    if args.smoke:
        return smoke(args.lengths, args.methods, "cuda" if cuda else "cpu")
    if not cuda:
        for length in args.lengths:
            for mode in ("fwd", "fwd+bwd"):
                rows.extend((length, mode, method, "skipped (no CUDA)") for method in args.methods)
        print(table(rows))
        print(
            "gpu_check: no CUDA GPU here (torch.cuda.is_available() is False): nothing was tested or timed. "
            "Run it on a machine with one CUDA GPU; --smoke runs each method once, untimed, on this CPU.",
            file=sys.stderr,
        )
        return NO_GPU
    name = torch.cuda.get_device_name()
    cc = torch.cuda.get_device_capability()
    print(f"GPU: {name} (compute capability {cc[0]}.{cc[1]}), torch {torch.__version__}")
    failed = False
    if not args.no_tests:
        passed, summary = run_kernel_tests(timeout=args.budget * 0.45)
        failed = not passed
        print(f"kernel tests without the interpreter: {'passed' if passed else 'FAILED'} ({summary})", flush=True)
    for length in args.lengths:
        for backward in (False, True):
            mode = "fwd+bwd" if backward else "fwd"
            inp = bench.make_inputs(length, False, "cuda", torch.float32)
            for method in args.methods:
                if time.perf_counter() - started > args.budget:
                    rows.append((length, mode, method, f"skipped: past the {args.budget:.0f} s budget"))
                    continue
                reason = "flex compiles for CUDA only" if method == "flex" and not bench.flex.available() else None
                if reason:
                    rows.append((length, mode, method, f"skipped: {reason}"))
                    continue
                try:
                    run, flops = build(method, inp, backward)
                    seconds, peak = measure(run, args.repeats)
                    rows.append(
                        (length, mode, method, (seconds, peak, flops * (3.5 if backward else 1.0) / seconds / 1e12))
                    )
                except torch.cuda.OutOfMemoryError:
                    rows.append((length, mode, method, "out of memory"))
                    torch.cuda.empty_cache()
                except Exception as err:  # noqa: BLE001 - one failing method must not hide the others
                    rows.append(
                        (length, mode, method, f"failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
                    )
                    failed = True
                print(
                    f"  L={length} {mode} {method}: done at {time.perf_counter() - started:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            del inp
            torch.cuda.empty_cache()
    print(table(rows))
    print(
        f"\n{time.perf_counter() - started:.0f} s in all; bf16, r = {bench.RADIUS}, {bench.HEADS} heads, d = "
        f"{bench.DIM}, B = 1"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
