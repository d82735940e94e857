"""HTML bytes -> text as browsers decode them: the WHATWG Encoding Standard's labels, and HTML's
encoding sniffing (byte-order mark, then the caller's encoding, then ``<meta charset>``, then a
fallback).

Why not `codecs.lookup`: it accepts every Python codec name, among them byte-to-byte codecs
(``base64``, ``hex``, ``rot13``, ``zlib``, ``uu``) that fail with LookupError or garbage, ``punycode``
that fails with UnicodeError, and ``utf-7``, which turns ``+ADw-b+AD4-`` into a real ``<b>`` tag.
Browsers accept exactly the labels in `WHATWG_ENCODINGS` (https://encoding.spec.whatwg.org/,
"Names and labels": 40 encodings, 228 labels); anything else in a ``<meta>`` is
ignored, as they ignore it.

The order, as HTML's sniffing algorithm has it:

1. a byte-order mark (UTF-8, UTF-16LE, UTF-16BE) wins over everything, and is removed;
2. the caller's ``encoding`` (what a Content-Type header would say): a WHATWG label, or an
   `IngestError` naming the close labels;
3. the first ``<meta charset=...>`` / ``<meta http-equiv content="...; charset=...">`` in the first
   4 KB whose label is known (``utf-16*`` there means UTF-8 and ``x-user-defined`` windows-1252, as
   the HTML standard says: a page that can declare it in ASCII is not UTF-16);
4. nothing declared: UTF-8 when the bytes are valid UTF-8, else windows-1252 (the Encoding
   Standard's default for legacy pages, and what browsers in most locales do).

The graph records where the encoding came from as ``encoding_source``: ``bom``, ``argument``,
``meta``, ``utf-8-default`` (step 4, valid UTF-8) or ``fallback`` (step 4, windows-1252).

Decoding: ``errors="strict"`` (the default) refuses bytes that are not valid in the chosen encoding
with an `IngestError` naming the byte offset and line; ``errors="replace"`` reads each as U+FFFD, as
browsers do. windows-1252 and its siblings (windows-874, windows-1250 ... 1258) decode the bytes
0x80-0x9F that Windows leaves undefined as the C1 control of the same value, as the Standard's
indexes do. The ``replacement`` encoding (the labels of ISO-2022-KR/CN and HZ, which are unsafe to
decode) is one U+FFFD under ``errors="replace"`` and an error under ``strict``.
"""

from __future__ import annotations

import codecs
import difflib
import re

from graphattn.errors import IngestError

