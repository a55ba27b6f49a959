"""PrometheusSource decodes an answer itself (orjson where that is sure to agree): the value or
the error is ``response.json()``'s — what prometheus-api-client, which decoded every answer
before, gives — for every body and declared charset, and the GC pause around it leaves the
collector as it was; the request is the client's."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.adapters.prometheus import PrometheusSource, _decoded, _result, _to_samples


def response(body: bytes, content_type: str | None = "application/json") -> requests.Response:
    """A response as requests builds one from the wire: its encoding from the header."""
    out = requests.Response()
    out.status_code = 200
    out._content = body
    if content_type is not None:
        out.headers["Content-Type"] = content_type
    out.encoding = requests.utils.get_encoding_from_headers(out.headers)
    return out


def outcome(call: Any) -> tuple[str, Any]:
    """The value, or the exception's type and text (and ``pos`` for a JSON error)."""
    try:
        return "value", call()
    except Exception as exc:  # the error itself is what is compared
        return "error", (type(exc), str(exc), getattr(exc, "pos", None))


def same(body: bytes, content_type: str | None = "application/json") -> None:
    new = outcome(lambda: _decoded(response(body, content_type)))
    old = outcome(lambda: response(body, content_type).json())
    assert new == old
    if new[0] == "value":  # equal and of the same types (1 == 1.0 and True == 1 in Python)
        assert json.dumps(new[1]) == json.dumps(old[1])


labels = st.dictionaries(st.text(max_size=8), st.text(max_size=12), max_size=4)
numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
)
points = st.lists(st.tuples(numbers, st.text(max_size=8) | numbers), max_size=5)
answers = st.fixed_dictionaries(
    {
        "status": st.just("success"),
        "data": st.fixed_dictionaries(
            {
                "resultType": st.sampled_from(["vector", "matrix", "scalar"]),
                "result": st.lists(
                    st.fixed_dictionaries({"metric": labels, "values": points}), max_size=4
                ),
            }
        ),
    }
)


@settings(max_examples=300, deadline=None)
@given(answers, st.booleans(), st.sampled_from(["application/json", None, "text/plain"]))
def test_any_answer_decodes_as_requests_decodes_it(
    answer: dict[str, Any], ascii_only: bool, content_type: str | None
) -> None:
    same(json.dumps(answer, ensure_ascii=ascii_only).encode(), content_type)


CORNERS = {
    "bom": b'\xef\xbb\xbf{"a": 1}',
    "utf-16": '{"a": "é"}'.encode("utf-16-le"),
    "utf-16 with bom": '{"a": "é"}'.encode("utf-16"),
    "utf-32": '{"a": 1}'.encode("utf-32-le"),
    "not utf-8": b'{"a": "\xff\xfe"}',
    "nan": b'{"a": NaN, "b": -Infinity}',
    "past a double": b'{"a": 1e400}',
    "long integer": b'{"a": 12345678901234567890123}',
    "lone surrogate": b'{"a": "\\ud800"}',
    "leading space": b' {"a": 1}',
    "trailing garbage": b'{"a": 1} x',
    "truncated": b'{"status":"success","data":{"result":[{"metric":{}',
    "html": b"<html><body>Sign in</body></html>",
    "empty": b"",
    "list": b"[1, 2]",
    "non-ascii label": '{"a": "μ-node ✓"}'.encode(),
}


@pytest.mark.parametrize("name", sorted(CORNERS))
@pytest.mark.parametrize(
    "content_type",
    ["application/json", None, "application/json; charset=iso-8859-1", "text/plain"],
)
def test_corner_bodies_decode_or_fail_as_requests_does(name: str, content_type: str | None) -> None:
    same(CORNERS[name], content_type)


def test_a_charset_other_than_utf8_is_decoded_by_requests() -> None:
    """latin-1 reads ``é``'s two UTF-8 bytes as two characters; orjson would read one."""
    body = '{"a": "é"}'.encode()
    got = _decoded(response(body, "application/json; charset=iso-8859-1"))
    assert got == {"a": "Ã©"}


def test_decoding_leaves_the_collector_as_it_was() -> None:
    body = json.dumps({"data": {"result": [{"metric": {}, "values": [[1, "2"]]}]}}).encode()
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            assert _to_samples(_result(response(body)))[0].points == ((1.0, 2.0),)
            assert gc.isenabled() is enabled
            with pytest.raises(requests.exceptions.JSONDecodeError):
                _result(response(b"{"))
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("query", ["up", "x" * 5000])  # a GET, and a POST past the URL limit
def test_queries_use_the_sources_ca_bundle_whatever_the_environment_names(
    query: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As prometheus-api-client sent them: the session's ``verify`` stated on each request, so
    requests does not replace the configured CA bundle by ``REQUESTS_CA_BUNDLE``'s."""
    ours, theirs = tmp_path / "ours.pem", tmp_path / "theirs.pem"
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(theirs))
    source = PrometheusSource("https://prometheus.example:9090", ca_bundle=ours, retries=0)
    sent: list[Any] = []

    def send(request: requests.PreparedRequest, **options: Any) -> requests.Response:
        sent.append(options["verify"])
        out = response(b'{"status":"success","data":{"resultType":"vector","result":[]}}')
        out.request = request
        return out

    monkeypatch.setattr(source._session.get_adapter(source.url), "send", send)
    assert source.instant(query) == []
    assert sent == [str(ours)]
