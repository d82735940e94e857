"""The FlexAttention backend equals the dense oracle (forward on CPU; gradients on CUDA)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from kernel_cases import RESULT_NAMES, assert_all_close, compiler_case, graph_case, run, synthetic_case

from graphattn.kernels import dense, flex

pytestmark = pytest.mark.skipif(not flex.available(), reason="torch without FlexAttention")


def eager_flex(*args):
    return flex.attention(*args, compiled=False)


def test_forward_matches_dense_on_compiler_and_synthetic_batches() -> None:
    """Eager FlexAttention runs the same mask_mod/score_mod as the compiled kernel, in seconds."""
    cases = [
        graph_case(dtype=torch.float32, dim=16),
        compiler_case(dtype=torch.float32, dim=16, hard_g2l=True),
        synthetic_case(
            dtype=torch.float32,
            dim=16,
            num_docs=2,
            long_padding=3,
            global_padding=1,
            mention_links=5,
            empty_long_rows=2,
            empty_global_rows=1,
        ),
    ]
    for case in cases:
        with torch.no_grad():
            assert_all_close(run(eager_flex, case, grads=False), run(dense.attention, case, grads=False), 1e-5)


@pytest.mark.slow
def test_compiled_kernel_with_a_prebuilt_block_mask_and_no_globals() -> None:
    case = synthetic_case(dtype=torch.float32, dim=16, num_global=0, num_long=20, radius=30, bias=False)
    plan = flex.prepare(case.side, 0, 20)
    assert isinstance(plan.block_mask, flex.BlockMask)
    with torch.no_grad():
        actual = flex.attention(*case.states, case.side, case.key_table, None, 0.4, plan=plan)
        expected = dense.attention(*case.states, case.side, case.key_table, None, 0.4)
    assert_all_close(list(actual), list(expected), 1e-5)


@pytest.mark.slow
def test_compiled_create_block_mask_builds_the_same_mask_without_a_warning() -> None:
    """torch 2.13 deprecates create_block_mask(_compile=True): the compiled build goes through
    torch.compile(create_block_mask), and neither it nor a fallback warns from our code."""
    case = synthetic_case(dtype=torch.float32, dim=16, num_global=4, num_long=40, radius=4)
    package = str(Path(flex.__file__).parents[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = flex.block_mask_from_mask_mod(case.side, 4, 40).to_dense()
    ours = [f"{w.category.__name__}: {w.message}" for w in caught if w.filename.startswith(package)]
    assert ours == [] and not any("_compile" in str(w.message) for w in caught), ours
    assert torch.equal(compiled, flex.block_mask_from_mask_mod(case.side, 4, 40, compiled=False).to_dense())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only limitation")
def test_gradients_on_cpu_raise_a_clear_error() -> None:
    case = synthetic_case(dtype=torch.float32, dim=16)
    with pytest.raises(RuntimeError, match="no backward on CPU"):
        run(eager_flex, case)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs CUDA")
def test_gradients_match_dense_on_cuda() -> None:
    case = compiler_case(dtype=torch.float32, dim=16, hard_g2l=True)
    case.side = case.side.map(lambda t: t.cuda())
    with torch.no_grad():
        moved = [p.detach().cuda().requires_grad_() for p in case.params]
    case.states, case.key_table, case.bias_table = moved[:6], moved[6], moved[7]
    assert_all_close(run(flex.attention, case), run(dense.attention, case), 1e-4, RESULT_NAMES)
