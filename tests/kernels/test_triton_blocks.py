"""Block tables for the Triton kernels: hand-written small cases plus a brute-force property test."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn.errors import BatchError
from graphattn.kernels.triton.blocks import (
    BlockSizes,
    check_key_blocks,
    g2l_key_blocks,
    masked_labels,
    nonempty_key_blocks,
)


def test_nonempty_key_blocks_by_hand():
    # One batch, 4 queries x 6 keys, tiles of 2 x 2: two query tiles, three key tiles.
    mask = torch.tensor(
        [
            [
                [0, 0, 0, 0, 1, 0],
                [0, 0, 0, 0, 0, 0],
                [1, 0, 0, 0, 0, 1],
                [0, 0, 0, 0, 0, 0],
            ]
        ],
        dtype=torch.int32,
    )
    blocks = nonempty_key_blocks(mask, 2, 2)
    assert blocks.counts.tolist() == [[1, 2]]
    assert blocks.indices[0, 0, :1].tolist() == [2]
    assert blocks.indices[0, 1, :2].tolist() == [0, 2]
    assert blocks.indices.dtype == torch.int32 and blocks.counts.dtype == torch.int32
    assert blocks.density == pytest.approx(3 / 6)


def test_ragged_edges_are_padded_not_dropped():
    # 3 queries x 5 keys with 2 x 4 tiles: the last query tile and key tile are partial.
    mask = torch.zeros(1, 3, 5, dtype=torch.int32)
    mask[0, 2, 4] = 1
    blocks = nonempty_key_blocks(mask, 2, 4)
    assert blocks.counts.tolist() == [[0, 1]]
    assert blocks.indices[0, 1, 0].item() == 1


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    n_q=st.integers(1, 40),
    n_k=st.integers(1, 40),
    block_q=st.sampled_from([1, 2, 4, 16]),
    block_k=st.sampled_from([1, 3, 8, 16]),
    density=st.floats(0.0, 0.3),
    seed=st.integers(0, 2**16),
)
def test_nonempty_key_blocks_matches_brute_force(batch, n_q, n_k, block_q, block_k, density, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, n_q, n_k, generator=gen) < density).int()
    blocks = nonempty_key_blocks(mask, block_q, block_k)
    for b in range(batch):
        for qb in range(-(-n_q // block_q)):
            rows = mask[b, qb * block_q : (qb + 1) * block_q]
            expected = [kb for kb in range(-(-n_k // block_k)) if rows[:, kb * block_k : (kb + 1) * block_k].any()]
            count = blocks.counts[b, qb].item()
            assert count == len(expected)
            assert blocks.indices[b, qb, :count].tolist() == expected
            assert sorted(blocks.indices[b, qb].tolist()) == list(range(-(-n_k // block_k)))


def test_g2l_key_blocks_uses_kernel_tile_sizes_and_is_checked():
    mask = torch.zeros(2, 5, 70, dtype=torch.int32)
    mask[1, 3, 65] = 1
    blocks = g2l_key_blocks(mask, 16, 32)
    assert blocks.counts.tolist() == [[0], [1]]
    assert blocks.indices[1, 0, 0].item() == 2
    check_key_blocks(blocks, 2, 5, 70, 16, 32, "g2l_key_blocks")
    with pytest.raises(BatchError, match="16x32 tiles but the kernels use 32x64"):
        check_key_blocks(blocks, 2, 5, 70, 32, 64, "g2l_key_blocks")
    with pytest.raises(BatchError, match="expected"):
        check_key_blocks(blocks, 3, 5, 70, 16, 32, "g2l_key_blocks")


def test_masked_labels_fold_mask_into_ids():
    mask = torch.tensor([[[1, 0, 1]]], dtype=torch.int32)
    ids = torch.tensor([[[4, 5, 0]]], dtype=torch.int32)
    small = masked_labels(mask, ids, n_labels=6)
    assert small.tolist() == [[[4, -1, 0]]] and small.dtype == torch.int16
    assert masked_labels(mask, ids, n_labels=40000).dtype == torch.int32


@pytest.mark.parametrize("size", [8, 24, 0])
def test_block_sizes_must_be_powers_of_two_from_16(size):
    with pytest.raises(BatchError, match="power of two"):
        BlockSizes(long=size, global_=16)
