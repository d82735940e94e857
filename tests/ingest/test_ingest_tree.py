"""The tree record of the HTML reader (`graphattn.ingest._tree`): structure computed with numpy
from parent indices, checked on small trees written out by hand."""

from __future__ import annotations

import lxml.etree as etree
import numpy as np
import pytest

from graphattn.errors import IngestError
from graphattn.graph.forest import forest_depths
from graphattn.ingest._tree import _below, _events, walk
from graphattn.ingest.html import _parse_tree

# 0 html > 1 body > (2 div > 3 p, 4 span), 5 p ; parents in document order
PARENTS = np.array([-1, 0, 1, 2, 1, 0])


def test_depths_count_ancestors():
    np.testing.assert_array_equal(forest_depths(PARENTS)[0], [0, 1, 2, 3, 2, 1])


def test_below_marks_what_a_marked_element_holds():
    marked = np.array([False, False, True, False, False, False])  # the div
    np.testing.assert_array_equal(_below(marked, PARENTS), [False, False, False, True, False, False])
    marked = np.array([False, True, False, False, False, False])  # body: everything under it
    np.testing.assert_array_equal(_below(marked, PARENTS), [False, False, True, True, True, False])


def test_events_close_each_subtree_deepest_first():
    expected = [0, 1, 2, 3, ~3, ~2, 4, ~4, ~1, 5, ~5, ~0]
    np.testing.assert_array_equal(_events(PARENTS, forest_depths(PARENTS)[0]), expected)


def test_a_hidden_subtree_is_recorded_as_one_hidden_element():
    root = _parse_tree(
        '<html><body><div style="display:none"><p>a</p><p>b</p></div><p hidden>c</p>'
        '<input type="hidden"><p id="x">d</p></body></html>',
        None,
    )
    chosen = set(root.xpath("//p"))
    record = walk(root, max_elements=100, source=None, selected=chosen)
    tags = [record.tag_names[c] for c in record.tag_codes]
    assert tags == ["html", "body", "div", "p", "input", "p"]  # the div's paragraphs are not seen
    np.testing.assert_array_equal(record.hidden, [2, 3, 4])
    np.testing.assert_array_equal(record.parents, [-1, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(record.selected, [5])  # hidden or unseen paragraphs are not selected
    assert record.styled == {}  # the styled elements here are all hidden
    assert record.texts[-1] == "d"


def test_max_elements_counts_rendered_elements_only():
    markup = "<html><body>" + "<p>a</p>" * 5 + "<template>" + "<p>b</p>" * 50 + "</template></body></html>"
    record = walk(_parse_tree(markup, None), max_elements=7, source=None)  # html, body, 5 p; the template hidden
    assert record.tag_codes.size == 8 and record.hidden.tolist() == [7]
    with pytest.raises(IngestError, match="max_elements=6"):
        walk(_parse_tree(markup, None), max_elements=6, source=None)


def test_an_empty_root_is_one_element():
    record = walk(etree.fromstring("<html/>", etree.HTMLParser()), max_elements=1, source=None)
    assert record.tag_names == ["html"] and record.events.tolist() == [0, ~0]
