"""Test-wide setup. Triton kernels run under the interpreter on CPU, which must be switched on
before triton is first imported, so it is set here, ahead of every test module."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed() -> None:
    np.random.seed(0)
    torch.manual_seed(0)
