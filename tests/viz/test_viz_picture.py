"""The matplotlib picture, checked on its pixels (the Agg canvas as an RGBA array)."""

import matplotlib.image
import numpy as np
import pytest
from viz_instances import big_instance, hand_instance

from graphattn.errors import GraphattnError
from graphattn.viz.blocks import block_summary
from graphattn.viz.palette import BACKGROUND, label_colors, shade, to_uint8
from graphattn.viz.pattern import AxisRange, Pattern, parse_range
from graphattn.viz.picture import render


def pixel(rendering, image, query, key):
    row, col = rendering.cell_pixel(query, key)
    return image[row, col, :3]


def color_of(instance, name):
    return to_uint8(label_colors(instance.label_vocab)[instance.label_vocab.id(name)])


def assert_color(actual, expected):
    assert np.abs(actual.astype(int) - np.asarray(expected, dtype=int)).max() <= 1, (actual, expected)


@pytest.fixture(scope="module")
def small():
    # G0 document, G1 = sentence s0 (L0-L2), G2 = sentence s1 (L3-L6); radius 2, max distance 2
    instance = hand_instance((3, 4), radius=2, max_distance=2)
    rendering = render(instance)
    return instance, rendering, rendering.rgba()


def test_small_instance_is_drawn_one_cell_per_pair(small):
    _, rendering, image = small
    assert rendering.level == "tokens"
    assert image.shape[2] == 4 and image.dtype == np.uint8


def test_masked_cells_are_background(small):
    instance, rendering, image = small
    G = instance.global_length
    background = to_uint8(BACKGROUND)
    assert_color(pixel(rendering, image, 1, G + 4), background)  # sentence s0 (hard) vs a token of s1
    assert_color(pixel(rendering, image, G + 0, G + 5), background)  # l2l beyond the radius


def test_hard_sentence_global_owns_its_tokens_in_the_belongs_color(small):
    instance, rendering, image = small
    G = instance.global_length
    for token in range(3):
        assert_color(pixel(rendering, image, 1, G + token), color_of(instance, "belongs"))
    assert_color(pixel(rendering, image, G + 4, 1), color_of(instance, "does_not_belong"))  # l2g is soft


def test_l2l_cells_carry_their_distance_color(small):
    instance, rendering, image = small
    G = instance.global_length
    assert_color(pixel(rendering, image, G + 2, G + 3), color_of(instance, "dist:+1"))
    assert_color(pixel(rendering, image, G + 4, G + 2), color_of(instance, "dist:-2"))
    assert_color(pixel(rendering, image, G + 5, G + 5), color_of(instance, "dist:0"))
    assert_color(pixel(rendering, image, 0, 2), color_of(instance, "dist:+2"))  # g2g distances too


def test_legend_lists_exactly_the_labels_present_in_reading_order_then_masked():
    # radius 1 with max distance 3: dist:+-2 and +-3 never occur (g2g spans only 2 globals)
    instance = hand_instance((2, 2), radius=1, max_distance=3, document_global=False)
    rendering = render(instance)
    expected = ["belongs", "does_not_belong", "dist:-1", "dist:0", "dist:+1"]
    assert rendering.legend_labels == expected
    legend = rendering.axes.get_legend()
    assert [text.get_text() for text in legend.get_texts()] == [*expected, "masked: may not attend"]
    swatches = [to_uint8(np.array(patch.get_facecolor()[:3])) for patch in legend.get_patches()]
    for name, swatch in zip(expected, swatches):
        assert_color(swatch, color_of(instance, name))
    assert_color(swatches[-1], to_uint8(BACKGROUND))


def test_schema_label_gets_its_own_color_and_legend_entry():
    instance = hand_instance((2, 2), radius=1, max_distance=1, extra_labels=("mention_of",))
    mention = instance.label_vocab.id("mention_of")
    instance.side.g2g_relative_att_ids[1, 2] = mention
    rendering = render(instance)
    assert "mention_of" in rendering.legend_labels
    assert_color(pixel(rendering, rendering.rgba(), 1, 2), color_of(instance, "mention_of"))


def test_pieces_are_framed_and_named_from_the_margins(small):
    _, rendering, _ = small
    # above each column part its pieces top to bottom; right of each row part, left to right
    assert [text.get_text() for text in rendering.axes.texts] == ["g2g\nl2g", "g2l\nl2l", "g2g  g2l", "l2g  l2l"]
    frames = [p for p in rendering.axes.patches if not p.get_fill()]
    assert len(frames) == 4


def test_a_zoom_inside_one_piece_frames_and_names_only_it():
    instance = hand_instance((3, 4), radius=2, max_distance=2)
    G = instance.global_length
    rendering = render(instance, AxisRange(G, G + 5), AxisRange(G + 1, G + 6))
    assert [text.get_text() for text in rendering.axes.texts] == ["l2l", "l2l"]
    assert len([p for p in rendering.axes.patches if not p.get_fill()]) == 1


