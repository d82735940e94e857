"""LongNetAttention: projections around the dilated kernel, checked against the dense oracle."""

from __future__ import annotations

import pytest
import torch

from graphattn.errors import GraphattnError
from graphattn.patterns.dilated import dilated_attention_reference
from graphattn.patterns.longnet import LongNetAttention

PAIRS = ((4, 1), (8, 2), (16, 4))


@pytest.mark.parametrize("causal", [False, True])
def test_module_is_projections_around_the_reference(causal) -> None:
    torch.manual_seed(0)
    module = LongNetAttention(12, 3, PAIRS, causal=causal).double()
    hidden = torch.randn(2, 21, 12, dtype=torch.float64)
    padding = torch.ones(2, 21, dtype=torch.bool)
    padding[1, 15:] = False
    split = lambda x: x.view(2, 21, 3, 4).transpose(1, 2)  # noqa: E731
    q, k, v = (split(proj(hidden)) for proj in (module.query, module.key, module.value))
    expected = dilated_attention_reference(q, k, v, PAIRS, causal=causal, key_padding=padding)
    expected = module.output(expected.transpose(1, 2).reshape(2, 21, 12))
    torch.testing.assert_close(module(hidden, padding), expected)


def test_bad_head_split_is_reported() -> None:
    with pytest.raises(GraphattnError, match="not divisible"):
        LongNetAttention(10, 3)
