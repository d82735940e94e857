"""Time and memory per token of each attention pattern beside dense SDPA and HF Longformer.

    python benchmarks/patterns.py [--quick] [--lengths 4096 8192 ...] [--heads 8] [--head-dim 64]
                                  [--mode train|forward] [--budget 120] [--device cpu|cuda]

--quick: L = 4K and 8K, forward only, one repeat (a few minutes on 2 busy cores).

Every row is one self-attention layer over hidden states [B, L, H*d]: Q/K/V projections plus the
pattern (HF's LongformerSelfAttention also projects, and has no output projection either), run
forward (and backward with --mode train, the default), at each L. Rows:

  dense SDPA            torch scaled_dot_product_attention, full bidirectional [L, L]   (peer)
  HF Longformer         transformers' LongformerSelfAttention, window 512, CLS global  (peer)
  LongNet               graphattn dilated attention, the paper's schedule
                        w = 2048..32768, r = 1..12 (w clamped to L)
  LongNet x2 procs      the same split over 2 gloo processes on CPU (sequence parallel); time is
                        the slower rank's, memory the sum of both ranks'
  compressive memory    one graphattn compressive encoder layer (ETC attention with radius 84
                        and one global per 32 tokens, PLUS its feed-forward block) streaming L
                        tokens as segments of 768 over full memories n_m = 768, n_cm = 1152,
                        c = 3 (Enwik8), backward per segment; its cost per token must not grow
                        with L. Memory slots enter the ETC kernel as key-only global slots.
  compressive (query rows)  the same, with the memory slots entering as fully masked global
                        QUERY rows as well (how graphattn did it before key-only slots): the
                        difference to the row above is the attention work the key-only slots save.
  + the Longformer-mode rows registered in the marked section below.

Time is the best of --repeats steps (1 with --quick, which then includes first-call costs).
Each (row, L) runs in a fresh Python process, so its peak memory is its own: on CUDA the peak
allocated bytes above the inputs, on CPU the growth of peak RSS (VmHWM, reset before the run)
above the RSS with inputs built. A size is skipped, with the reason printed, when the row's
cost extrapolated from its last measured L (quadratic for dense, linear for the rest) exceeds
--budget seconds, or when it runs out of memory. Ratios are against the peers at the same L.
The machine is shared with other engineers: absolute numbers are noisy, read the ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from graphattn.patterns.compressive import MemoryState

HF_WINDOW = 512


@dataclass
class Setup:
    length: int
    batch: int
    heads: int
    head_dim: int
    device: torch.device
    train: bool
    rank: int = 0
    world: int = 1

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


@dataclass
class Pattern:
    name: str
    build: Callable[[Setup], Callable[[], torch.Tensor]]  # returns one step: output [B, L_local, D]
    exponent: int = 1  # cost growth with L, for extrapolating skips
    processes: int = 1  # > 1: run in a gloo group of that many processes (CPU)
    peer: bool = False
    owns_backward: bool = False  # the step runs its own backward (per segment)


PATTERNS: dict[str, Pattern] = {}


def register(pattern: Pattern) -> Pattern:
    PATTERNS[pattern.name] = pattern
    return pattern


class QKV(torch.nn.Module):
    """The projections every graphattn row shares: hidden [B, L, D] -> q, k, v [B, H, L, d]."""

    def __init__(self, setup: Setup):
        super().__init__()
        self.heads = setup.heads
        self.proj = torch.nn.Linear(setup.hidden, 3 * setup.hidden)

    def forward(self, hidden: torch.Tensor):
        batch, length, _ = hidden.shape
        qkv = self.proj(hidden).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    batch, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * dim)


def hidden_states(setup: Setup) -> torch.Tensor:
    gen = torch.Generator().manual_seed(setup.rank)
    length = setup.length // setup.world
    x = torch.randn(setup.batch, length, setup.hidden, generator=gen).to(setup.device)
    return x.requires_grad_(setup.train)


# ---------------------------------------------------------------------------------------------
# Peers
# ---------------------------------------------------------------------------------------------


def build_sdpa(setup: Setup):
    proj, x = QKV(setup).to(setup.device), hidden_states(setup)
    return lambda: merge_heads(torch.nn.functional.scaled_dot_product_attention(*proj(x)))


def build_hf_longformer(setup: Setup):
    from transformers import LongformerConfig
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    config = LongformerConfig(hidden_size=setup.hidden, num_attention_heads=setup.heads, attention_window=[HF_WINDOW])
    layer = LongformerSelfAttention(config, layer_id=0).to(setup.device)
    x = hidden_states(setup)
    padded = math.ceil(setup.length / HF_WINDOW) * HF_WINDOW  # HF pads to the window in the model
    x = torch.nn.functional.pad(x.detach(), (0, 0, 0, padded - setup.length)).requires_grad_(setup.train)
    mask = torch.zeros(setup.batch, padded, device=setup.device)
    mask[:, setup.length :] = -10000.0  # padding
    mask[:, 0] = 10000.0  # CLS attends globally, as in every Longformer task
    masked, is_global = mask < 0, mask > 0
    return lambda: layer(
        x, attention_mask=mask, is_index_masked=masked, is_index_global_attn=is_global, is_global_attn=True
    )[0]


register(Pattern("dense SDPA", build_sdpa, exponent=2, peer=True))
register(Pattern("HF Longformer", build_hf_longformer, peer=True))


# ---------------------------------------------------------------------------------------------
# graphattn patterns
# ---------------------------------------------------------------------------------------------


def build_longnet(setup: Setup):
    from graphattn.patterns.dilated import LONGNET_SCHEDULE, dilated_attention
    from graphattn.patterns.dilated_parallel import dilated_attention_parallel

    torch.manual_seed(0)  # identical projections on every rank
    proj, x = QKV(setup).to(setup.device), hidden_states(setup)
    if setup.world == 1:
        return lambda: merge_heads(dilated_attention(*proj(x), LONGNET_SCHEDULE))
    return lambda: merge_heads(dilated_attention_parallel(*proj(x), LONGNET_SCHEDULE))


register(Pattern("LongNet", build_longnet))
register(Pattern("LongNet x2 procs", build_longnet, processes=2))


def _segment_batch(setup: Setup, length: int, num_global: int, radius: int, max_distance: int, seed: int):
    from graphattn.contract import EtcBatch
    from graphattn.kernels.synthetic import synthetic_side_inputs

    side, layout = synthetic_side_inputs(setup.batch, length, num_global, radius, max_distance, seed=seed)
    ids = lambda n: torch.randint(1, 1000, (setup.batch, n))  # noqa: E731
    batch = EtcBatch(
        long_token_ids=ids(length),
        long_type_ids=torch.zeros(setup.batch, length, dtype=torch.long),
        global_token_ids=ids(num_global),
        global_type_ids=torch.zeros(setup.batch, num_global, dtype=torch.long),
        long_input_mask=torch.ones(setup.batch, length, dtype=torch.int32),
        global_input_mask=torch.ones(setup.batch, num_global, dtype=torch.int32),
        side=side,
        vocab_size=layout.vocab_size,
    )
    return batch.to(setup.device)


def full_memory(setup: Setup, memory) -> MemoryState:
    """A steady-state memory (n_m and n_cm slots full of activations), as after a long stream."""
    from graphattn.patterns.compressive import LayerMemory, MemoryState

    gen = torch.Generator().manual_seed(2)
    n_m, n_cm, c = memory.memory_length, memory.compressed_length, memory.compression_rate
    start = c * n_cm + n_m
    rows = lambda n: torch.randn(setup.batch, n, setup.hidden, generator=gen).to(setup.device)  # noqa: E731
    positions = torch.arange(start - n_m, start, device=setup.device).expand(setup.batch, -1)
    spans = (
        torch.stack((torch.arange(n_cm) * c, torch.arange(n_cm) * c + c), dim=-1)
        .to(setup.device)
        .expand(setup.batch, -1, -1)
    )
    ones = lambda n: torch.ones(setup.batch, n, dtype=torch.bool, device=setup.device)  # noqa: E731
    return MemoryState(
        [LayerMemory(rows(n_m), positions, ones(n_m), rows(n_cm), spans, ones(n_cm))], next_position=start
    )


def build_compressive(setup: Setup, encoder_class=None):
    """One compressive layer (ETC radius 84, one global per 32 tokens, Enwik8 memory sizes)
    streaming L tokens; memories are full before timing starts. Training backpropagates per
    segment (TransformerXL style), so the step does its own backward."""
    from graphattn.nn import EtcConfig
    from graphattn.patterns.compressive import CompressiveConfig, CompressiveEncoder

    encoder_class = encoder_class or CompressiveEncoder

    memory = CompressiveConfig.enwik8()
    n_s = memory.segment_length
    config = EtcConfig(
        vocab_size=1000,
        hidden_size=setup.hidden,
        num_attention_heads=setup.heads,
        intermediate_size=4 * setup.hidden,
        num_hidden_layers=1,
        hidden_dropout_prob=0.0,
    )
    encoder = encoder_class(config, memory).to(setup.device).train(setup.train)
    segment = _segment_batch(setup, n_s, n_s // 32, config.local_radius, config.relative_pos_max_distance, seed=0)
    state = full_memory(setup, memory)
    full, rest = divmod(setup.length, n_s)
    stream = [segment] * full
    if rest:
        stream.append(
            _segment_batch(
                setup, rest, max(1, rest // 32), config.local_radius, config.relative_pos_max_distance, seed=1
            )
        )

    def step():
        current = state
        for part in stream:
            out = encoder(part, current)
            if setup.train:
                (out.long_hidden.float().mean() + out.reconstruction_loss).backward()
            current = out.state
        return out.long_hidden.detach()

    return step


class _QueryRowsPattern:
    """The old way in: every memory slot is also a global query row, fully masked, whose output
    is computed and dropped. Wraps the prepared attention of the square side inputs."""

    def __init__(self, prepared, num_global: int):
        self.prepared, self.num_global = prepared, num_global

    def attend(
        self, global_q, global_k, global_v, long_q, long_k, long_v, rel_key_table, rel_bias_table=None, scale=None
    ):
        batch, heads, _, dim = global_q.shape
        extra = global_k.shape[2] - global_q.shape[2]
        global_q = torch.cat((global_q, global_q.new_zeros(batch, heads, extra, dim)), dim=2)
        global_out, long_out = self.prepared.attend(
            global_q, global_k, global_v, long_q, long_k, long_v, rel_key_table, rel_bias_table, scale
        )
        return global_out[:, :, : self.num_global], long_out


def _square_side(side):
    """Key-only side inputs (g2g [B, G, G+M], g2l [B, G, L]) with the M masked query rows added."""
    from graphattn.contract import SideInputs

    batch, num_global, num_keys = side.g2g_att_mask.shape
    extra = num_keys - num_global
    rows = lambda t, width: torch.cat((t, t.new_zeros(batch, extra, width)), dim=1)  # noqa: E731
    values = side.as_dict()
    for name in ("g2g_att_mask", "g2g_relative_att_ids"):
        values[name] = rows(values[name], num_keys)
    for name in ("g2l_att_mask", "g2l_relative_att_ids"):
        values[name] = rows(values[name], side.long_length)
    return SideInputs(**values), num_global


def build_compressive_query_rows(setup: Setup):
    """`build_compressive` with the memory slots as masked global query rows (the old design)."""
    from graphattn.patterns.compressive import CompressiveEncoder

    class QueryRowsEncoder(CompressiveEncoder):
        def _prepare(self, side, device):
            square, num_global = _square_side(side)
            return _QueryRowsPattern(super()._prepare(square, device), num_global)

    return build_compressive(setup, QueryRowsEncoder)


register(Pattern("compressive memory", build_compressive, owns_backward=True))
register(Pattern("compressive (query rows)", build_compressive_query_rows, owns_backward=True))

# ---------------------------------------------------------------------------------------------
# Longformer mode (graphattn): the same layer as the HF Longformer row (Q/K/V and global
# Q/K/V projections, window 512, CLS global, no output projection), on the ETC kernels through
# graphattn.patterns.sliding (backend auto: triton on CUDA, blocked on CPU).
#   Longformer mode      every head undilated: HF's computation exactly
#   Longformer dilated   the paper's top layers: 2 heads with stride 4 (Table 12's "dilation 3"),
#                        run as a second kernel call on the sequence folded into 4 subsequences
# ---------------------------------------------------------------------------------------------


def build_longformer_mode(setup: Setup, dilated_heads: int = 0, stride: int = 4):
    from graphattn.patterns.longformer import LongformerAttention, LongformerConfig

    dilations = [1] * (setup.heads - dilated_heads) + [stride] * dilated_heads
    config = LongformerConfig(
        hidden_size=setup.hidden,
        num_attention_heads=setup.heads,
        num_hidden_layers=1,
        attention_window=HF_WINDOW,
        attention_dilation=[dilations],
    )
    attention = LongformerAttention(config).to(setup.device)
    x = hidden_states(setup)
    cls = torch.zeros(setup.batch, 1, dtype=torch.long, device=setup.device)  # CLS is global, as in the HF row
    return lambda: attention.context(x, cls)


register(Pattern("Longformer mode", build_longformer_mode))
register(Pattern("Longformer dilated", lambda setup: build_longformer_mode(setup, dilated_heads=min(2, setup.heads))))


# ---------------------------------------------------------------------------------------------
# Measuring one (pattern, L) in a fresh process
# ---------------------------------------------------------------------------------------------


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def _timed_steps(step, setup: Setup, repeats: int, owns_backward: bool = False) -> tuple[float, float]:
    """(best seconds per step, extra peak bytes) for `repeats` steps after the inputs exist."""
    cuda = setup.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        _reset_peak_rss()
        base = _rss_kib("VmRSS") * 1024
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.set_grad_enabled(setup.train):  # forward mode records no graph
            out = step()
        if setup.train and not owns_backward:
            out.float().sum().backward()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
        del out
    peak = torch.cuda.max_memory_allocated() if cuda else _rss_kib("VmHWM") * 1024
    return best, max(peak - base, 0)


def measure_local(pattern: Pattern, setup: Setup, repeats: int) -> dict:
    step = pattern.build(setup)
    seconds, peak = _timed_steps(step, setup, repeats, pattern.owns_backward)
    return {"seconds": seconds, "peak_bytes": peak}


def _rank_main(rank: int, world: int, init_file: str, out_dir: str, name: str, setup_dict: dict, repeats: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        setup = Setup(**{**setup_dict, "device": torch.device("cpu"), "rank": rank, "world": world})
        result = measure_local(PATTERNS[name], setup, repeats)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def measure(name: str, setup: Setup, repeats: int) -> dict:
    pattern = PATTERNS[name]
    if pattern.processes == 1:
        return measure_local(pattern, setup, repeats)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        setup_dict = {k: v for k, v in setup.__dict__.items() if k not in ("device", "rank", "world")}
        args = (pattern.processes, os.path.join(out_dir, "init"), out_dir, name, setup_dict, repeats)
        mp.spawn(_rank_main, args=args, nprocs=pattern.processes, join=True)
        ranks = [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(pattern.processes)]
    return {"seconds": max(r["seconds"] for r in ranks), "peak_bytes": sum(r["peak_bytes"] for r in ranks)}


def run_child(name: str, setup: Setup, repeats: int, timeout: float) -> dict:
    """Measure in a fresh interpreter: its peak memory is its own, and a crash or OOM is a row."""
    spec = json.dumps(
        {"name": name, "repeats": repeats, **{k: (str(v) if k == "device" else v) for k, v in setup.__dict__.items()}}
    )
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--child", spec], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"skipped": f"over the {timeout:.0f} s limit"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {
            "skipped": "out of memory"
            if "out of memory" in done.stderr.lower() or done.returncode == -9
            else f"failed: {tail[:80]}"
        }
    return json.loads(lines[-1])


def child_main(spec: str) -> None:
    spec = json.loads(spec)
    name, repeats = spec.pop("name"), spec.pop("repeats")
    spec["device"] = torch.device(spec["device"])
    print(json.dumps(measure(name, Setup(**spec), repeats)), flush=True)


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------


def _predicted_seconds(history: dict, name: str, length: int) -> float | None:
    last = history.get(name)
    if last is None:
        return None
    (prev_length, seconds) = last
    return seconds * (length / prev_length) ** PATTERNS[name].exponent


def _ratio(ours: dict, peer: dict | None, key: str) -> str:
    if peer is None or "skipped" in peer or "skipped" in ours or peer[key] <= 0:
        return "-"
    return f"{ours[key] / peer[key]:.2f}x"


def print_table(rows: list[tuple[str, int, dict]], setup: Setup) -> None:
    peers = [name for name, p in PATTERNS.items() if p.peer]
    header = f"{'pattern':<26}{'L':>7}{'ms':>11}{'us/token':>10}{'peak MiB':>10}{'KiB/token':>10}"
    header += "".join(f"{'t/' + p[:9]:>13}{'m/' + p[:9]:>13}" for p in peers)
    print(header)
    print("-" * len(header))
    by_key = {(name, length): result for name, length, result in rows}
    for name, length, result in rows:
        line = f"{name:<26}{length:>7}"
        if "skipped" in result:
            print(line + f"   skipped: {result['skipped']}")
            continue
        line += f"{result['seconds'] * 1e3:>11.1f}{result['seconds'] * 1e6 / length:>10.2f}"
        line += f"{result['peak_bytes'] / 2**20:>10.1f}{result['peak_bytes'] / 1024 / length:>10.2f}"
        for peer in peers:
            other = by_key.get((peer, length))
            line += f"{_ratio(result, other, 'seconds'):>13}{_ratio(result, other, 'peak_bytes'):>13}"
        print(line)
    print(
        f"\nbatch {setup.batch}, {setup.heads} heads x {setup.head_dim}, "
        f"{'forward+backward' if setup.train else 'forward'} "
        f"on {setup.device}; t/ and m/ are time and memory relative to that peer at the same L (< 1 is better)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="L = 4K and 8K, forward only, one repeat, small budget")
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--patterns", nargs="+", default=None, help=f"subset of: {', '.join(PATTERNS)}")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument(
        "--mode", choices=("train", "forward"), default=None, help="default: train (forward with --quick)"
    )
    parser.add_argument(
        "--budget", type=float, default=None, help="seconds one measurement may take (default 120, quick 60)"
    )
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0

    lengths = args.lengths or ([4096, 8192] if args.quick else [4096, 8192, 16384, 32768, 65536])
    budget = args.budget or (60.0 if args.quick else 120.0)
    repeats = args.repeats or (1 if args.quick else 2)
    names = args.patterns or list(PATTERNS)
    unknown = [n for n in names if n not in PATTERNS]
    if unknown:
        parser.error(f"unknown pattern(s) {unknown}; known: {list(PATTERNS)}")
    mode = args.mode or ("forward" if args.quick else "train")
    setup = Setup(0, args.batch, args.heads, args.head_dim, torch.device(args.device), mode == "train")
    history: dict[str, tuple[int, float]] = {}
    rows = []
    for length in lengths:
        for name in names:
            predicted = _predicted_seconds(history, name, length)
            if predicted is not None and predicted * (repeats + 1) > budget:
                why = f"predicted {predicted:.0f} s per step from L={history[name][0]}"
                result = {"skipped": f"{why}, x{repeats + 1} runs > budget {budget:.0f} s"}
            else:
                run_setup = Setup(**{**setup.__dict__, "length": length})
                result = run_child(name, run_setup, repeats, timeout=budget * (repeats + 1) + 120)
                if "skipped" not in result:
                    history[name] = (length, result["seconds"])
            rows.append((name, length, result))
            print(
                f"  {name} L={length}: {result.get('skipped') or format(result['seconds'], '.3f') + ' s'}",
                file=sys.stderr,
                flush=True,
            )
    print_table(rows, setup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
