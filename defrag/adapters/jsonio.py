"""JSON in and out at the edge, fast, with the standard library's results.

Every large JSON body defrag decodes — Kubernetes list pages, the extender's requests,
Prometheus's query answers (``adapters/prometheus.py`` sends the request prometheus-api-client
would and decodes the answer here) — goes through :func:`loads`; the extender's answers are
encoded by :func:`dumps`. Both use
orjson (a compiled codec, several times faster than :mod:`json` on these bodies) and give what
:mod:`json` gives, so switching codec changes no result and no error:

- orjson refuses what :mod:`json` accepts in a few corners: ``NaN``/``Infinity`` literals, lone
  surrogate escapes (``"\\ud800"``), a byte-order mark, UTF-16/32 bodies, ``1e400``. Whatever
  orjson refuses is decoded again by :mod:`json` (with the caller's ``parse_constant``), which
  then returns its own value or raises its own :class:`json.JSONDecodeError`.
- orjson decodes an integer outside the 64-bit ranges as a float, :mod:`json` as an exact
  ``int``. Such a literal has 19 digits or more; a body holding a run of 19 digits that ends
  where a JSON number may end is decoded by :mod:`json` too. The test is one byte translation
  and one search (a third of orjson's own time on a 13 kB extender request, a tenth on a
  Prometheus answer).
- :func:`dumps` writes non-ASCII text as UTF-8, :mod:`json` as ``\\u`` escapes; an answer
  that is not pure ASCII is encoded by :mod:`json`, so the bytes are the same as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

LONG_DIGITS = 19
"""Digits of the shortest integer literal orjson may decode inexactly (−9223372036854775809)."""

_CLASSES = bytes.maketrans(b"0123456789,]} \t\r\n", b"0000000000SSSSSSS")
"""Digits → ``0``; the bytes that may end a number → ``S``; every other byte stays itself (a
literal ``S`` after a run of digits then only costs a needless fallback)."""
_RUN = b"0" * LONG_DIGITS


def _may_hold_long_integer(data: bytes) -> bool:
    """Whether ``data`` may hold an integer literal of :data:`LONG_DIGITS` digits or more: a run
    of that many digits ending where a number may end (``,``, ``]``, ``}``, whitespace, the end
    of the body). A run inside a string that ends otherwise — a hex digest, a float's digits
    before its ``.`` — is not one; orjson decodes floats of any length exactly."""
    shape = data.translate(_CLASSES)
    return _RUN + b"S" in shape or shape.endswith(_RUN)


def loads(
    data: bytes | bytearray | memoryview | str,
    parse_constant: Callable[[str], Any] | None = None,
) -> Any:
    """``json.loads(data, parse_constant=parse_constant)``, by orjson where that is the same.

    Raises what :func:`json.loads` raises (:class:`json.JSONDecodeError`,
    :class:`UnicodeDecodeError`, :class:`RecursionError`) for a body that is not JSON.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if not _may_hold_long_integer(raw):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # refused by orjson: json's own answer or its own error, below
    text = data if isinstance(data, str) else raw
    return json.loads(text, parse_constant=parse_constant)


def dumps(obj: Any) -> bytes:
    """``json.dumps(obj, separators=(",", ":")).encode()``: the compact form, byte for byte for
    dicts, lists, strings, ints, bools and None. A float is the same value, spelt as orjson
    spells it (``1e20`` where :mod:`json` writes ``1e+20``; NaN as ``null``, which Go's
    encoding/json reads and :mod:`json`'s ``NaN`` is not)."""
    try:
        out = orjson.dumps(obj)
    except orjson.JSONEncodeError:  # a key that is not a string, an integer past 64 bits
        return _compact(obj)
    return out if out.isascii() else _compact(obj)


def _compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