def test_ticks_name_globals_by_type_and_id_and_tokens_by_text(small):
    _, rendering, _ = small
    labels = [t.get_text() for t in rendering.axes.get_yticklabels()]
    assert labels[:4] == ["G0 document:doc", "G1 sentence:s0", "G2 sentence:s1", "L0 the"]


def test_long_input_is_a_block_summary_of_drawn_labels_shaded_by_their_share():
    instance = big_instance(long_length=600, globals_count=24, radius=16, max_distance=4)
    pattern = Pattern(instance)
    rendering = render(pattern, block_size=32)
    assert rendering.level == "blocks"
    image = rendering.rgba()
    summary = block_summary(pattern, block_size=32)
    colors = np.vstack([label_colors(instance.label_vocab), BACKGROUND])
    expected = to_uint8(shade(colors[summary.drawn], summary.drawn_share))
    for bq, bk in [(0, 0), (0, 3), (1, 2), (5, 5), (5, 6), (5, 12), (10, 0)]:
        q = (summary.queries.starts[bq] + summary.queries.stops[bq]) / 2
        k = (summary.keys.starts[bk] + summary.keys.stops[bk]) / 2
        row, col = rendering.point_pixel(q, k)
        assert_color(image[row, col, :3], expected[bq, bk])
    assert set(rendering.legend_labels) == {instance.label_vocab.name(int(x)) for x in summary.labels_present()}


def test_zoom_draws_a_range_at_token_level():
    instance = big_instance(long_length=600, globals_count=24, radius=16, max_distance=4)
    G = instance.global_length
    queries = parse_range("l100:l140", G, 600)
    keys = parse_range("l90:l150", G, 600)
    rendering = render(instance, queries, keys)
    assert rendering.level == "tokens" and rendering.queries == AxisRange(G + 100, G + 140)
    image = rendering.rgba()
    assert_color(pixel(rendering, image, G + 120, G + 121), color_of(instance, "dist:+1"))
    assert_color(pixel(rendering, image, G + 120, G + 110), color_of(instance, "dist:-4"))
    assert_color(pixel(rendering, image, G + 100, G + 149), to_uint8(BACKGROUND))  # 49 apart > radius 16


def test_png_file_holds_the_drawn_pixels_and_svg_names_the_labels(tmp_path, small):
    instance, rendering, image = small
    png = rendering.save(tmp_path / "pattern.png")
    stored = (matplotlib.image.imread(png) * 255).round().astype(np.uint8)
    assert stored.shape == image.shape
    row, col = rendering.cell_pixel(1, instance.global_length)
    assert_color(stored[row, col, :3], color_of(instance, "belongs"))
    svg = rendering.save(tmp_path / "pattern.svg").read_text()
    assert "does_not_belong" in svg and "<svg" in svg
    with pytest.raises(GraphattnError, match="use .png or .svg"):
        rendering.save(tmp_path / "pattern.jpg")


def test_4096_plus_256_renders_as_blocks(tmp_path):
    rendering = render(big_instance())
    assert rendering.level == "blocks"
    assert len(rendering.summary.queries) == 16 + 256  # blocks of 16 in each part
    rendering.save(tmp_path / "big.png")


STORY = "The quick brown fox jumps. It was lazy.\n\nA dog barked at night. The end."


def compiled(compact: bool = False):
    from graphattn.compile import compile_instance
    from graphattn.ingest.text import text_to_graph

    return compile_instance(text_to_graph(STORY, doc_id="story"), "etc-sentences", "spacy:en", compact=compact)


def test_compiled_sentence_globals_are_hard_masked_to_their_own_tokens():
    instance = compiled()
    G = instance.global_length
    owner = instance.long_owners["sentence"]
    rendering = render(instance)
    image = rendering.rgba()
    assert G == 4 and rendering.level == "tokens"
    for g in range(G):
        own = np.flatnonzero(owner == g)
        other = np.flatnonzero((owner != g) & (owner >= 0))
        assert_color(pixel(rendering, image, g, G + own[0]), color_of(instance, "belongs"))
        assert_color(pixel(rendering, image, g, G + own[-1]), color_of(instance, "belongs"))
        assert_color(pixel(rendering, image, g, G + other[0]), to_uint8(BACKGROUND))
        assert_color(pixel(rendering, image, G + other[0], g), color_of(instance, "does_not_belong"))


def test_compact_instance_draws_the_same_picture_as_dense():
    dense, compact = render(compiled()), render(compiled(compact=True))
    assert dense.legend_labels == compact.legend_labels
    np.testing.assert_array_equal(dense.rgba(), compact.rgba())
