"""The compact structure of a batch: CompactBatch stacking, the torch derivation of the dense
tensors, tile tables (sound: never miss an allowed pair, never call a tile full wrongly) and
the FlexAttention BlockMask built from them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import graph_batch

from graphattn.compact import CompactBatch, CompactSideInputs
from graphattn.compile.batching import collate
from graphattn.errors import BatchError
from graphattn.kernels import flex
from graphattn.kernels.structure import compact_to_side, dense_region_tiles, region_tiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compile"))
from compile_helpers import WordTokenizer  # noqa: E402
from test_compiler_properties import cases  # noqa: E402

from graphattn import compile_instance  # noqa: E402


def instance_a() -> CompactSideInputs:
    """L = 5, G = 2, r = 1, k = 1: one document, sentences 0-2 and 3-4 owned by globals 0 and 1,
    global 0 under hard g2l, token 4 linked to global 0 (label 5), a g2g edge 1 -> 0 (label 6)."""
    i32 = lambda *x: np.array(x, np.int32)  # noqa: E731
    return CompactSideInputs(
        local_radius=1,
        max_distance=1,
        levels=("sentence",),
        owners=i32([0, 0, 0, 1, 1]),
        long_doc=i32(0, 0, 0, 0, 0),
        long_segment=i32(0, 0, 0, 1, 1),
        global_doc=i32(0, 0),
        global_segment=i32(0, 1),
        global_blockable=np.zeros(2, bool),
        long_hard_l2g=np.zeros(5, bool),
        global_hard_g2l=np.array([True, False]),
        link_long=i32(4),
        link_global=i32(0),
        link_label=i32(5),
        g2g_src=i32(1),
        g2g_dst=i32(0),
        g2g_label=i32(6),
    )


def instance_b() -> CompactSideInputs:
    i32 = lambda *x: np.array(x, np.int32)  # noqa: E731
    return CompactSideInputs(
        local_radius=1,
        max_distance=1,
        levels=("sentence",),
        owners=i32([0, 0, 0]),
        long_doc=i32(0, 0, 0),
        long_segment=i32(0, 0, 0),
        global_doc=i32(0),
        global_segment=i32(0),
        global_blockable=np.zeros(1, bool),
        long_hard_l2g=np.zeros(3, bool),
        global_hard_g2l=np.zeros(1, bool),
    )


def test_compact_batch_by_hand() -> None:
    batch = CompactBatch.from_instances([instance_a(), instance_b()], 5, 2)
    assert batch.link_offsets.tolist() == [[0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 1]]
    assert (batch.link_batch.tolist(), batch.link_long.tolist(), batch.link_global.tolist()) == ([0], [4], [0])
    assert batch.edge_offsets.tolist() == [[0, 0, 1], [1, 1, 1]] and batch.edge_dst.tolist() == [0]
    assert batch.long_doc[1].tolist() == [0, 0, 0, 1, 1] and batch.global_doc[1].tolist() == [
        0,
        1,
    ]  # padding: one more document
    assert batch.owners[1].tolist() == [[0, 0, 0, -1, -1]]
    side = compact_to_side(batch.to_torch())
    # belongs = 2k+2 = 4, does_not_belong = 3, the link overrides belongs
    assert side.l2g_relative_att_ids[0].tolist() == [[4, 3], [4, 3], [4, 3], [3, 4], [5, 4]]
    assert side.g2l_att_mask[0].tolist() == [[1, 1, 1, 0, 1], [1, 1, 1, 1, 1]]  # global 0 is hard: owned + linked only
    assert side.g2g_relative_att_ids[0].tolist() == [[0, 1], [6, 0]]
    for name, value in side.as_dict().items():
        expected = np.stack([s.padded(5, 2).to_dense().as_dict()[name] for s in (instance_a(), instance_b())])
        np.testing.assert_array_equal(value.numpy(), expected, err_msg=name)


def test_compact_batch_refuses_instances_of_different_schemas() -> None:
    other = instance_b()
    other.max_distance = 2
    with pytest.raises(BatchError, match="compile them with one schema"):
        CompactBatch.from_instances([instance_a(), other], 5, 2)


def test_region_tiles_by_hand() -> None:
    c = CompactBatch.from_instances([instance_a()], 5, 2).to_torch()
    l2g = region_tiles(c, "l2g", 2, 1)  # long tiles [0, 1], [2, 3], [4]; one global per tile
    assert l2g.any[0].tolist() == [[True, True]] * 3
    assert l2g.full[0].tolist() == [[True, True], [True, True], [False, False]]  # the last tile runs past L
    g2l = region_tiles(c, "g2l", 1, 2)
    assert g2l.any[0].tolist() == [[True, True, True], [True, True, True]]  # global 0: owns 0-2, linked to 4
    assert g2l.full[0].tolist() == [[False, False, False], [True, True, False]]  # a hard row is never full
    l2l = region_tiles(c, "l2l", 2, 2)  # r = 1; segments [0, 0, 0, 1, 1]
    assert l2l.any[0].tolist() == [[True, True, False], [True, True, True], [False, True, True]]
    assert l2l.full[0].tolist() == [[True, False, False], [False, False, False], [False, False, False]]


def _dense_band(side) -> torch.Tensor:
    batch, length, width = side.l2l_att_mask.shape
    r = (width - 1) // 2
    query = torch.arange(length)[:, None]
    key = query + torch.arange(-r, r + 1)
    inside = (key >= 0) & (key < length)
    full = torch.zeros(batch, length, length, dtype=torch.int32)
    full[:, query.expand_as(key)[inside], key[inside]] = side.l2l_att_mask[:, inside]
    return full


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), cases(), st.integers(0, 3), st.integers(0, 2), st.sampled_from([2, 3, 16]), st.sampled_from([2, 5, 16]))
def test_derived_tensors_and_tile_tables_agree_with_collate(
    first, second, extra_long, extra_global, long_tile, global_tile
) -> None:
    """Random compiled layouts (the compiler's property-test strategy): the torch derivation
    equals collate's dense tensors, and every tile table is sound against them."""
    tok = WordTokenizer()
    (graphs_a, schema), (graphs_b, _) = first, second
    instances = [
        compile_instance(graphs_a, schema, tok, compact=True),
        compile_instance(graphs_b, schema, tok, compact=True),
    ]
    long_length = max(i.long_length for i in instances) + extra_long
    batch = collate(
        instances, pad_to_long=long_length, pad_to_global=max(i.global_length for i in instances) + extra_global
    )
    for name, value in compact_to_side(batch.compact).as_dict().items():
        assert torch.equal(value, getattr(batch.side, name)), name
    dense = {
        "l2g": batch.side.l2g_att_mask,
        "g2l": batch.side.g2l_att_mask,
        "g2g": batch.side.g2g_att_mask,
        "l2l": _dense_band(batch.side),
    }
    tiles = {
        "l2g": (long_tile, global_tile),
        "g2l": (global_tile, long_tile),
        "g2g": (global_tile, global_tile),
        "l2l": (long_tile, long_tile),
    }
    for region, mask in dense.items():
        ours, exact = region_tiles(batch.compact, region, *tiles[region]), dense_region_tiles(mask, *tiles[region])
        assert not (exact.any & ~ours.any).any(), f"{region}: a tile with allowed pairs is said to be empty"
        assert not (ours.full & ~exact.full).any(), f"{region}: a tile is said to be full but is not"


@pytest.mark.skipif(not flex.available(), reason="torch without FlexAttention")
def test_block_mask_from_structure_covers_the_pattern_exactly_where_it_is_simple() -> None:
    batch = graph_batch(compact=True)
    num_global, num_long = batch.side.global_length, batch.side.long_length
    from_structure = flex.block_mask_from_structure(batch.compact, num_global, num_global, num_long).to_dense()
    from_dense = flex.block_mask_from_structure(batch.side, num_global, num_global, num_long).to_dense()
    reference = flex.block_mask_from_mask_mod(batch.side, num_global, num_long, compiled=False).to_dense()
    assert torch.equal(from_dense, reference)  # the per-block reduction of the dense masks is exact
    assert not (reference.bool() & ~from_structure.bool()).any()  # the structure build misses no block
