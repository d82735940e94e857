"""The fused CPU kernel as PyTorch operators (fused_op.py): torch.compile(fullgraph=True) traces
through the blocked backend and equals the dense oracle, torch.library.opcheck passes, a bad
chunk table is refused, concurrent calls give right values, and without a compiler the backend
warns once and runs its PyTorch path."""

from __future__ import annotations

import shutil
import threading

import pytest
import torch
from kernel_cases import RESULT_NAMES, assert_all_close, run, synthetic_case

from graphattn.kernels import blocked, dense, fused_build, fused_cpu
from graphattn.kernels.request import direct_request

needs_kernel = pytest.mark.skipif(
    not ((shutil.which("c++") or shutil.which("g++")) and shutil.which("ninja")), reason="no C++ compiler or ninja"
)
LAYOUT = dict(num_long=61, num_global=6, radius=6, num_docs=2, mention_links=5, empty_long_rows=2)


def _plan(case, **options):
    gq, gk, _, lq, *_ = case.states
    return blocked.plan(direct_request(case.side, gq, gk, lq, case.key_table, fused=True, **options))


def _oracle(**layout):
    return run(dense.attention, synthetic_case(**layout))


@needs_kernel
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
@pytest.mark.parametrize("queries", ["both", "long"])
def test_compiled_fullgraph_equals_the_dense_oracle(backend, queries) -> None:
    case = synthetic_case(dtype=torch.float32, **LAYOUT)
    plan = _plan(case, workers=2)

    def layer(*inputs):
        return blocked.run(plan, inputs[:6], inputs[7], inputs[8], inputs[9], queries=queries)

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    expected = _oracle(**LAYOUT)
    if queries == "long":  # the global side comes out as zeros and passes no gradient back
        expected = run(lambda *a: blocked.run(plan, a[:6], a[7], a[8], a[9], queries="long"), case)
    assert_all_close(run(compiled, case), expected, 1e-5, RESULT_NAMES, 0.1)


def _op_args(case, plan, workers: int = 2):
    geo, chunks = plan.geo, plan.fused_chunks["both"]
    flat = [s.detach().reshape(geo.bh, s.shape[2], s.shape[3]).clone().requires_grad_() for s in case.states]
    key, bias = (t.detach().clone().requires_grad_() for t in (case.key_table, case.bias_table))
    return (*flat, key, bias, key, None, chunks.table, chunks.labels, geo.heads, 0.4, workers)


@needs_kernel
def test_the_operators_pass_opcheck() -> None:
    case = synthetic_case(dtype=torch.float32, num_long=40, num_global=5, radius=4, mention_links=3)
    args = _op_args(case, _plan(case))
    torch.library.opcheck(torch.ops.graphattn.fused_forward.default, args)
    outs = torch.ops.graphattn.fused_forward(*args)
    detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in args[:10]]
    grads = [torch.randn_like(o) for o in outs[:2]]
    backward_args = (*detached, *args[10:], *(o.detach() for o in outs), *grads)
    torch.library.opcheck(torch.ops.graphattn.fused_backward.default, backward_args)


@needs_kernel
def test_a_chunk_table_the_plan_did_not_make_is_refused() -> None:
    case = synthetic_case(dtype=torch.float32, num_long=40, num_global=5, radius=4, mention_links=3)
    args = list(_op_args(case, _plan(case)))
    table = args[10]
    for column, value, said in (
        (10, 10_000, "reaches rows or keys past its tensors"),
        (0, 7, "not one the plan makes"),
    ):
        args[10] = table.clone()
        args[10][0, column] = value
        with pytest.raises(ValueError, match=said):
            torch.ops.graphattn.fused_forward(*args)
    args[10], args[11] = table[:1], args[11][:3]
    with pytest.raises(ValueError, match="1 chunks need 5 label tensors"):
        torch.ops.graphattn.fused_forward(*args)


@needs_kernel
def test_two_threads_at_once_give_the_oracles_values() -> None:
    case = synthetic_case(dtype=torch.float32, **LAYOUT)
    plan = _plan(case, workers=2)
    expected, results, errors = _oracle(**LAYOUT), [], []

    def call() -> None:
        try:
            for _ in range(3):
                results.append(run(lambda *a: blocked.run(plan, a[:6], a[7], a[8], a[9]), case))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 6
    for result in results:
        assert_all_close(result, expected, 1e-5, RESULT_NAMES, 0.1)


@pytest.mark.parametrize("missing", ["compiler", "ninja"])
def test_without_a_compiler_or_ninja_one_warning_and_the_pytorch_path(monkeypatch, tmp_path, missing) -> None:
    if missing == "compiler":
        monkeypatch.delenv("CXX", raising=False)
        monkeypatch.setenv("PATH", str(tmp_path))  # no c++, no g++
        said_why = r"no C\+\+ compiler"
    else:
        monkeypatch.setenv("CXX", shutil.which("c++") or "g++")
        monkeypatch.setattr(fused_build, "tool_path", lambda: str(tmp_path))  # where no ninja is
        said_why = r"ninja \(the build tool torch.utils.cpp_extension needs\) was not found"
    monkeypatch.setenv("GRAPHATTN_CACHE", str(tmp_path))
    fused_cpu.reset()
    try:
        case = synthetic_case(dtype=torch.float32, **LAYOUT)
        with pytest.warns(UserWarning, match=rf"{said_why}.*slower PyTorch path") as said:
            first = run(blocked.attention, case)
        second = run(blocked.attention, case)
        assert len(said) == 1 and not fused_cpu.available()
        for result in (first, second):
            assert_all_close(result, _oracle(**LAYOUT), 1e-5, RESULT_NAMES, 0.1)
    finally:
        monkeypatch.undo()
        fused_cpu.reset()
