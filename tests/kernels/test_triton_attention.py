"""Triton global-local attention against the dense oracle, under TRITON_INTERPRET=1 on CPU.

Shapes stay small (the interpreter runs every tile op in NumPy) but are chosen to cross tile
edges: 16-token tiles, L not a multiple of 16, G above one global tile, vocabularies that are
not powers of two. fp32 outputs and every gradient must match dense to 1e-5 relative.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn.contract import SideInputs
from graphattn.errors import BatchError
from graphattn.kernels import dense, prepare_attention
from graphattn.kernels.synthetic import synthetic_side_inputs
from graphattn.kernels.triton.attention import attention, g2l_key_blocks
from graphattn.kernels.triton.blocks import BlockSizes, make_plan

SMALL_TILES = BlockSizes(long=16, global_=16)


def make_inputs(batch, heads, n_global, n_long, head_dim, n_labels, *, bias=True, dtype=torch.float32, seed=0):
    """Six states [B, H, n, d], a^K [V, H, d] and b [V, H] (or None), all requiring grad."""
    gen = torch.Generator().manual_seed(seed)

    def leaf(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).requires_grad_()

    states = [leaf(batch, heads, n, head_dim) for n in (n_global,) * 3 + (n_long,) * 3]
    return states, leaf(n_labels, heads, head_dim), (leaf(n_labels, heads) if bias else None)


def leaves(states, key_table, bias_table):
    return [*states, key_table] + ([bias_table] if bias_table is not None else [])


def assert_rel_close(actual, expected, rel=1e-5, name=""):
    """Elementwise |a - e| <= rel * (|e| + max|e|): relative, without blowing up near zero.

    max|e| is floored at 0.1: a gradient that is zero in exact arithmetic (a row with a single
    key, where ds = dp - delta cancels) comes out of both sides as rounding noise of O(1) terms.
    """
    assert actual.shape == expected.shape, name
    if expected.numel() == 0:
        return
    scale = expected.abs().max().clamp(min=0.1)
    torch.testing.assert_close(
        actual.float(), expected.float(), rtol=rel, atol=rel * scale.item(), msg=lambda m: f"{name}: {m}"
    )


def check_against_dense(side, states, key_table, bias_table, *, block_sizes=SMALL_TILES, **kwargs):
    scale = 1.0 / math.sqrt(states[0].shape[-1])
    ours = attention(*states, side, key_table, bias_table, scale, block_sizes=block_sizes, **kwargs)
    oracle = dense.attention(*states, side, key_table, bias_table, scale)
    for name, a, e in zip(("global_out", "long_out"), ours, oracle):
        assert_rel_close(a, e, name=name)
    gen = torch.Generator().manual_seed(1)
    upstream = [torch.randn(o.shape, generator=gen) for o in oracle]
    inputs = leaves(states, key_table, bias_table)
    grads = torch.autograd.grad(ours, inputs, upstream)
    expected = torch.autograd.grad(oracle, inputs, upstream)
    names = ["global_q", "global_k", "global_v", "long_q", "long_k", "long_v", "rel_key_table", "rel_bias_table"]
    for name, g, e in zip(names, grads, expected):
        assert_rel_close(g, e, name=f"d {name}")
    return ours


STRUCTURES = {
    # hierarchy, soft masks, label bias, L = 37 (not a multiple of the 16-token tile)
    "soft_hierarchy": dict(batch=2, long_length=37, global_length=6, radius=3, max_distance=3, bias=True),
    # hard g2l and l2g, two packed documents, padding on both sides, G = 20 spans two global tiles
    "hard_packed_padded": dict(
        batch=2,
        long_length=40,
        global_length=20,
        radius=5,
        max_distance=2,
        num_docs=2,
        long_padding=5,
        global_padding=2,
        hard_g2l=True,
        hard_l2g=True,
        bias=False,
    ),
    # mention links with their own label, rows with nothing to attend to, hard g2l only
    "mentions_empty_rows": dict(
        batch=2,
        long_length=29,
        global_length=7,
        radius=4,
        max_distance=3,
        mention_links=6,
        empty_long_rows=3,
        empty_global_rows=2,
        hard_g2l=True,
        bias=True,
    ),
}


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
def test_matches_dense_on_compiled_structures(structure):
    spec = dict(STRUCTURES[structure])
    bias = spec.pop("bias")
    side, layout = synthetic_side_inputs(**spec, seed=3)
    n_labels = layout.vocab_size + 1  # 9 or 11: not a power of two, and one label never used
    states, key_table, bias_table = make_inputs(
        spec["batch"], 2, spec["global_length"], spec["long_length"], 16, n_labels, bias=bias
    )
    global_out, long_out = check_against_dense(side, states, key_table, bias_table)
    if spec.get("empty_long_rows"):  # rows with nothing to attend to are exact zeros, not NaN
        dead_long = ~((side.l2l_att_mask != 0).any(-1) | (side.l2g_att_mask != 0).any(-1))  # [B, L]
        dead_global = ~((side.g2g_att_mask != 0).any(-1) | (side.g2l_att_mask != 0).any(-1))  # [B, G]
        assert dead_long.any() and dead_global.any()
        assert long_out.detach().permute(0, 2, 1, 3)[dead_long].eq(0).all()
        assert global_out.detach().permute(0, 2, 1, 3)[dead_global].eq(0).all()


def test_hard_g2l_skips_key_tiles():
    """Under hard g2l a global tile visits exactly the long tiles holding tokens its globals own."""
    side, layout = synthetic_side_inputs(1, 64, 32, radius=3, hard_g2l=True, hard_l2g=True, seed=0)
    plan = make_plan(side, n_labels=30, sizes=SMALL_TILES)
    owner = layout.long_owner[0]  # [L] owning global position
    for global_tile in range(2):
        owned = (owner // 16 == global_tile).nonzero().flatten()
        expected = sorted(set((owned // 16).tolist()))
        count = plan.g2l_blocks.counts[0, global_tile].item()
        assert plan.g2l_blocks.indices[0, global_tile, :count].tolist() == expected
    assert plan.g2l_blocks.density < 1.0 and plan.l2g_blocks.density < 1.0


def test_random_masks_and_labels():
    """No structure at all: independent random masks and ids, several fully masked rows."""
    gen = torch.Generator().manual_seed(7)
    batch, n_global, n_long, radius, n_labels = 2, 18, 34, 4, 7

    def rand_mask(*shape, p):
        return (torch.rand(*shape, generator=gen) < p).int()

    def rand_ids(*shape):
        return torch.randint(0, n_labels, shape, generator=gen, dtype=torch.int32)

    side = SideInputs(
        l2l_att_mask=rand_mask(batch, n_long, 2 * radius + 1, p=0.7),
        g2g_att_mask=rand_mask(batch, n_global, n_global, p=0.5),
        l2g_att_mask=rand_mask(batch, n_long, n_global, p=0.2),
        g2l_att_mask=rand_mask(batch, n_global, n_long, p=0.1),
        l2l_relative_att_ids=rand_ids(batch, n_long, 2 * radius + 1),
        g2g_relative_att_ids=rand_ids(batch, n_global, n_global),
        l2g_relative_att_ids=rand_ids(batch, n_long, n_global),
        g2l_relative_att_ids=rand_ids(batch, n_global, n_long),
    )
    for name, row in (("l2l", 3), ("l2g", 3), ("g2g", 17), ("g2l", 17)):
        getattr(side, f"{name}_att_mask")[1, row] = 0
    states, key_table, bias_table = make_inputs(batch, 2, n_global, n_long, 16, n_labels, seed=2)
    global_out, long_out = check_against_dense(side, states, key_table, bias_table)
    assert torch.equal(long_out[1, :, 3].detach(), torch.zeros(2, 16))
    assert torch.equal(global_out[1, :, 17].detach(), torch.zeros(2, 16))


def test_by_hand_two_long_tokens_one_global():
    """q = 0, so weights come from the label bias alone: exp(b) / sum exp(b) over allowed keys.

    Long token 0 sees global 0 (label 1, b = log 3) and itself (label 0, b = 0): 3/4 and 1/4.
    Long token 1 sees nothing (fully masked row): zeros. Global 0 sees itself (label 0) and
    long token 1 (label 2, b = log 3): 1/4 and 3/4.
    """
    d = 16
    zeros = torch.zeros(1, 1, 1, d)
    v_global = torch.full((1, 1, 1, d), 4.0)
    v_long = torch.tensor([8.0, 100.0]).view(1, 1, 2, 1).expand(1, 1, 2, d).contiguous()
    side = SideInputs(
        l2l_att_mask=torch.tensor([[[0, 1, 0], [0, 0, 0]]], dtype=torch.int32),
        g2g_att_mask=torch.tensor([[[1]]], dtype=torch.int32),
        l2g_att_mask=torch.tensor([[[1], [0]]], dtype=torch.int32),
        g2l_att_mask=torch.tensor([[[0, 1]]], dtype=torch.int32),
        l2l_relative_att_ids=torch.zeros(1, 2, 3, dtype=torch.int32),
        g2g_relative_att_ids=torch.zeros(1, 1, 1, dtype=torch.int32),
        l2g_relative_att_ids=torch.ones(1, 2, 1, dtype=torch.int32),
        g2l_relative_att_ids=torch.full((1, 1, 2), 2, dtype=torch.int32),
    )
    key_table = torch.randn(3, 1, d)
    bias_table = torch.tensor([[0.0], [math.log(3.0)], [math.log(3.0)]])
    global_out, long_out = attention(
        zeros,
        zeros,
        v_global,
        torch.zeros(1, 1, 2, d),
        torch.zeros(1, 1, 2, d),
        v_long,
        side,
        key_table,
        bias_table,
        0.25,
        block_sizes=SMALL_TILES,
    )
    torch.testing.assert_close(long_out[0, 0, :, 0], torch.tensor([0.75 * 4 + 0.25 * 8, 0.0]))
    torch.testing.assert_close(global_out[0, 0, :, 0], torch.tensor([0.25 * 4 + 0.75 * 100]))


def test_plain_self_attention_without_globals():
    """G = 0, r >= L, no label terms: scaled_dot_product_attention over the long sequence."""
    n_long, radius = 21, 24
    side, _ = synthetic_side_inputs(2, n_long, 0, radius, max_distance=2)
    states, _, _ = make_inputs(2, 2, 0, n_long, 32, 6, bias=False)
    key_table = torch.zeros(6, 2, 32)
    _, long_out = attention(*states, side, key_table, None, 32**-0.5, block_sizes=SMALL_TILES)
    expected = torch.nn.functional.scaled_dot_product_attention(*states[3:])
    assert_rel_close(long_out, expected)
    (long_out * expected.detach()).sum().backward()  # the G = 0 backward path runs too
    assert states[3].grad is not None and torch.isfinite(states[3].grad).all()


@pytest.mark.parametrize("dtype, rel", [(torch.float16, 4e-3), (torch.bfloat16, 3e-2)])
def test_half_precision(dtype, rel):
    """fp16 / bf16 states, fp32 statistics: outputs and gradients within the format's rounding
    of the fp32 oracle run on the same (rounded) inputs."""
    side, layout = synthetic_side_inputs(2, 37, 6, radius=3, max_distance=3, hard_g2l=True, seed=1)
    states, key_table, bias_table = make_inputs(2, 2, 6, 37, 16, layout.vocab_size, dtype=dtype)
    inputs = leaves(states, key_table, bias_table)
    ours = attention(*states, side, key_table, bias_table, 0.25, block_sizes=SMALL_TILES)
    wide = [t.detach().float().requires_grad_() for t in inputs]
    oracle = dense.attention(*wide[:6], side, wide[6], wide[7], 0.25)
    for a, e in zip(ours, oracle):
        assert a.dtype == dtype
        assert_rel_close(a, e, rel=rel)
    upstream = [torch.randn(o.shape, generator=torch.Generator().manual_seed(5)) for o in oracle]
    grads = torch.autograd.grad(ours, inputs, [u.to(dtype) for u in upstream])
    expected = torch.autograd.grad(oracle, wide, upstream)
    for g, e in zip(grads, expected):
        assert g.dtype == dtype
        assert_rel_close(g, e, rel=rel)


def test_precomputed_g2l_blocks_and_default_tiles():
    side, layout = synthetic_side_inputs(1, 40, 5, radius=3, hard_g2l=True, seed=2)
    states, key_table, bias_table = make_inputs(1, 2, 5, 40, 16, layout.vocab_size)
    blocks = g2l_key_blocks(side.g2l_att_mask, 16, 16)
    check_against_dense(side, states, key_table, bias_table, g2l_key_blocks=blocks)
    check_against_dense(side, states, key_table, bias_table, block_sizes=None)  # the default tiles
    with pytest.raises(BatchError, match="g2l_key_blocks"):
        attention(
            *states,
            side,
            key_table,
            bias_table,
            0.25,
            g2l_key_blocks=g2l_key_blocks(side.g2l_att_mask, 32, 32),
            block_sizes=SMALL_TILES,
        )


def test_one_plan_per_prepared_batch_and_edits_take_effect_in_the_next():
    """Every layer of a prepared batch runs on the plan built by `prepare_attention` (nothing is
    cached across calls behind the caller's back); an edited mask is seen by the next prepare or
    direct call. Inference-mode tensors work too."""
    side, layout = synthetic_side_inputs(1, 20, 3, radius=2, max_distance=2, seed=4)
    states, key_table, bias_table = make_inputs(1, 2, 3, 20, 16, layout.vocab_size)
    prepared = prepare_attention(
        side, num_heads=2, head_dim=16, vocab_size=layout.vocab_size, backend="triton", block_sizes=SMALL_TILES
    )
    plan = prepared.plan
    with torch.no_grad():
        first = prepared.attend(*states, key_table, bias_table, 0.25)
        second = prepared.attend(*states, key_table, bias_table, 0.25)
    assert prepared.plan is plan and all(torch.equal(a, b) for a, b in zip(first, second))
    side.l2l_att_mask[0, :10] = 0  # in place
    check_against_dense(side, states, key_table, bias_table)
    with torch.inference_mode():
        frozen = side.map(lambda t: t.clone())
        frozen.g2l_att_mask.zero_()
        ours = attention(*states, frozen, key_table, bias_table, 0.25, block_sizes=SMALL_TILES)
        oracle = dense.attention(*states, frozen, key_table, bias_table, 0.25)
    for a, e in zip(ours, oracle):
        assert_rel_close(a, e)


@settings(max_examples=5, deadline=None)
@given(
    n_long=st.integers(1, 40),
    n_global=st.integers(1, 20),
    radius=st.integers(0, 6),
    n_labels=st.integers(1, 12),
    num_docs=st.integers(1, 3),
    hard=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_property_matches_dense(n_long, n_global, radius, n_labels, num_docs, hard, seed):
    side, layout = synthetic_side_inputs(
        1, n_long, n_global, radius, max_distance=2, num_docs=num_docs, hard_g2l=hard, hard_l2g=hard, seed=seed
    )
    states, key_table, bias_table = make_inputs(1, 1, n_global, n_long, 16, layout.vocab_size + n_labels, seed=seed)
    check_against_dense(side, states, key_table, bias_table)


class TestBadInputs:
    def setup_method(self):
        self.side, layout = synthetic_side_inputs(1, 20, 3, radius=2, max_distance=2)
        self.states, self.key_table, self.bias_table = make_inputs(1, 2, 3, 20, 16, layout.vocab_size)

    def call(self, states=None, side=None, key_table=None, bias_table="same"):
        return attention(
            *(states or self.states),
            side or self.side,
            self.key_table if key_table is None else key_table,
            self.bias_table if bias_table == "same" else bias_table,
            0.25,
        )

    def test_unsupported_head_dim(self):
        states, key_table, _ = make_inputs(1, 2, 3, 20, 24, 10)
        with pytest.raises(BatchError, match="head dim 24 is not supported"):
            self.call(states=states, key_table=key_table, bias_table=None)

    def test_label_past_the_table(self):
        with pytest.raises(BatchError, match="outside the relative key table of 3 labels"):
            self.call(key_table=torch.randn(3, 2, 16), bias_table=None)

    def test_side_input_shape(self):
        side = SideInputs(**{**self.side.as_dict(), "l2g_att_mask": self.side.l2g_att_mask[:, :5]})
        with pytest.raises(BatchError, match=r"side\.l2g_att_mask"):
            self.call(side=side)

    def test_dtype_mismatch(self):
        states = list(self.states)
        states[4] = states[4].double()
        with pytest.raises(BatchError, match=r"long_k: dtype"):
            self.call(states=states)

    def test_bias_shape(self):
        with pytest.raises(BatchError, match="rel_bias_table"):
            self.call(bias_table=torch.zeros(4, 2))

    @pytest.mark.skipif(
        torch.cuda.is_available(), reason="on a GPU the tests run the kernels on CUDA (kernels/conftest.py)"
    )
    def test_cpu_without_interpreter(self, monkeypatch):
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(BatchError, match="CUDA tensors"):
            self.call()
