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


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: one intra-op thread is faster than two fighting over a shared, loaded machine.
    Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
