"""A Prometheus that misbehaves on demand, for the fault tests (issue 15, items 3 and 4).

``BrokenPrometheus`` listens on 127.0.0.1 and answers ``/api/v1/query`` and
``/api/v1/query_range`` according to its current :class:`Fault`, which a test may change
between requests:

- ``ok``: passes the request to ``upstream`` (a real Prometheus, tests/support/prometheus.py)
  and returns its answer unchanged, or, without one, an empty vector;
- ``trickle``: status line and headers at once, then a body of ``trickle_bytes`` bytes, one
  byte every ``interval_s`` (each socket read succeeds, the answer never ends in time);
- ``trickle-headers``: the status line and headers themselves one byte at a time;
- ``hang``: reads the request and never answers;
- ``status``: answers ``status`` with ``body`` (Prometheus's error JSON by default);
- ``body``: answers 200 with ``body`` as it is (wrong JSON shapes, HTML, nothing);
- ``refused``: :meth:`BrokenPrometheus.stop` closes the listening socket, so connecting is
  refused; :meth:`start` listens on the same port again.

The wire format of the good and the error answers is Prometheus's HTTP API
(prometheus/prometheus docs/querying/api.md, "Format overview": ``{"status": "success",
"data": {"resultType": …, "result": …}}``; errors ``{"status": "error", "errorType": …,
"error": …}``). Every handler thread stops when the server closes (trickles wait on an event),
so nothing outlives a test.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

from tests.support.binaries import free_port

EMPTY_VECTOR = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}})
ERROR_500 = json.dumps({"status": "error", "errorType": "internal", "error": "storage is on fire"})


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str = "ok"
    status: int = 500
    body: str = ERROR_500
    interval_s: float = 2.0
    trickle_bytes: int = 1000


class BrokenPrometheus:
    """The misbehaving server; ``url`` is stable across stop/start (same port)."""

    def __init__(self, fault: Fault | None = None, upstream: str | None = None) -> None:
        self.fault = fault or Fault()
        self.upstream = upstream.rstrip("/") if upstream else None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests = 0
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._active = 0
        self._connections: set[socket.socket] = set()
        self._idle = threading.Condition()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no answer is in progress (a trickle ends when its client has gone)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout_s)

    def set(self, fault: Fault) -> None:
        self.fault = fault

    def start(self) -> None:
        if self._server is not None:
            return
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with owner._idle:
                    owner._connections.add(self.connection)

            def finish(self) -> None:
                with owner._idle:
                    owner._connections.discard(self.connection)
                with suppress(OSError):
                    super().finish()

            def do_GET(self) -> None:
                with owner._idle:
                    owner.requests += 1
                    owner._active += 1
                try:
                    owner._answer(self)
                finally:
                    with owner._idle:
                        owner._active -= 1
                        owner._idle.notify_all()

            do_POST = do_GET

            def log_message(self, *args: Any) -> None:
                return None

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self._closing.clear()
        threading.Thread(target=server.serve_forever, name="broken-prom", daemon=True).start()
        self._server = server

    def stop(self) -> None:
        """Close the listening socket and every open connection, ending the answers in
        progress (connections refused from now on)."""
        if self._server is None:
            return
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        with self._idle:  # a stopped Prometheus closes its kept-alive connections too
            for conn in self._connections:
                with suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    # --- answering ---------------------------------------------------------------------

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        fault = self.fault
        if fault.kind == "ok":
            status, body = self._upstream(h.path)
            self._send(h, status, body)
        elif fault.kind == "status":
            self._send(h, fault.status, fault.body)
        elif fault.kind == "body":
            self._send(h, 200, fault.body)
        elif fault.kind == "hang":
            self._closing.wait()
            h.close_connection = True
        elif fault.kind == "trickle":
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(fault.trickle_bytes))
            h.end_headers()
            self._trickle(h, b" " * fault.trickle_bytes, fault.interval_s)
        elif fault.kind == "trickle-headers":
            head = (
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + "X-Slow: "
                + "x" * fault.trickle_bytes
                + "\r\n\r\n"
            )
            self._trickle(h, head.encode(), fault.interval_s)
        else:
            raise ValueError(f"unknown fault {fault.kind!r}")

    def _trickle(self, h: BaseHTTPRequestHandler, data: bytes, interval_s: float) -> None:
        h.close_connection = True
        for i in range(len(data)):
            try:
                h.wfile.write(data[i : i + 1])
                h.wfile.flush()
            except OSError:
                return  # the client gave up: what the deadline is for
            if self._closing.wait(interval_s):
                return

    def _upstream(self, path: str) -> tuple[int, str]:
        if self.upstream is None:
            return 200, EMPTY_VECTOR
        response = requests.get(self.upstream + path, timeout=30)
        return response.status_code, response.text

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: str) -> None:
        data = body.encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        with suppress(OSError):
            h.wfile.write(data)


@contextmanager
def broken_prometheus(
    fault: Fault | None = None, upstream: str | None = None
) -> Iterator[BrokenPrometheus]:
    server = BrokenPrometheus(fault, upstream)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def refused_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
