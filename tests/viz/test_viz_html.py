"""The HTML viewer: its embedded data, and the page itself in headless Chromium."""

import base64
import json
import re
import zlib

import matplotlib.image
import numpy as np
import pytest
from chromium_pipe import Chromium, ChromiumUnavailable
from viz_instances import big_instance, hand_instance, random_compact_instance, sentence_instance

from graphattn.viz.html import viewer_data, viewer_html, write_viewer
from graphattn.viz.palette import label_colors, to_uint8
from graphattn.viz.pattern import AxisRange, Pattern

READY = "window.graphattnViewer && (graphattnViewer.ready || graphattnViewer.error !== null)"
TOOLTIP = "document.getElementById('tooltip').textContent"


def decode(meta, payload):
    raw = zlib.decompress(base64.b64decode(payload))
    return {
        name: np.frombuffer(raw, dtype=spec["dtype"], count=spec["length"], offset=spec["offset"]).reshape(
            spec["shape"]
        )
        for name, spec in meta["arrays"].items()
    }


def test_embedded_arrays_are_the_pieces_label_plus_one():
    instance = hand_instance((3, 4), radius=2, max_distance=2)
    pattern = Pattern(instance)
    meta, payload = viewer_data(pattern)
    arrays = decode(meta, payload)
    everything = slice(None)
    np.testing.assert_array_equal(arrays["g2l"].astype(int) - 1, pattern.piece("g2l", everything, everything))
    np.testing.assert_array_equal(arrays["band"].astype(int) - 1, pattern.band(everything))
    np.testing.assert_array_equal(arrays["owners"], np.stack(list(instance.long_owners.values())))
    assert meta["present"] == [6, 5, 4, 3, 0, 1, 2]  # legend order: belongs, does_not_belong, dist:-2 .. dist:+2
    assert meta["tokens"][:3] == ["the", "quick", "brown"]
    assert meta["globals"][1] == {"type": "sentence", "id": "s0"}


def test_page_is_self_contained_and_token_text_cannot_end_a_script():
    instance = hand_instance((2, 2), words=["a", "</script><script>alert(1)</script>", "{{DATA}}", "d"])
    page = viewer_html(instance)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page
    assert page.count("</script>") == 3  # meta, data, viewer: nothing from the token text
    meta = json.loads(re.search(r'id="graphattn-meta">(.*?)</script>', page, re.S).group(1))
    assert meta["tokens"][1] == "</script><script>alert(1)</script>" and meta["tokens"][2] == "{{DATA}}"


@pytest.fixture(scope="module")
def browser():
    try:
        chromium = Chromium(width=1200, height=900)
    except ChromiumUnavailable as err:
        pytest.skip(f"headless Chromium cannot start here: {err}")
    yield chromium
    chromium.close()


def open_page(browser, path):
    browser.open(path)
    browser.wait_for(READY)
    assert browser.evaluate("graphattnViewer.error") is None


def hover_cell(browser, query, key):
    point = browser.evaluate(f"graphattnViewer.cellCenter({query}, {key})")
    browser.hover(point["x"], point["y"])
    return point


def screenshot_rgb(browser, path):
    image = matplotlib.image.imread(browser.screenshot(path))
    return (image[..., :3] * 255).round().astype(int)


def color(instance, name):
    return to_uint8(label_colors(instance.label_vocab)[instance.label_vocab.id(name)]).astype(int)


def test_small_page_draws_cells_and_tooltips(browser, tmp_path):
    instance = hand_instance((3, 4), radius=2, max_distance=2)
    G = instance.global_length
    open_page(browser, write_viewer(instance, tmp_path / "small.html"))
    assert browser.evaluate("graphattnViewer.mode()") == "tokens"
    legend = browser.evaluate("[...document.querySelectorAll('#legend div')].map(d => d.dataset.label)")
    distances = ["dist:-2", "dist:-1", "dist:0", "dist:+1", "dist:+2"]
    assert legend == ["belongs", "does_not_belong", *distances, "masked: may not attend"]

    owned = browser.evaluate(f"graphattnViewer.cellCenter(1, {G})")
    masked = browser.evaluate(f"graphattnViewer.cellCenter(1, {G + 4})")
    pixels = screenshot_rgb(browser, tmp_path / "small.png")
    assert np.abs(pixels[int(owned["y"]), int(owned["x"])] - color(instance, "belongs")).max() <= 1
    assert (pixels[int(masked["y"]), int(masked["x"])] == 255).all()

    hover_cell(browser, 1, G + 1)
    assert browser.evaluate(TOOLTIP) == (
        "query  G1 sentence:s0\n"
        'key    L1 "quick"\n'
        "piece  g2l\n"
        "label  belongs\n"
        "query nodes  sentence:s0 (itself)\n"
        "key nodes    document:doc (G0), sentence:s0 (G1); document doc"
    )
    hover_cell(browser, G + 0, G + 3)
    assert browser.evaluate(TOOLTIP).splitlines()[2:4] == ["piece  l2l", "label  (masked: may not attend)"]


