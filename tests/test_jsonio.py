"""The edge's JSON codec gives what the standard library gives (defrag/adapters/jsonio.py).

orjson decodes the bodies; where it would differ from :mod:`json` (a literal it refuses, an
integer past 64 bits) :mod:`json` answers, so every value and every error is :mod:`json`'s.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.adapters import jsonio


def _same(a: Any, b: Any) -> bool:
    """Equal, of the same types all the way down, NaN equal to NaN and −0.0 apart from 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _outcome(decode: Any, data: bytes | str) -> tuple[str, Any]:
    try:
        return "value", decode(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        return type(exc).__name__, str(exc)


# Each body and why it is here: orjson refuses it or would decode it otherwise than json does.
CORNERS = [
    (b'{"a":1,"a":2}', "a duplicate key: the last one wins in both"),
    (b"[9223372036854775807, 18446744073709551615]", "the 64-bit limits: orjson exact"),
    (b"18446744073709551616", "2**64: orjson gives a float, json an int"),
    (b"[-9223372036854775809]", "-2**63 - 1: orjson gives a float, json an int"),
    (b'{"n": 123456789012345678901234567890}', "30 digits after a colon"),
    (b"[1, 2,\t-99999999999999999999]", "a long negative after whitespace"),
    (b'{"s": "abc1234567890123456789"}', "19 digits inside a string: json answers, same value"),
    (b"1e400", "past the largest double: json gives inf, orjson refuses"),
    (b"[NaN, Infinity, -Infinity]", "json's non-standard constants"),
    (b'"\\ud800"', "a lone surrogate escape: json keeps it, orjson refuses"),
    (b"\xef\xbb\xbf{}", "a UTF-8 byte-order mark"),
    ('{"a": "\u00e9"}'.encode("utf-16"), "UTF-16 with a BOM: json detects the encoding"),
    (b'{"a": "\xff"}', "not UTF-8: json's UnicodeDecodeError"),
    (b"[1,]", "a trailing comma: json's own message"),
    (b"", "empty: json's Expecting value"),
    (b'{"values": [[1700000000.123, "NaN"], [1700000030, "+Inf"], [1.5, "-Inf"]]}', "Prometheus"),
    (b"-0", "minus zero as an integer is 0"),
    (b"[-0.0, 0.1, 1.7976931348623157e308, 5e-324, 1e-400]", "float edges"),
]


@pytest.mark.parametrize(("body", "why"), CORNERS, ids=[w for _, w in CORNERS])
def test_loads_answers_as_json_does(body: bytes, why: str) -> None:
    kind, want = _outcome(json.loads, body)
    got_kind, got = _outcome(jsonio.loads, body)
    assert got_kind == kind, why
    assert _same(got, want) if kind == "value" else got == want, why


def test_loads_passes_parse_constant_to_json() -> None:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} refused")

    with pytest.raises(ValueError, match="NaN refused"):
        jsonio.loads(b'{"x": NaN}', parse_constant=refuse)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview, str])
def test_loads_takes_every_body_type(kind: type) -> None:
    body = '{"Pod": {"metadata": {"name": "p\u00e9"}}, "NodeNames": ["a"]}'
    data = body if kind is str else kind(body.encode())
    assert jsonio.loads(data) == json.loads(body)


def test_long_integer_screen() -> None:
    # 18 digits cannot leave the 64-bit range; 19 that end where a number may end may
    screen = jsonio._may_hold_long_integer
    assert not screen(b"[123456789012345678]")
    assert screen(b"[1234567890123456789]")
    assert screen(b"1234567890123456789")  # at the very end of the body
    assert screen(b'{"a":-1234567890123456789 }')
    assert not screen(b'"sha256:a1234567890123456789b"')  # inside a digest: not a number
    assert not screen(b"[12345678901234567890.5]")  # a float: orjson is exact


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=_JSON, indent=st.sampled_from([None, 1]), ascii_only=st.booleans())
def test_loads_equals_json_on_random_documents(value: Any, indent: Any, ascii_only: bool) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    for body in (text, text.encode("utf-8", "surrogatepass")):
        assert _same(_outcome(jsonio.loads, body), _outcome(json.loads, body))


@settings(max_examples=300, deadline=None)
@given(value=_JSON, cut=st.integers(min_value=0, max_value=200), junk=st.binary(max_size=3))
def test_loads_equals_json_on_damaged_documents(value: Any, cut: int, junk: bytes) -> None:
    body = json.dumps(value).encode("utf-8", "surrogatepass")
    damaged = body[:cut] + junk + body[cut + len(junk) :]
    assert _same(_outcome(jsonio.loads, damaged), _outcome(json.loads, damaged))


_ANSWERS = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=_ANSWERS)
def test_dumps_writes_json_compact_bytes(value: Any) -> None:
    assert jsonio.dumps(value) == json.dumps(value, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "value",
    [
        {"Error": "does not fit \u2265 1 GPU"},  # non-ASCII: json's \u escapes
        {1: "an int key"},  # orjson refuses; json writes "1"
        ["\x00\x1f\x7f", "\u2028"],  # control characters and a line separator
        {"FailedNodes": {}, "NodeNames": ["a", "b"], "Nodes": None, "Error": ""},
    ],
)
def test_dumps_corners(value: Any) -> None:
    assert jsonio.dumps(value) == json.dumps(value, separators=(",", ":")).encode()
