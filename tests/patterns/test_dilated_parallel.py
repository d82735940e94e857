"""Sequence-parallel dilated attention on 2 gloo processes (CPU) equals the single-process result,
forward and backward; the all-gather's backward is a reduce-scatter (a sum over ranks).

All cases run in ONE spawn of two processes (starting torch twice costs seconds); each rank saves
its outputs and gradients to a temporary directory, and the test compares them here.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from graphattn.errors import BatchError
from graphattn.patterns.dilated import dilated_attention
from graphattn.patterns.dilated_parallel import all_gather_rows, dilated_attention_parallel, split_sequence

WORLD = 2
# (pairs, causal, length): 32 tokens = 16 per rank puts (4,1), (8,2), (16,1) on the local path
# and (32,4) on the all-gather path; 20 = 10 per rank makes every segment straddle or span ranks;
# 17 pads the last rank with one token (valid_length).
CASES = [
    (((4, 1), (8, 2), (16, 1), (32, 4)), False, 32),
    (((4, 1), (8, 2), (16, 1), (32, 4)), True, 32),
    (((4, 1), (8, 2), (32, 4)), False, 20),
    (((3, 1), (12, 3), (64, 6)), True, 17),
    (((2, 1), (16, 2), (18, 6)), False, 18),
]


def case_tensors(length: int, heads: int = 5):
    gen = torch.Generator().manual_seed(length)
    return [torch.randn(2, heads, length, 8, generator=gen, dtype=torch.float64) for _ in range(4)]  # q, k, v, grad


def _gather_check(rank: int) -> list[torch.Tensor]:
    """all_gather_rows forward and backward: rank p sends p+1; out[q] * (q+1+p) summed means the
    gradient on rank p is sum over receiving ranks r of (p+1+r)."""
    x = torch.full((3,), float(rank + 1), dtype=torch.float64, requires_grad=True)
    gathered = all_gather_rows(x)
    weights = torch.arange(WORLD, dtype=torch.float64)[:, None] + 1 + rank
    (gathered * weights).sum().backward()
    return [gathered.detach(), x.grad]


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        results = []
        for pairs, causal, length in CASES:
            q, k, v, grad = case_tensors(length)
            local = [split_sequence(t, WORLD, rank).clone().requires_grad_() for t in (q, k, v)]
            out = dilated_attention_parallel(*local, pairs, causal=causal, valid_length=length)
            out.backward(split_sequence(grad, WORLD, rank))
            results.append([out.detach(), *(t.grad for t in local)])
        torch.save({"cases": results, "gather": _gather_check(rank)}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("dilated_parallel")
    mp.spawn(_worker, args=(str(out_dir / "init"), str(out_dir)), nprocs=WORLD, join=True)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("index", range(len(CASES)))
def test_two_processes_equal_one(rank_results, index) -> None:
    pairs, causal, length = CASES[index]
    q, k, v, grad = case_tensors(length)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    out = dilated_attention(*inputs, pairs, causal=causal)
    out.backward(grad)
    want = [out.detach(), *(t.grad for t in inputs)]
    for j, name in enumerate(("out", "dq", "dk", "dv")):
        got = torch.cat([rank_results[r]["cases"][index][j] for r in range(WORLD)], dim=2)
        torch.testing.assert_close(got[:, :, :length], want[j], rtol=1e-10, atol=1e-10, msg=f"{name} of case {index}")
        assert (got[:, :, length:] == 0).all(), f"padding rows of {name} must stay 0"


def test_all_gather_backward_is_reduce_scatter(rank_results) -> None:
    for rank in range(WORLD):
        gathered, grad = rank_results[rank]["gather"]
        assert gathered[:, 0].tolist() == [1.0, 2.0]
        assert grad.tolist() == [float(sum(rank + 1 + r for r in range(WORLD)))] * 3


def test_split_sequence_pads_the_last_rank() -> None:
    x = torch.arange(5.0).view(1, 1, 5, 1)
    assert split_sequence(x, 2, 0).flatten().tolist() == [0.0, 1.0, 2.0]
    assert split_sequence(x, 2, 1).flatten().tolist() == [3.0, 4.0, 0.0]


def test_needs_an_initialized_process_group() -> None:
    q = torch.zeros(1, 1, 4, 2)
    with pytest.raises(BatchError, match="init_process_group"):
        dilated_attention_parallel(q, q, q, [(4, 1)])
