"""On a GPU without the interpreter (TRITON_INTERPRET=0, as benchmarks/gpu_check.py runs these
tests) the Triton tests run their kernels on CUDA: the tests build CPU tensors, and the backend's
plan and inputs are moved to the GPU and the outputs back (autograd follows the moves), so the
same comparisons with the dense oracle check the compiled kernels."""

from __future__ import annotations

import os

import pytest
import torch

ON_GPU = os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and torch.cuda.is_available()


def _cuda(x):
    return x.cuda() if isinstance(x, torch.Tensor) and x.device.type == "cpu" else x


@pytest.fixture(autouse=True)
def triton_on_cuda(monkeypatch):
    if not ON_GPU:
        yield
        return
    import graphattn.kernels.triton.attention as backend

    real_init, real_run, real_check = backend.TritonPlan.__init__, backend.run, backend._check_states

    def init(self, structure, n_labels, device, *args, **kwargs):
        if device.type == "cpu":
            structure = structure.map(_cuda)
            device = torch.device("cuda", torch.cuda.current_device())
        real_init(self, structure, n_labels, device, *args, **kwargs)

    def run(plan, states, rel_key_table, rel_bias_table, scale, **options):
        on_cpu = states[0].device.type == "cpu"
        if options.get("global_tables") is not None:
            options["global_tables"] = tuple(_cuda(t) for t in options["global_tables"])
        outputs = real_run(
            plan, tuple(_cuda(s) for s in states), _cuda(rel_key_table), _cuda(rel_bias_table), scale, **options
        )
        return tuple(o.cpu() for o in outputs) if on_cpu else outputs

    monkeypatch.setattr(backend.TritonPlan, "__init__", init)
    monkeypatch.setattr(backend, "run", run)
    monkeypatch.setattr(
        backend, "_check_states", lambda states: real_check({name: _cuda(t) for name, t in states.items()})
    )
    yield
