"""Servers that answer too slowly or not at all, over HTTP or HTTPS, for the deadline tests
(issue 27): what a user's ``defrag detect``, ``report``, ``plan`` and ``run --once`` meet when
Prometheus, the API server or Alertmanager is wedged.

:class:`SlowServer` listens on 127.0.0.1 and answers every request by its ``kind``:

- ``trickle``: status line and headers at once (``Connection: close``, the case http.client
  hands the socket to the response), then the body one byte every ``interval_s``;
- ``trickle-keepalive``: the same on a kept-alive HTTP/1.1 connection;
- ``hang``: reads the request and never answers;
- ``headers-then-close``: status line and headers (a ``Content-Length``), then closes;
- ``close-mid-body``: half of the body, then closes.

The body is ``body``, or, with ``upstream`` (e.g. the API emulator, tests/support/kubeapi.py),
the upstream's own answer to the same request: the server is then a proxy that trickles (or
drops) real answers. ``tls`` (from :func:`self_signed`) serves HTTPS with that certificate.

Bounded: every connection's thread waits on one event that :meth:`SlowServer.stop` sets (and
the server stops by itself after ``lifetime_s``), so nothing outlives a test.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from tests.support.binaries import free_port

Kind = Literal["trickle", "trickle-keepalive", "hang", "headers-then-close", "close-mid-body"]
KINDS: tuple[Kind, ...] = (
    "trickle",
    "trickle-keepalive",
    "hang",
    "headers-then-close",
    "close-mid-body",
)
EMPTY_VECTOR = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


@dataclass(frozen=True, slots=True)
class Tls:
    """A self-signed certificate for 127.0.0.1: ``cert`` is its own CA bundle."""

    cert: Path
    key: Path


def self_signed(folder: Path) -> Tls:
    """A certificate and key for 127.0.0.1 made with the ``openssl`` command line."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
            "-addext", "basicConstraints=critical,CA:TRUE",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return Tls(cert, key)


class SlowServer:
    """See the module's docstring. ``url`` has no credentials; :meth:`url_with` adds some."""

    def __init__(
        self,
        kind: Kind,
        *,
        interval_s: float = 2.0,
        body: bytes = EMPTY_VECTOR,
        tls: Tls | None = None,
        upstream: str | None = None,
        lifetime_s: float = 300.0,
    ) -> None:
        self.kind = kind
        self.interval_s = interval_s
        self.body = body
        self.upstream = upstream
        self.port = free_port()
        self.scheme = "https" if tls else "http"
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"
        self.requests = 0
        self._ctx: ssl.SSLContext | None = None
        if tls is not None:
            self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._ctx.load_cert_chain(tls.cert, tls.key)
        self._stop = threading.Event()
        self._lifetime_s = lifetime_s
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, name="slow-server", daemon=True)

    def url_with(self, userinfo: str) -> str:
        return f"{self.scheme}://{userinfo}@127.0.0.1:{self.port}"

    def __enter__(self) -> SlowServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            for conn in list(self._open):
                with suppress(OSError):
                    conn.close()
        with suppress(OSError):
            self._listener.close()

    # --- internals ---------------------------------------------------------------------------

    def _serve(self) -> None:
        end = time.monotonic() + self._lifetime_s
        while not self._stop.is_set() and time.monotonic() < end:
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._open.add(conn)
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()
        self._stop.set()

    def _connection(self, raw: socket.socket) -> None:
        conn = raw
        try:
            raw.settimeout(10)
            if self._ctx is not None:
                conn = self._ctx.wrap_socket(raw, server_side=True)
            while not self._stop.is_set():
                request = _read_request(conn)
                if request is None:
                    return
                with self._lock:
                    self.requests += 1
                if not self._answer(conn, request):
                    return
        except (OSError, ssl.SSLError, ValueError):
            return
        finally:
            with self._lock:
                self._open.discard(raw)
            with suppress(OSError):
                conn.close()

    def _answer(self, conn: socket.socket, request: _Request) -> bool:
        """Answer one request; True when the connection is kept for another."""
        if self.kind == "hang":
            self._stop.wait()
            return False
        status, ctype, body = self._upstream(request) if self.upstream else (200, "", self.body)
        keep = self.kind == "trickle-keepalive"
        head = (
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
            f"Content-Type: {ctype or 'application/json'}\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
        ).encode()
        conn.sendall(head)
        if self.kind == "headers-then-close":
            return False
        if self.kind == "close-mid-body":
            conn.sendall(body[: len(body) // 2])
            return False
        for i in range(len(body)):
            if self._stop.wait(self.interval_s if i else 0):
                return False
            conn.sendall(body[i : i + 1])
        return keep

    def _upstream(self, request: _Request) -> tuple[int, str, bytes]:
        assert self.upstream is not None
        where = urlsplit(self.upstream)
        client = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
            client.request(request.method, request.target, body=request.body, headers=headers)
            answer = client.getresponse()
            return answer.status, answer.getheader("Content-Type") or "", answer.read()
        finally:
            client.close()


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


def _read_request(conn: socket.socket) -> _Request | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
        if len(data) > 1 << 20:
            raise ValueError("request head too large")
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip()] = value.strip()
    length = int(next((v for k, v in headers.items() if k.lower() == "content-length"), "0"))
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return _Request(method, target, headers, rest[:length])
