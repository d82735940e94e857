"""global_local_attention: input checks before any kernel, backend dispatch, defaults."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from kernel_cases import assert_all_close, run, synthetic_case

import graphattn.kernels as kernels
import graphattn.kernels.prepared as prepared
from graphattn.contract import SideInputs
from graphattn.errors import BatchError
from graphattn.kernels import dense, global_local_attention


@pytest.fixture
def case():
    return synthetic_case(dtype=torch.float32, dim=16, num_long=12, num_global=3, radius=2)


def call(case, backend="dense", **overrides):
    args = dict(
        global_q=case.states[0],
        global_k=case.states[1],
        global_v=case.states[2],
        long_q=case.states[3],
        long_k=case.states[4],
        long_v=case.states[5],
        side=case.side,
        rel_key_table=case.key_table,
        rel_bias_table=case.bias_table,
        backend=backend,
    )
    args.update(overrides)
    return global_local_attention(**args)


def replace_side(side: SideInputs, **fields) -> SideInputs:
    values = side.as_dict()
    values.update(fields)
    return SideInputs(**values)


def test_auto_is_blocked_on_cpu_and_matches_dense(case) -> None:
    assert kernels.resolve_backend("auto", torch.device("cpu")) == "blocked"
    with torch.no_grad():
        auto = call(case, backend="auto")
        reference = dense.attention(*case.states, case.side, case.key_table, case.bias_table, 1 / math.sqrt(16))
    assert_all_close(list(auto), list(reference), 1e-5)


def test_scale_defaults_to_inverse_sqrt_head_dim(case) -> None:
    with torch.no_grad():
        default = call(case)
        explicit = call(case, scale=0.25)
        other = call(case, scale=1.0)
    assert torch.equal(default[1], explicit[1])
    assert not torch.equal(default[1], other[1])


def test_numpy_side_inputs_are_accepted(case) -> None:
    with torch.no_grad():
        from_numpy = call(case, side=case.side.to_numpy())
        from_torch = call(case)
    assert torch.equal(from_numpy[1], from_torch[1])


def test_gradients_flow_through_the_entry_point(case) -> None:
    results = run(lambda *a: global_local_attention(*a[:9], backend="blocked", scale=a[9]), case)
    expected = run(dense.attention, case)
    assert_all_close(results, expected, 1e-5)


def test_autocast_bf16_runs_and_returns_the_state_dtype(case) -> None:
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        states = [s.bfloat16() for s in case.states]
        out = call(
            case,
            backend="blocked",
            **dict(zip(["global_q", "global_k", "global_v", "long_q", "long_k", "long_v"], states)),
        )
    assert out[0].dtype == torch.bfloat16 and out[1].dtype == torch.bfloat16


BAD_INPUTS = {
    "state shape": (dict(long_k=torch.zeros(2, 2, 11, 16)), "long_k"),
    "state dtype": (dict(long_v=torch.zeros(2, 2, 12, 16, dtype=torch.float64)), "long_v"),
    "state rank": (dict(global_q=torch.zeros(2, 3, 16)), "global_q"),
    "unknown backend": (dict(backend="cudnn"), "backend"),
    "key table shape": (dict(rel_key_table=torch.zeros(7, 2, 8)), "rel_key_table"),
    "bias table shape": (dict(rel_bias_table=torch.zeros(7, 3)), "rel_bias_table"),
}


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_states_and_tables_name_the_tensor(case, name) -> None:
    overrides, tensor_name = BAD_INPUTS[name]
    with pytest.raises(BatchError, match=tensor_name):
        call(case, **overrides)


def test_side_input_shape_mismatch(case) -> None:
    side = replace_side(case.side, l2g_att_mask=case.side.l2g_att_mask[:, :, :2])
    with pytest.raises(BatchError, match=r"side\.l2g_att_mask.*\[2, 12, 2\].*expected \[2, 12, 3\]"):
        call(case, side=side)


def test_float_side_inputs_are_rejected(case) -> None:
    side = replace_side(case.side, g2g_att_mask=case.side.g2g_att_mask.float())
    with pytest.raises(BatchError, match=r"side\.g2g_att_mask.*integer"):
        call(case, side=side)


def test_label_id_past_the_table(case) -> None:
    ids = case.side.g2l_relative_att_ids.clone()
    ids[1, 2, 5] = case.vocab
    with pytest.raises(
        BatchError,
        match=rf"side\.g2l_relative_att_ids.*id {case.vocab} at index \[1, 2, 5\].*vocabulary of {case.vocab}",
    ):
        call(case, side=replace_side(case.side, g2l_relative_att_ids=ids))


def test_negative_label_id(case) -> None:
    ids = case.side.l2l_relative_att_ids.clone()
    ids[0, 0, 0] = -1
    with pytest.raises(BatchError, match=r"l2l_relative_att_ids.*-1"):
        call(case, side=replace_side(case.side, l2l_relative_att_ids=ids))


def test_radius_must_match_the_model(case) -> None:
    with pytest.raises(BatchError, match="local radius 2, but the model's local_radius is 3"):
        call(case, local_radius=3)
    even = replace_side(
        case.side,
        l2l_att_mask=case.side.l2l_att_mask[..., :4],
        l2l_relative_att_ids=case.side.l2l_relative_att_ids[..., :4],
    )
    with pytest.raises(BatchError, match="odd"):
        call(case, side=even)


def test_triton_rejects_an_unsupported_head_dim_before_running(case, monkeypatch) -> None:
    class FakeTriton:
        SUPPORTED_HEAD_DIMS = (32, 64)

        @staticmethod
        def attention(*args):
            raise AssertionError("the kernel must not run")

    monkeypatch.setattr(prepared, "_triton_module", lambda: FakeTriton)
    with pytest.raises(BatchError, match="head_dim 16 is not supported by the 'triton' backend"):
        call(case, backend="triton")


def test_missing_triton_module_gives_a_clear_error(case, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "graphattn.kernels.triton.attention", None)
    assert not kernels.triton_available()
    with pytest.raises(RuntimeError, match="backend='triton' needs triton"):
        call(case, backend="triton")
    assert kernels.resolve_backend("auto", torch.device("cpu")) == "blocked"
