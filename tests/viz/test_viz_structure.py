"""Long inputs from the compact form, and pictures that show the structure (issue: viz on long inputs)."""

import dataclasses
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from viz_instances import random_compact_instance, sentence_instance

from graphattn.compact import CompactSideInputs
from graphattn.viz.blocks import block_summary
from graphattn.viz.palette import BACKGROUND, MASKED_NAME, label_colors, to_uint8
from graphattn.viz.pattern import AxisRange, Pattern
from graphattn.viz.picture import render


@settings(max_examples=60, deadline=None)
@given(
    G=st.integers(0, 12),
    L=st.integers(1, 30),
    radius=st.integers(0, 5),
    k=st.integers(1, 4),
    size=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    lo=st.integers(0, 40),
    hi=st.integers(0, 40),
)
def test_compact_counts_equal_counting_every_dense_pair(G, L, radius, k, size, seed, lo, hi):
    # documents, segments, blocked and cross-labelled g2g, hard rows, owners, links and g2g edges
    instance = random_compact_instance(np.random.default_rng(seed), G, L, radius, max_distance=k)
    dense = dataclasses.replace(instance, side=instance.side.to_dense())
    N = G + L
    start = min(lo, N - 1)
    span = AxisRange(start, max(start + 1, N - min(hi, N - start - 1)))
    for queries, keys in ((None, None), (span, None), (None, span)):
        got = block_summary(Pattern(instance), queries, keys, block_size=size)
        want = block_summary(Pattern(dense), queries, keys, block_size=size)
        np.testing.assert_array_equal(got.counts, want.counts)
        np.testing.assert_array_equal(got.drawn, want.drawn)


def test_l2g_blocks_show_belongs_like_the_g2l_of_the_same_ownership():
    instance = sentence_instance(L=960, G=64)
    belongs = to_uint8(label_colors(instance.label_vocab)[instance.label_vocab.belongs])
    rendering = render(instance, block_size=32)
    image = rendering.rgba()[..., :3].astype(int)
    summary = rendering.summary
    G = instance.global_length
    centers = lambda axis: (axis.starts + axis.stops) / 2  # noqa: E731
    q_mid, k_mid = centers(summary.queries), centers(summary.keys)
    global_blocks = np.flatnonzero(summary.queries.starts < G)
    long_blocks = np.flatnonzero(summary.queries.starts >= G)
    checked = 0
    for bl in long_blocks:
        for bg in global_blocks:
            l2g = image[rendering.point_pixel(q_mid[bl], k_mid[bg])]
            g2l = image[rendering.point_pixel(q_mid[bg], k_mid[bl])]
            if summary.drawn[bl, bg] == instance.label_vocab.belongs:
                checked += 1
                assert np.abs(l2g - g2l).max() <= 1, (bl, bg, l2g, g2l)  # mirror images: one ownership
                # the belongs hue, blended toward white: green stays the strongest channel
                assert l2g[1] > l2g[0] + 20 and l2g[1] > l2g[2] + 20, l2g
            else:  # no ownership: soft l2g is allowed (does_not_belong grey), hard g2l is masked (white)
                assert summary.drawn[bl, bg] == instance.label_vocab.does_not_belong
                assert (g2l == 255).all()
    assert checked >= len(long_blocks)  # every long block belongs to some global block
    # and what the old rule (most common label) drew there: does_not_belong, a grey reading "no owner"
    assert summary.dominant[long_blocks[0], global_blocks[0]] == instance.label_vocab.does_not_belong
    assert tuple(belongs) != tuple(to_uint8(BACKGROUND))


def test_legend_pixels_name_each_color_and_white_means_masked():
    instance = sentence_instance(L=960, G=64)
    rendering = render(instance, block_size=32)
    image = rendering.rgba()[..., :3].astype(int)
    legend = rendering.axes.get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts[-1] == MASKED_NAME and texts[0] == "belongs" and "does_not_belong" in texts
    renderer = rendering.figure.canvas.get_renderer()
    height = image.shape[0]
    colors = label_colors(instance.label_vocab)
    for patch, name in zip(legend.get_patches(), texts):
        box = patch.get_window_extent(renderer)
        row, col = int(height - (box.y0 + box.y1) / 2), int((box.x0 + box.x1) / 2)
        want = to_uint8(BACKGROUND if name == MASKED_NAME else colors[instance.label_vocab.id(name)])
        assert np.abs(image[row, col] - want).max() <= 1, (name, image[row, col], want)


def _boxes(rendering, labels):
    renderer = rendering.figure.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in labels if t.get_text()]


def test_title_is_never_clipped_and_ticks_never_overlap_at_the_boundary():
    instance = sentence_instance(L=2000, G=12)  # a global part far narrower than one tick step
    rendering = render(instance, title="a very long title " * 12)
    rendering.rgba()
    figure_box = rendering.figure.bbox
    title = rendering.axes.title.get_window_extent(rendering.figure.canvas.get_renderer())
    assert figure_box.x0 <= title.x0 and title.x1 <= figure_box.x1 + 1 and title.y1 <= figure_box.y1 + 1
    for labels, name in ((rendering.axes.get_xticklabels(), "x"), (rendering.axes.get_yticklabels(), "y")):
        boxes = _boxes(rendering, labels)
        assert "L0" in {t.get_text() for t in labels}, name  # the boundary keeps its name
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                assert not a.overlaps(b), (name, a, b)


def test_long_compact_instance_is_summarized_without_any_dense_piece(monkeypatch):
    # L x G = 65,536 x 4,096: the dense l2g alone would be 1 GiB of int32
    instance = sentence_instance(L=65_536, G=4_096, radius=84, max_distance=12)
    monkeypatch.setattr(CompactSideInputs, "to_dense", lambda self: pytest.fail("expanded to dense"))
    tracemalloc.start()
    summary = block_summary(Pattern(instance))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 200 * 2**20, f"{peak / 2**20:.0f} MiB traced"
    assert summary.counts[..., instance.label_vocab.belongs].sum() == 2 * 65_536  # l2g and g2l, each owned pair once
    assert summary.allowed.sum() == 65_536 * 4_096 + 65_536 + 4_096**2 + _band_pairs(65_536, 84)


def _band_pairs(L: int, r: int) -> int:
    """l2l pairs |i - j| <= r inside one segment of L tokens."""
    return L * (2 * r + 1) - r * (r + 1)
