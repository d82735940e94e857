"""HTML charsets: only the WHATWG Encoding Standard's labels, sniffed in the browsers' order."""

import codecs
import encodings.aliases

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn.errors import IngestError
from graphattn.ingest.encoding import ENCODING_SOURCES, LABELS, WHATWG_ENCODINGS, decode_html, encoding_for_label
from graphattn.ingest.html import parse_html, read_html


def page(charset: str, body: bytes = b"<p>caf\xc3\xa9</p>") -> bytes:
    return b'<html><head><meta charset="' + charset.encode("ascii") + b'"></head><body>' + body + b"</body></html>"


def test_every_encoding_has_a_python_codec_or_is_one_of_the_two_special_ones():
    for name, (codec, labels) in WHATWG_ENCODINGS.items():
        assert name in labels or name == "replacement"
        if codec not in ("replacement", "x-user-defined"):
            codecs.lookup(codec)
    assert len(LABELS) == 228 and encoding_for_label("  LATIN1\t") == "windows-1252"
    assert encoding_for_label("utf-7") is None and encoding_for_label("latin-1") is None


@pytest.mark.parametrize(
    "charset", ["base64", "hex", "rot13", "zlib", "uu", "punycode", "bz2", "quopri", "utf-7", "idna"]
)
def test_codecs_that_are_not_whatwg_labels_are_ignored_like_browsers_do(charset):
    graph = parse_html(page(charset))
    assert graph.text == "caf\u00e9"
    assert graph.node("doc").attrs["encoding_source"] == "utf-8-default"


def test_utf7_is_not_honoured_so_text_cannot_forge_tags():
    graph = parse_html(page("utf-7", b"<p>+ADw-b+AD4-bold+ADw-/b+AD4-</p>"))
    assert graph.text == "+ADw-b+AD4-bold+ADw-/b+AD4-"
    assert [n.attrs["tag"] for n in graph.nodes_of_type("element")] == ["html", "body", "p"]


def test_undeclared_legacy_page_reads_as_windows_1252():
    graph = parse_html(b"<p>caf\xe9 \x93quoted\x94 \x81</p>")
    assert graph.text == "caf\u00e9 \u201cquoted\u201d \x81"  # 0x81 undefined in Windows: the C1 control, per WHATWG
    assert graph.node("doc").attrs["encoding_source"] == "fallback"
    assert graph.node("doc").attrs["encoding"] == "cp1252"


def test_meta_utf16_means_utf8_and_x_user_defined_means_windows_1252():
    assert parse_html(page("utf-16")).text == "caf\u00e9"
    graph = parse_html(page("x-user-defined", b"<p>\x93x\x94</p>"))
    assert graph.text == "\u201cx\u201d" and graph.node("doc").attrs["encoding"] == "cp1252"


def test_first_known_meta_label_wins():
    data = b'<meta charset="utf-7"><meta charset="koi8-r"><p>\xc1\xc2</p>'
    graph = parse_html(data)
    assert graph.text == "\u0430\u0431" and graph.node("doc").attrs["encoding_source"] == "meta"


def test_bom_wins_over_argument_and_meta():
    data = codecs.BOM_UTF8 + page("windows-1252")
    graph = parse_html(data, encoding="koi8-r")
    assert graph.text == "caf\u00e9" and graph.node("doc").attrs["encoding_source"] == "bom"


def test_argument_takes_whatwg_labels_and_names_close_ones():
    assert parse_html(b"<p>\xe9</p>", encoding="latin1").node("doc").attrs["encoding_source"] == "argument"
    with pytest.raises(IngestError, match=r"unknown encoding 'latin-1': not a label .*did you mean 'latin1'") as err:
        parse_html(b"<p>x</p>", encoding="latin-1", source="p.html")
    assert err.value.location.file == "p.html"
    with pytest.raises(IngestError, match="unknown encoding 'base64'"):
        parse_html(b"<p>x</p>", encoding="base64")


def test_replacement_encoding_is_an_error_or_one_replacement_character():
    with pytest.raises(IngestError, match="'replacement'") as err:
        parse_html(page("iso-2022-kr"), source="kr.html")
    assert err.value.location.file == "kr.html"
    assert decode_html(page("iso-2022-kr"), errors="replace")[0] == "\ufffd"


def test_x_user_defined_argument_maps_high_bytes_to_the_private_use_area():
    assert decode_html(b"a\x80\xff", encoding="x-user-defined")[0] == "a\uf780\uf7ff"


def test_read_html_takes_encoding_and_errors(tmp_path):
    path = tmp_path / "p.html"
    path.write_bytes(b"<p>bad \xff byte</p>")
    assert read_html(path).text == "bad \u00ff byte"  # undeclared: windows-1252
    with pytest.raises(IngestError, match=r"byte 7 .* not valid utf-8 \(encoding from argument\)") as err:
        read_html(path, encoding="utf-8")
    assert err.value.location.file == str(path) and err.value.location.line == 1
    assert read_html(path, encoding="utf-8", errors="replace").text == "bad \ufffd byte"
    with pytest.raises(IngestError, match="errors must be 'strict' or 'replace'"):
        read_html(path, errors="ignore")


_OTHER_NAMES = sorted({*encodings.aliases.aliases, *encodings.aliases.aliases.values()} - set(LABELS))
_WHITESPACE = st.text(alphabet="\t\n\f\r ", max_size=2)


@st.composite
def _known_labels(draw):
    label = draw(st.sampled_from(sorted(LABELS)))
    cased = "".join(c.upper() if draw(st.booleans()) else c for c in label)
    return label, draw(_WHITESPACE) + cased + draw(_WHITESPACE)


@settings(max_examples=150, deadline=None)
@given(_known_labels(), st.binary(max_size=40), st.sampled_from(["strict", "replace"]))
def test_random_whatwg_labels_decode_or_fail_with_an_ingest_error(labels, body, errors):
    label, written = labels
    data = page(written.strip(), b"<p>" + body + b"</p>")  # a <meta> attribute cannot hold the whitespace itself
    try:
        text, codec, how = decode_html(data, errors=errors)
    except IngestError as err:
        assert errors == "strict" and err.location.line is not None or "replacement" in str(err)
        return
    assert how == "meta"
    meta_means = {"utf-16be": "utf-8", "utf-16le": "utf-8", "x-user-defined": "windows-1252"}
    expected = meta_means.get(LABELS[label], LABELS[label])
    assert codec == WHATWG_ENCODINGS[expected][0]
    if errors == "replace" or expected != "replacement":
        assert isinstance(text, str)
    # The argument accepts the label with its whitespace and case as written.
    assert decode_html(b"<p>x</p>", encoding=written, errors="replace")[2] == "argument"


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.sampled_from(_OTHER_NAMES),
        st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.:", min_size=1, max_size=12),
    ),
    st.binary(max_size=40),
)
def test_random_labels_outside_the_standard_are_ignored(label, body):
    if encoding_for_label(label) is not None:
        return
    text, codec, how = decode_html(page(label, b"<p>" + body + b"</p>"), errors="replace")
    assert how in ("utf-8-default", "fallback") and how in ENCODING_SOURCES
    assert codec in ("utf-8", "cp1252")
    with pytest.raises(IngestError, match="unknown encoding"):
        decode_html(b"<p>x</p>", encoding=label)
