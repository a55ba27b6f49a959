"""The extender's nesting bound (``wire._nesting``), vectorised over the body's bytes, reads every
JSON-shaped text as the grammar does: the deepest ``[``/``{`` outside strings, escaped quotes and
backslash runs included, for bytes and text, ASCII or not. The reference is the plain reading,
one character at a time, written out here."""

from __future__ import annotations

import json

from hypothesis import event, given, settings
from hypothesis import strategies as st

from defrag.extender.wire import MAX_NESTING, BadRequest, _nesting, parse_args
from tests.support import kubeobjects as k


def reference(text: str) -> int:
    """The deepest nesting outside strings, read one character at a time."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


# Strings hold any of the characters that matter (brackets, escaped quotes, runs of escaped
# backslashes, non-ASCII); outside them only brackets, separators and literals.
_INSIDE = st.lists(
    st.sampled_from(["[", "]", "{", "}", '\\"', "\\\\", "\\n", "a", "é", "€", ":", ","]),
    max_size=8,
).map(lambda parts: '"' + "".join(parts) + '"')
_OUTSIDE = st.sampled_from(["[", "]", "{", "}", ",", ":", "1", "null", " "])
_PIECES = st.lists(st.one_of(_INSIDE, _OUTSIDE), max_size=400).map("".join)
# A body is only read past its first count when it holds MAX_NESTING brackets or more, which
# short random texts never do: an opening run brings most texts near or past the bound.
TEXTS = st.tuples(st.integers(MAX_NESTING - 8, MAX_NESTING + 3), _PIECES).map(
    lambda t: "[" * t[0] + t[1]
)


@settings(max_examples=500, deadline=None)
@given(TEXTS)
def test_nesting_is_the_grammars(text: str) -> None:
    counted = text.count("[") + text.count("{") >= MAX_NESTING
    event("read past the count" if counted else "stopped at the count")
    want = reference(text) if counted else 0
    assert _nesting(text) == want
    assert _nesting(text.encode()) == want
    assert _nesting(bytearray(text.encode())) == want


@given(st.integers(min_value=MAX_NESTING - 2, max_value=MAX_NESTING + 3))
def test_a_body_deeper_than_the_bound_is_refused_and_one_within_is_read(depth: int) -> None:
    nested: object = {}
    for _ in range(depth - 1):
        nested = [nested]
    pod = k.pod("p", "ns", 1, annotations={"x": '[[[{{{\\"['})
    body = json.dumps({"Pod": pod, "NodeNames": ["a"], "Deep": nested}).encode()
    # the outer object adds one level to the nested value's own; the brackets inside the
    # annotation's string count for nothing
    if depth + 1 > MAX_NESTING:
        try:
            parse_args(body)
        except BadRequest as exc:
            assert "nested deeper" in str(exc)
        else:
            raise AssertionError("a body nested too deep was read")
    else:
        assert parse_args(body).node_names == ("a",)
