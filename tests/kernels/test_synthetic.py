"""The synthetic side-input generator agrees with the etcmodel-compatible builder."""

from __future__ import annotations

import pytest
import torch

from graphattn.compile.side_inputs import side_inputs
from graphattn.kernels.synthetic import synthetic_side_inputs


@pytest.mark.parametrize("hard", [False, True])
def test_matches_the_compiler_builder_for_one_document_with_padding(hard) -> None:
    side, layout = synthetic_side_inputs(
        2, 30, 5, 4, 3, long_padding=4, global_padding=1, hard_g2l=hard, hard_l2g=hard, seed=3
    )
    long_bp = torch.zeros(2, 30, dtype=torch.int32)
    long_bp[:, 25] = 1  # last real token
    global_bp = torch.zeros(2, 5, dtype=torch.int32)
    global_bp[:, 3] = 1
    owners = layout.long_owner.clamp(min=0).int()
    expected = side_inputs(long_bp, global_bp, owners, 4, 3, use_hard_g2l_mask=hard, use_hard_l2g_mask=hard)
    real = layout.long_owner >= 0  # padding tokens are owned by nobody here, by global 0 there
    for name, mine in side.as_dict().items():
        theirs = getattr(expected, name)
        if name.startswith("g2l"):
            mine, theirs = mine.transpose(1, 2), theirs.transpose(1, 2)
        if name.startswith(("l2g", "g2l")):
            mine, theirs = mine[real], theirs[real]
        assert torch.equal(mine, theirs), name


def test_mentions_and_empty_rows() -> None:
    side, layout = synthetic_side_inputs(
        1, 40, 6, 3, 2, mention_links=5, empty_long_rows=3, empty_global_rows=2, seed=1
    )
    mention = layout.vocab_size - 1
    assert (side.l2g_relative_att_ids == mention).any()
    assert torch.equal(side.l2g_relative_att_ids, side.g2l_relative_att_ids.transpose(1, 2))
    assert int(((side.l2l_att_mask.sum(-1) + side.l2g_att_mask.sum(-1)) == 0).sum()) == 3
    assert int(((side.g2g_att_mask.sum(-1) + side.g2l_att_mask.sum(-1)) == 0).sum()) == 2
