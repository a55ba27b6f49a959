"""QuietHandler.parse_request: a plain header block parsed without the email package gives the
standard library's request, field for field, on random requests (plain and not)."""

from __future__ import annotations

import io
from http.server import BaseHTTPRequestHandler
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from defrag.adapters.httpserve import QuietHandler, simple_headers

GO_CLIENT = (
    b"POST /filter HTTP/1.1\r\nHost: 127.0.0.1:8888\r\nUser-Agent: Go-http-client/1.1\r\n"
    b"Content-Length: 2\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n{}"
)


def _described(message: Any) -> Any:
    """A parsed message as plain values: its attributes, the parts of its payload described in
    turn, its defects by type (the email parser's parts and defects are instances, equal only
    to themselves)."""
    if not hasattr(message, "defects"):
        return message
    out = {**vars(message), "policy": type(message.policy).__name__}
    out["defects"] = [type(d).__name__ for d in message.defects]
    if isinstance(message._payload, list):
        out["_payload"] = [_described(part) for part in message._payload]
    return out


def _parsed(cls: type[BaseHTTPRequestHandler], data: bytes, protocol: str) -> dict[str, Any]:
    """What ``cls``'s parse_request makes of ``data`` (request line first)."""
    handler = cls.__new__(cls)  # no socket: only what parsing reads and writes
    handler.rfile = io.BufferedReader(io.BytesIO(data))  # type: ignore[arg-type]
    handler.wfile = io.BytesIO()
    handler.client_address = ("127.0.0.1", 40000)
    handler.protocol_version = protocol
    handler.date_time_string = lambda timestamp=None: "Fri, 04 Dec 2026 20:00:00 GMT"  # type: ignore[method-assign]
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    handler.raw_requestline = handler.rfile.readline(65537)
    ok = handler.parse_request()
    got: dict[str, Any] = {
        "ok": ok,
        "command": handler.command,
        "path": getattr(handler, "path", None),
        "version": handler.request_version,
        "close": handler.close_connection,
        "written": handler.wfile.getvalue(),  # type: ignore[attr-defined]
    }
    headers = getattr(handler, "headers", None)
    got["headers"] = None if headers is None else _described(headers)
    if ok:  # after a refusal the connection is closed: what is left unread is never read
        got["rest"] = handler.rfile.read()
    return got


_TOKEN = st.text("abcxyzABCXYZ0123456789-!#$%&'*+.^_`|~", min_size=1, max_size=12)
_ODD_NAME = st.text("ab \t:\x80\xff\x7f\x00-", min_size=0, max_size=6)
_PLAIN_VALUE = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.just("\t"), max_size=40
)
_ODD_VALUE = st.text(
    st.sampled_from(["a", " ", "\t", "\r", "\n", "\x0b", "\x0c", "\x1c", "\x85", "\xe9", ":"]),
    max_size=10,
)
_NAMES = ["Host", "Connection", "Expect", "Content-Type", "Content-Length", "Transfer-Encoding"]
_KNOWN_VALUES = [
    "close",
    "keep-alive",
    "Keep-Alive",
    "100-continue",
    "multipart/mixed",
    "message/rfc822",
    "Message/Partial; x=1",
    "x",
]


@st.composite
def _line(draw: st.DrawFn, plain: bool) -> bytes:
    kind = 0 if plain else draw(st.integers(0, 9))
    if kind <= 5:
        name = draw(_TOKEN | st.sampled_from(_NAMES))
        value = draw(_PLAIN_VALUE | st.sampled_from(_KNOWN_VALUES))
        text = f"{name}:{draw(st.sampled_from(['', ' ', '  ', chr(9)]))}{value}\r\n"
    elif kind == 6:  # a folded line, a bare LF end, a line with no colon
        text = draw(st.sampled_from([" folded\r\n", "\tmore\r\n", "Name: v\n", "nocolon\r\n"]))
    elif kind == 7:
        text = f"{draw(_ODD_NAME)}: {draw(_PLAIN_VALUE)}\r\n"
    else:
        text = f"{draw(_TOKEN)}: {draw(_ODD_VALUE)}\r\n"
    return text.encode("latin-1")


@st.composite
def _request(draw: st.DrawFn) -> bytes:
    line = draw(
        st.sampled_from(
            [
                b"POST /filter HTTP/1.1\r\n",
                b"GET /metrics HTTP/1.0\r\n",
                b"GET //x HTTP/1.1\r\n",
                b"POST /filter\r\n",  # HTTP/0.9 allows GET only
                b"GET /healthz\r\n",
                b"POST /filter HTTP/2.0\r\n",
                b"BAD\r\n",
                b"POST /a HTTP/1.x\r\n",
            ]
        )
    )
    plain = draw(st.booleans())  # every line plain and the block whole: the fast path's
    count = draw(st.one_of(st.integers(0, 8), st.integers(97, 101)))
    lines = draw(st.lists(_line(plain), min_size=min(count, 8), max_size=min(count, 8)))
    if count > 8:  # near http.client's limit of headers
        lines += [f"X-N{i}: v\r\n".encode() for i in range(count - len(lines))]
    end = b"\r\n" if plain else draw(st.sampled_from([b"\r\n", b"\n", b""]))
    body = draw(st.binary(max_size=20))
    return line + b"".join(lines) + end + body


@settings(max_examples=400, deadline=None)
@given(data=_request(), protocol=st.sampled_from(["HTTP/1.1", "HTTP/1.0"]))
@example(data=GO_CLIENT, protocol="HTTP/1.1")
@example(data=b"POST /f HTTP/1.1\r\nExpect: 100-continue\r\n\r\nbody", protocol="HTTP/1.1")
@example(data=b"POST /f HTTP/1.1\r\nConnection: close\r\n\r\n", protocol="HTTP/1.1")
@example(data=b"GET /f HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", protocol="HTTP/1.1")
@example(data=b"POST /f HTTP/1.1\r\nContent-Type: multipart/form-data\r\n\r\n", protocol="HTTP/1.1")
@example(data=b"POST /f HTTP/1.1\r\nContent-type: message/rfc822\r\n\r\n", protocol="HTTP/1.1")
def test_parse_request_is_the_standard_librarys(data: bytes, protocol: str) -> None:
    assert _parsed(QuietHandler, data, protocol) == _parsed(BaseHTTPRequestHandler, data, protocol)


def test_a_go_clients_headers_are_parsed_without_the_email_package() -> None:
    block = GO_CLIENT.split(b"\r\n", 1)[1]
    parsed = simple_headers(block)
    assert parsed is not None
    message, size = parsed
    assert block[size:] == b"{}"
    assert message.items() == [
        ("Host", "127.0.0.1:8888"),
        ("User-Agent", "Go-http-client/1.1"),
        ("Content-Length", "2"),
        ("Content-Type", "application/json"),
        ("Accept-Encoding", "gzip"),
    ]


def test_a_block_not_all_read_or_not_plain_goes_to_the_standard_parser() -> None:
    assert simple_headers(b"Host: a\r\nUser-Agent: Go") is None  # the rest still to come
    assert simple_headers(b"Host: a\r\n folded\r\n\r\n") is None
    assert simple_headers(b"Host: caf\xc3\xa9\r\n\r\n") is None
    assert simple_headers(b"Host: a\nX: b\r\n\r\n") is None
    assert simple_headers(b"Content-Type: message/rfc822\r\n\r\n") is None
    assert simple_headers(b"".join(b"X-%d: v\r\n" % i for i in range(99)) + b"\r\n") is not None
    assert simple_headers(b"".join(b"X-%d: v\r\n" % i for i in range(100)) + b"\r\n") is None