# The Encoding Standard's encodings: name -> (Python codec, labels). Labels are matched after
# stripping ASCII whitespace and lowercasing. Python codecs stand for the Standard's decoders where
# they agree: gbk decodes as gb18030, big5 as Big5-HKSCS, shift_jis as windows-31j (cp932) and euc-kr
# as windows-949 (cp949), which is what the Standard specifies for those names.
WHATWG_ENCODINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "utf-8": ("utf-8", ("unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "utf-8", "utf8", "x-unicode20utf8")),
    "ibm866": ("cp866", ("866", "cp866", "csibm866", "ibm866")),
    "iso-8859-2": (
        "iso8859-2",
        (
            "csisolatin2",
            "iso-8859-2",
            "iso-ir-101",
            "iso8859-2",
            "iso88592",
            "iso_8859-2",
            "iso_8859-2:1987",
            "l2",
            "latin2",
        ),
    ),
    "iso-8859-3": (
        "iso8859-3",
        (
            "csisolatin3",
            "iso-8859-3",
            "iso-ir-109",
            "iso8859-3",
            "iso88593",
            "iso_8859-3",
            "iso_8859-3:1988",
            "l3",
            "latin3",
        ),
    ),
    "iso-8859-4": (
        "iso8859-4",
        (
            "csisolatin4",
            "iso-8859-4",
            "iso-ir-110",
            "iso8859-4",
            "iso88594",
            "iso_8859-4",
            "iso_8859-4:1988",
            "l4",
            "latin4",
        ),
    ),
    "iso-8859-5": (
        "iso8859-5",
        (
            "csisolatincyrillic",
            "cyrillic",
            "iso-8859-5",
            "iso-ir-144",
            "iso8859-5",
            "iso88595",
            "iso_8859-5",
            "iso_8859-5:1988",
        ),
    ),
    "iso-8859-6": (
        "iso8859-6",
        (
            "arabic",
            "asmo-708",
            "csiso88596e",
            "csiso88596i",
            "csisolatinarabic",
            "ecma-114",
            "iso-8859-6",
            "iso-8859-6-e",
            "iso-8859-6-i",
            "iso-ir-127",
            "iso8859-6",
            "iso88596",
            "iso_8859-6",
            "iso_8859-6:1987",
        ),
    ),
    "iso-8859-7": (
        "iso8859-7",
        (
            "csisolatingreek",
            "ecma-118",
            "elot_928",
            "greek",
            "greek8",
            "iso-8859-7",
            "iso-ir-126",
            "iso8859-7",
            "iso88597",
            "iso_8859-7",
            "iso_8859-7:1987",
            "sun_eu_greek",
        ),
    ),
    "iso-8859-8": (
        "iso8859-8",
        (
            "csiso88598e",
            "csisolatinhebrew",
            "hebrew",
            "iso-8859-8",
            "iso-8859-8-e",
            "iso-ir-138",
            "iso8859-8",
            "iso88598",
            "iso_8859-8",
            "iso_8859-8:1988",
            "visual",
        ),
    ),
    "iso-8859-8-i": ("iso8859-8", ("csiso88598i", "iso-8859-8-i", "logical")),
    "iso-8859-10": (
        "iso8859-10",
        ("csisolatin6", "iso-8859-10", "iso-ir-157", "iso8859-10", "iso885910", "l6", "latin6"),
    ),
    "iso-8859-13": ("iso8859-13", ("iso-8859-13", "iso8859-13", "iso885913")),
    "iso-8859-14": ("iso8859-14", ("iso-8859-14", "iso8859-14", "iso885914")),
    "iso-8859-15": ("iso8859-15", ("csisolatin9", "iso-8859-15", "iso8859-15", "iso885915", "iso_8859-15", "l9")),
    "iso-8859-16": ("iso8859-16", ("iso-8859-16",)),
    "koi8-r": ("koi8-r", ("cskoi8r", "koi", "koi8", "koi8-r", "koi8_r")),
    "koi8-u": ("koi8-u", ("koi8-ru", "koi8-u")),
    "macintosh": ("mac-roman", ("csmacintosh", "mac", "macintosh", "x-mac-roman")),
    "windows-874": ("cp874", ("dos-874", "iso-8859-11", "iso8859-11", "iso885911", "tis-620", "windows-874")),
    "windows-1250": ("cp1250", ("cp1250", "windows-1250", "x-cp1250")),
    "windows-1251": ("cp1251", ("cp1251", "windows-1251", "x-cp1251")),
    "windows-1252": (
        "cp1252",
        (
            "ansi_x3.4-1968",
            "ascii",
            "cp1252",
            "cp819",
            "csisolatin1",
            "ibm819",
            "iso-8859-1",
            "iso-ir-100",
            "iso8859-1",
            "iso88591",
            "iso_8859-1",
            "iso_8859-1:1987",
            "l1",
            "latin1",
            "us-ascii",
            "windows-1252",
            "x-cp1252",
        ),
    ),
    "windows-1253": ("cp1253", ("cp1253", "windows-1253", "x-cp1253")),
    "windows-1254": (
        "cp1254",
        (
            "cp1254",
            "csisolatin5",
            "iso-8859-9",
            "iso-ir-148",
            "iso8859-9",
            "iso88599",
            "iso_8859-9",
            "iso_8859-9:1989",
            "l5",
            "latin5",
            "windows-1254",
            "x-cp1254",
        ),
    ),
    "windows-1255": ("cp1255", ("cp1255", "windows-1255", "x-cp1255")),
    "windows-1256": ("cp1256", ("cp1256", "windows-1256", "x-cp1256")),
    "windows-1257": ("cp1257", ("cp1257", "windows-1257", "x-cp1257")),
    "windows-1258": ("cp1258", ("cp1258", "windows-1258", "x-cp1258")),
    "x-mac-cyrillic": ("mac-cyrillic", ("x-mac-cyrillic", "x-mac-ukrainian")),
    "gbk": (
        "gb18030",
        ("chinese", "csgb2312", "csiso58gb231280", "gb2312", "gb_2312", "gb_2312-80", "gbk", "iso-ir-58", "x-gbk"),
    ),
    "gb18030": ("gb18030", ("gb18030",)),
    "big5": ("big5hkscs", ("big5", "big5-hkscs", "cn-big5", "csbig5", "x-x-big5")),
    "euc-jp": ("euc_jp", ("cseucpkdfmtjapanese", "euc-jp", "x-euc-jp")),
    "iso-2022-jp": ("iso2022_jp", ("csiso2022jp", "iso-2022-jp")),
    "shift_jis": (
        "cp932",
        ("csshiftjis", "ms932", "ms_kanji", "shift-jis", "shift_jis", "sjis", "windows-31j", "x-sjis"),
    ),
    "euc-kr": (
        "cp949",
        (
            "cseuckr",
            "csksc56011987",
            "euc-kr",
            "iso-ir-149",
            "korean",
            "ks_c_5601-1987",
            "ks_c_5601-1989",
            "ksc5601",
            "ksc_5601",
            "windows-949",
        ),
    ),
    "replacement": (
        "replacement",
        ("csiso2022kr", "hz-gb-2312", "iso-2022-cn", "iso-2022-cn-ext", "iso-2022-kr", "replacement"),
    ),
    "utf-16be": ("utf-16-be", ("unicodefffe", "utf-16be")),
    "utf-16le": (
        "utf-16-le",
        ("csunicode", "iso-10646-ucs-2", "ucs-2", "unicode", "unicodefeff", "utf-16", "utf-16le"),
    ),
    "x-user-defined": ("x-user-defined", ("x-user-defined",)),
}
LABELS: dict[str, str] = {label: name for name, (_, labels) in WHATWG_ENCODINGS.items() for label in labels}

ENCODING_SOURCES = ("bom", "argument", "meta", "utf-8-default", "fallback")
ERRORS = ("strict", "replace")
PRESCAN_BYTES = 4096

_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_BE, "utf-16be"), (codecs.BOM_UTF16_LE, "utf-16le"))
_META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_ASCII_WHITESPACE = "\t\n\f\r "
_C1_WINDOWS = frozenset(("windows-874", *(f"windows-{n}" for n in range(1250, 1259))))
_X_USER_DEFINED = {b: 0xF700 + b for b in range(0x80, 0x100)}  # bytes 0x80-0xFF -> U+F780-U+F7FF


