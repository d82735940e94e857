"""The terminal view, compared character for character."""

import io

import pytest
from viz_instances import hand_instance

from graphattn.errors import GraphattnError
from graphattn.viz.pattern import AxisRange
from graphattn.viz.terminal import pick_style, terminal_view

# G0 document (soft), G1 = sentence s0 (L0-L1), G2 = sentence s1 (L2-L4) with hard g2l; radius 1,
# max distance 1: a dist:0, b dist:+1, c dist:-1, d does_not_belong, e belongs.
LETTERS = """\
labels:  e=belongs  d=does_not_belong  c=dist:-1  a=dist:0  b=dist:+1
                  G       L
                  0 1 2   0 1 2 3 4
G0 document:doc │ a b b │ e e e e e
G1 sentence:s0  │ c a b │ e e · · ·
G2 sentence:s1  │ c c a │ · · e e e
────────────────────────┼──────────
L0 the          │ e e d │ a b · · ·
L1 quick        │ e e d │ c a b · ·
L2 brown        │ e d e │ · c a b ·
L3 fox          │ e d e │ · · c a b
L4 jumps        │ e d e │ · · · c a
"""

PLAIN_ZOOM = """\
■ allowed  □ masked
                 L
                 0 1 2 3 4
G1 sentence:s0 │ ■ ■ □ □ □
G2 sentence:s1 │ □ □ ■ ■ ■
──────────────────────────
L0 the         │ ■ ■ □ □ □
L1 quick       │ ■ ■ ■ □ □
"""

ASCII = """\
# allowed  . masked
              G     L
              0 1   0 1 2
G0 documen~ | # # | # # #
G1 sentenc~ | # # | # # #
------------------+------
L0 the      | # # | # # .
L1 quick    | # # | # # #
L2 brown    | # # | . # #
"""


@pytest.fixture
def instance():
    return hand_instance((2, 3), radius=1, max_distance=1)


def test_letters_view_of_a_tiny_instance(instance):
    assert terminal_view(instance, style="letters") == LETTERS


def test_plain_view_of_a_range(instance):
    assert terminal_view(instance, AxisRange(1, 5), AxisRange(3, 8), style="plain") == PLAIN_ZOOM


def test_ascii_fallback_and_cut_names():
    instance = hand_instance((3,), radius=1, max_distance=1)
    text = terminal_view(instance, AxisRange(0, 5), AxisRange(0, 5), style="plain", ascii_only=True, name_width=11)
    assert text == ASCII
    assert text.isascii()


def test_color_view_paints_each_label_in_its_color(instance):
    text = terminal_view(instance, style="color")
    belongs = "\x1b[38;2;43;161;43m■\x1b[0m"
    assert text.splitlines()[4].startswith("G1 sentence:s0  │ ")
    assert text.splitlines()[4].count(belongs) == 2  # s0 owns L0 and L1 only
    assert f"{belongs} belongs" in text.splitlines()[0] + text.splitlines()[1]


def test_wide_views_fall_back_to_shaded_blocks():
    text = terminal_view(hand_instance((40,) * 4, radius=3), style="plain")
    lines = text.splitlines()
    assert lines[1].startswith("blocks of up to 4 tokens")
    row = next(line for line in lines if line.startswith("L0-3 "))
    # L0-3 x L0-3: 4x4 pairs, |i-j| <= 3 everywhere -> all allowed (█); x L4-7: 6 of 16 (▒)
    assert row.split("│")[2].split()[:2] == ["█", "▒"]


def test_unknown_style_is_an_error(instance):
    with pytest.raises(GraphattnError, match="expected one of plain, letters, color"):
        terminal_view(instance, style="fancy")


def test_pick_style_falls_back_to_letters_and_ascii():
    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    assert pick_style(stream) == ("letters", True)