def test_4096_plus_256_opens_as_blocks_and_zooms_to_tokens(browser, tmp_path):
    instance = big_instance()
    G = instance.global_length
    open_page(browser, write_viewer(instance, tmp_path / "big.html"))
    assert browser.evaluate("graphattnViewer.mode()") == "blocks"
    # zoomed out a pixel spans several tokens: read back which pair is under the mouse, then
    # check the page's label and block for that pair against Python's
    hover_cell(browser, G + 1000, G + 1001)
    lines = browser.evaluate(TOOLTIP).splitlines()
    q, k = (G + int(re.match(r"(?:query|key) +L(\d+) ", line).group(1)) for line in lines[:2])
    assert abs(q - (G + 1000)) <= 8 and abs(k - (G + 1001)) <= 8
    label = Pattern(instance).labels(AxisRange(q, q + 1), AxisRange(k, k + 1))[0, 0]
    assert lines[3] == f"label  {instance.label_vocab.name(int(label))}"
    first_q, first_k = (p - G - (p - G) % 16 for p in (q, k))
    assert lines[6].startswith(f"block  queries L{first_q}–L{first_q + 15} × keys L{first_k}–L{first_k + 15}: ")
    screenshot_rgb(browser, tmp_path / "big.png")

    browser.evaluate(f"graphattnViewer.zoomTo({G + 1000}, {G + 1040}, {G + 1000}, {G + 1040})")
    assert browser.evaluate("graphattnViewer.mode()") == "tokens"
    point = hover_cell(browser, G + 1010, G + 1008)
    tooltip = browser.evaluate(TOOLTIP).splitlines()
    assert tooltip[:4] == ['query  L1010 "brown"', 'key    L1008 "the"', "piece  l2l", "label  dist:-2"]
    assert tooltip[4].startswith("query nodes  document:doc (G0), sentence:s62 (G63)")
    browser.evaluate("document.getElementById('tooltip').style.display = 'none'")
    pixels = screenshot_rgb(browser, tmp_path / "big_zoom.png")
    assert np.abs(pixels[int(point["y"]), int(point["x"])] - color(instance, "dist:-2")).max() <= 1


def test_page_opens_on_the_requested_range(browser, tmp_path):
    instance = big_instance(long_length=1024, globals_count=64, radius=32, max_distance=4)
    G = instance.global_length
    path = write_viewer(instance, tmp_path / "range.html", queries=AxisRange(G + 10, G + 50), keys=AxisRange(G, G + 60))
    open_page(browser, path)
    assert browser.evaluate("graphattnViewer.mode()") == "tokens"
    assert browser.evaluate("document.getElementById('status').textContent").startswith("queries L10–")


def test_compact_instance_travels_as_its_compact_form():
    instance = random_compact_instance(np.random.default_rng(3), G=6, L=30, radius=3, max_distance=2)
    meta, payload = viewer_data(instance)
    arrays = decode(meta, payload)
    assert meta["form"] == "compact" and "l2g" not in arrays and "band" not in arrays
    np.testing.assert_array_equal(arrays["longSegment"], instance.side.long_segment)
    assert np.all(np.diff(arrays["linkKey"]) > 0) and np.all(np.diff(arrays["edgeKey"]) > 0)  # sorted for binary search


def test_page_derives_every_pair_of_a_compact_instance_as_python_does(browser, tmp_path):
    # documents, segments, blocked g2g, a cross-segment label, hard rows, links, g2g edges: all at once
    for seed in (1, 2):
        instance = random_compact_instance(np.random.default_rng(seed), G=7, L=26, radius=3, max_distance=2)
        everything = Pattern(instance).full_range()
        want = Pattern(instance).labels(everything, everything) + 1
        open_page(browser, write_viewer(instance, tmp_path / f"compact-{seed}.html"))
        got = browser.evaluate(
            f"Array.from({{length: {len(everything)}}}, (_, q) => "
            f"Array.from({{length: {len(everything)}}}, (_, k) => graphattnViewer.code(q, k)))"
        )
        np.testing.assert_array_equal(np.array(got), want)


def test_262k_compact_viewer_stays_small():
    instance = sentence_instance(L=262_144, G=20_000, radius=84, max_distance=12)
    meta, payload = viewer_data(instance)
    assert len(payload) < 4_000_000  # the dense l2g alone would be 5.2e9 pairs
    assert meta["present"][0] == instance.label_vocab.belongs