def _c1_handler(fallback: str):
    """Undefined bytes 0x80-0x9F -> the C1 control of that value; any other undefined byte per `fallback`."""

    def handle(err: UnicodeDecodeError):
        byte = err.object[err.start]
        if 0x80 <= byte <= 0x9F:
            return chr(byte), err.start + 1
        if fallback == "replace":
            return "\ufffd", err.start + 1
        raise err

    return handle


for _errors in ERRORS:
    codecs.register_error(f"graphattn-c1-{_errors}", _c1_handler(_errors))


def encoding_for_label(label: str) -> str | None:
    """The Encoding Standard's name for a label (``"latin1"`` -> ``"windows-1252"``), None if unknown."""
    return LABELS.get(label.strip(_ASCII_WHITESPACE).lower())


def sniff_encoding(data: bytes, encoding: str | None = None, source: str | None = None) -> tuple[str, str, bytes]:
    """(WHATWG encoding name, how it was chosen, the bytes to decode) per steps 1-3 of the module
    docstring; step 4 (nothing declared) returns ``("utf-8", "utf-8-default", data)``."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            return name, "bom", data[len(bom) :]
    if encoding is not None:
        name = encoding_for_label(encoding)
        if name is None:
            close = difflib.get_close_matches(encoding.strip().lower(), list(LABELS), n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            message = f"unknown encoding {encoding!r}: not a label of the WHATWG Encoding Standard{hint}"
            raise IngestError(message, file=source, path=("encoding",))
        return name, "argument", data
    for match in _META_CHARSET.finditer(data[:PRESCAN_BYTES]):
        name = encoding_for_label(match.group(1).decode("ascii"))
        if name is not None:  # browsers skip labels they do not know
            name = "utf-8" if name.startswith("utf-16") else "windows-1252" if name == "x-user-defined" else name
            return name, "meta", data
    return "utf-8", "utf-8-default", data


def decode_html(
    data: bytes, *, encoding: str | None = None, errors: str = "strict", source: str | None = None
) -> tuple[str, str, str]:
    """Decode HTML bytes: (text, Python codec used, how the encoding was chosen). See the module docstring."""
    if errors not in ERRORS:
        raise IngestError(f"errors must be 'strict' or 'replace', got {errors!r}", file=source, path=("errors",))
    name, how, data = sniff_encoding(data, encoding, source)
    if how == "utf-8-default":
        try:
            return data.decode("utf-8"), "utf-8", how
        except UnicodeDecodeError:
            name, how = "windows-1252", "fallback"
    codec = WHATWG_ENCODINGS[name][0]
    if name == "x-user-defined":
        return data.decode("latin-1").translate(_X_USER_DEFINED), codec, how
    if name == "replacement":
        if errors == "replace":
            return ("\ufffd" if data else ""), codec, how
        raise IngestError(
            f"the page's encoding (from {how}) is one the WHATWG Encoding Standard maps to 'replacement' "
            "(ISO-2022-KR/CN, HZ: unsafe to decode); browsers show one U+FFFD; pass errors='replace' for that, "
            "or encoding=... for the real one",
            file=source,
        )
    try:
        return data.decode(codec, errors=f"graphattn-c1-{errors}" if name in _C1_WINDOWS else errors), codec, how
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise IngestError(
            f"byte {err.start} ({data[err.start : err.start + 1]!r}) is not valid {name} "
            f"(encoding from {how}); declare the right one (<meta charset>, encoding=...) or pass "
            "errors='replace' to read it as U+FFFD",
            file=source,
            line=line,
        ) from None
