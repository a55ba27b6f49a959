"""QuietHandler.send_body: the bytes the standard library's parts write (status line, headers,
blank line, body), written at once for a small body."""

from __future__ import annotations

import io
import logging
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.adapters.httpserve import JOIN_BODY_BYTES, QuietHandler


class _Writes(io.BytesIO):
    """A wfile that counts its writes."""

    writes = 0

    def write(self, data: Any) -> int:
        self.writes += 1
        return super().write(data)


def _handler(version: str) -> tuple[QuietHandler, _Writes]:
    handler = QuietHandler.__new__(QuietHandler)  # no socket: only what answering reads
    out = _Writes()
    handler.wfile = out
    handler.request_version = version
    handler.requestline = "POST /filter HTTP/1.1"
    handler.command = "POST"
    handler.client_address = ("127.0.0.1", 40000)
    handler.close_connection = False
    handler.date_time_string = lambda timestamp=None: "Fri, 04 Dec 2026 20:00:00 GMT"  # type: ignore[method-assign]
    return handler, out


def _parts_written(handler: QuietHandler, code: int, body: bytes, content_type: str) -> None:
    """The standard library's way, part by part (what send_body wrote before)."""
    handler.send_response(code)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@settings(max_examples=200, deadline=None)
@given(
    version=st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/0.9"]),
    code=st.sampled_from([200, 400, 404, 500, 503]),
    body=st.one_of(
        st.binary(max_size=300),
        st.integers(JOIN_BODY_BYTES - 2, JOIN_BODY_BYTES + 2).map(lambda n: b"x" * n),
    ),
    content_type=st.sampled_from(["application/json", "text/plain; version=0.0.4"]),
)
def test_send_body_writes_what_the_parts_write(
    version: str, code: int, body: bytes, content_type: str
) -> None:
    new, new_out = _handler(version)
    old, old_out = _handler(version)
    new.send_body(code, body, content_type)
    _parts_written(old, code, body, content_type)
    assert new_out.getvalue() == old_out.getvalue()
    assert new.close_connection == old.close_connection
    if version != "HTTP/0.9" and len(body) <= JOIN_BODY_BYTES:
        assert new_out.writes == 1  # status line, headers and body in one write
    # A second answer on the same connection starts with an empty header buffer.
    new.send_body(code, body, content_type)
    _parts_written(old, code, body, content_type)
    assert new_out.getvalue() == old_out.getvalue()


def test_log_message_formats_only_when_debug_is_on(caplog: Any) -> None:
    handler, _out = _handler("HTTP/1.1")
    handler.logger = logging.getLogger("defrag.test.httpserve")
    handler.logger.setLevel(logging.INFO)
    handler.log_message("%s %s", "never", object())  # a bad format would raise if formatted
    handler.log_message("%d", "not a number")  # formatted only for a reader
    assert not caplog.records
    handler.logger.setLevel(logging.DEBUG)
    with caplog.at_level(logging.DEBUG, logger="defrag.test.httpserve"):
        handler.log_message('"%s" %s %s', "POST /filter HTTP/1.1", "200", "-")
    assert [r.getMessage() for r in caplog.records] == ['127.0.0.1 "POST /filter HTTP/1.1" 200 -']
