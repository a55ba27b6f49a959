"""A fault proxy in front of the API server, for the chaos soak (``bench/bench_soak.py``).

An HTTP server on 127.0.0.1 that forwards every request to the real API server over HTTPS
(the client's bearer token passes through, so each caller keeps its own identity and RBAC) and,
drawn from a seeded generator, answers some requests itself or spoils them on the way back:

- ``5xx``: a Status JSON body (500, 503 or 504) without forwarding;
- ``429``: API priority-and-fairness throttling (``Retry-After``, no DisruptionBudget cause),
  without forwarding;
- ``latency``: a pause of 0.3–2 s before forwarding;
- ``reset``: forwarded and answered by the API server, then the connection is reset halfway
  through the response body (the client cannot tell whether its request took effect);
- ``trickle``: forwarded and answered by the API server, then the body sent in small pieces
  over 0.3–2 s (each read succeeds, the whole answer is slow);
- ``watch-drop``: a watch stream closed after a moment;
- ``watch-410``: a watch answered with one ``ERROR`` event carrying a 410 Expired Status.

Each injected fault is counted by kind (and by caller, told apart by its bearer token).
Kubeconfigs pointing here say ``server: http://127.0.0.1:PORT``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import select
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

FAULT_KINDS = ("5xx", "429", "latency", "reset", "trickle", "watch-drop", "watch-410")
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
    "content-length",
}


@dataclass
class FaultRates:
    """The chance of each fault per request (watch faults per watch request)."""

    error_5xx: float = 0.05
    throttle_429: float = 0.02
    latency: float = 0.03
    reset: float = 0.02
    watch_drop: float = 0.3
    watch_410: float = 0.1
    eviction_reset: float = 0.15
    """Evictions are the writes that matter: an extra chance of a reset on each."""
    trickle: float = 0.0
    """A slow body (off unless asked: the short soak's seeded draws stay as they were)."""

    @classmethod
    def off(cls) -> FaultRates:
        return cls(0, 0, 0, 0, 0, 0, 0)


def status_body(code: int, reason: str, message: str) -> bytes:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    ).encode()


@dataclass
class FaultProxy:
    upstream: str
    """``https://127.0.0.1:PORT`` of the API server."""
    ca: Path
    seed: int = 0
    rates: FaultRates = field(default_factory=FaultRates)
    enabled: bool = False
    callers: dict[str, str] = field(default_factory=dict)
    """bearer token → caller name (for the counts)."""
    counts: Counter[str] = field(default_factory=Counter)
    by_caller: Counter[tuple[str, str]] = field(default_factory=Counter)
    requests: Counter[str] = field(default_factory=Counter)
    log: list[tuple[float, str, str, str]] = field(default_factory=list)
    """(time, caller, fault kind, request) of every fault injected."""
    request_faults_for: set[str] = field(default_factory=set)
    """The callers whose plain requests get faults (every caller's watches do)."""

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        self._ssl = ssl.create_default_context(cafile=str(self.ca))
        target = urlsplit(self.upstream)
        self._host, self._port = target.hostname or "127.0.0.1", target.port or 443
        self._server: ThreadingHTTPServer | None = None
        self._open: set[socket.socket] = set()

    # --- the server ------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy._handle(self)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a killed client resets its connections: not the proxy's fault

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            daemon=True,
            name="faultproxy",
        ).start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def kubeconfig(self, path: Path, token: str, caller: str) -> Path:
        """A kubeconfig for ``caller`` (a bearer token) that talks to the API through here."""
        self.callers[token] = caller
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": self.url}}],
            "users": [{"name": caller, "user": {"token": token}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": caller}}],
            "current-context": "proxy",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    # --- one request -----------------------------------------------------------------------

    def _draw(self, watch: bool, caller: str, eviction: bool = False) -> str | None:
        if not self.enabled:
            return None
        plain = caller in self.request_faults_for  # others get watch faults only
        if not plain and not watch:
            return None
        r = self.rates
        with self._lock:
            x = self._rng.random()
            if watch:
                y = self._rng.random()
                if y < r.watch_410:
                    return "watch-410"
                if y < r.watch_410 + r.watch_drop:
                    return "watch-drop"
            if not plain:
                return None
            if eviction and self._rng.random() < r.eviction_reset:
                return "reset"
            for kind, p in (
                ("5xx", r.error_5xx),
                ("429", r.throttle_429),
                ("latency", r.latency),
                ("reset", r.reset),
                ("trickle", r.trickle),
            ):
                if x < p:
                    # a reset of a watch is its drop (above), a watch is slow by nature: only
                    # the non-watch path resets or trickles
                    return None if watch and kind in ("reset", "trickle") else kind
                x -= p
        return None

    def _uniform(self, lo: float, hi: float) -> float:
        with self._lock:
            return self._rng.uniform(lo, hi)

    def _count(self, kind: str, caller: str, what: str = "") -> None:
        with self._lock:
            self.counts[kind] += 1
            self.by_caller[(caller, kind)] += 1
            self.log.append((time.time(), caller, kind, what))

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        auth = h.headers.get("Authorization", "")
        caller = self.callers.get(auth.removeprefix("Bearer ").strip(), "other")
        lowered = h.path.lower()
        watch = "watch=1" in lowered or "watch=true" in lowered
        with self._lock:
            self.requests[caller] += 1
        eviction = h.command == "POST" and h.path.split("?")[0].endswith("/eviction")
        fault = self._draw(watch, caller, eviction)
        what = f"{h.command} {h.path.split('?')[0]}"
        if fault is not None and fault != "watch-drop":  # a drop counts when it is done
            self._count(fault, caller, what)
        if fault == "5xx":
            code = self._choice([500, 503, 504])
            reasons = {500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}
            return self._answer(h, code, status_body(code, reasons[code], "injected by faultproxy"))
        if fault == "429":
            body_429 = status_body(
                429, "TooManyRequests", "too many requests, please try again later"
            )
            return self._answer(h, 429, body_429, {"Retry-After": "1"})
        if fault == "watch-410":
            event = {
                "type": "ERROR",
                "object": json.loads(status_body(410, "Expired", "too old resource version")),
            }
            return self._answer(h, 200, json.dumps(event).encode() + b"\n", close=True)
        if fault == "latency":
            time.sleep(self._uniform(0.3, 2.0))
        headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP_BY_HOP}
        conn = http.client.HTTPSConnection(
            self._host, self._port, context=self._ssl, timeout=None if watch else 60
        )
        try:
            conn.request(h.command, h.path, body=body or None, headers=headers)
            upstream = conn.getresponse()
            if watch:
                drop_after = self._uniform(0.5, 5.0) if fault == "watch-drop" else None
                self._stream(h, upstream, caller, drop_after, what)
                return None
            data = upstream.read()
            out = {k: v for k, v in upstream.getheaders() if k.lower() not in HOP_BY_HOP}
            if fault == "reset":
                return self._reset(h, upstream.status, out, data)
            if fault == "trickle":
                return self._trickle(h, upstream.status, out, data)
            return self._answer(h, upstream.status, data, out)
        except (OSError, http.client.HTTPException) as exc:
            with contextlib.suppress(OSError):
                self._answer(h, 502, status_body(502, "BadGateway", f"faultproxy: {exc}"))
            return None
        finally:
            conn.close()

    def _choice(self, options: list[int]) -> int:
        with self._lock:
            return self._rng.choice(options)

    def _answer(
        self,
        h: BaseHTTPRequestHandler,
        code: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        h.send_response(code)
        sent = {k.lower() for k in (headers or {})}
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        if "content-type" not in sent:
            h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        if close:
            h.send_header("Connection", "close")
            h.close_connection = True
        h.end_headers()
        h.wfile.write(body)
        h.wfile.flush()

    def _reset(
        self, h: BaseHTTPRequestHandler, code: int, headers: dict[str, str], data: bytes
    ) -> None:
        """Half the time the answer's headers and half its body, else nothing at all, then a
        TCP reset: either way the API server has acted on the request."""
        if self._uniform(0, 1) < 0.5:
            self._rst(h)
            return
        h.send_response(code)
        for key, value in headers.items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data[: len(data) // 2])
        h.wfile.flush()
        self._rst(h)

    def _trickle(
        self, h: BaseHTTPRequestHandler, code: int, headers: dict[str, str], data: bytes
    ) -> None:
        """The whole answer, its body in up to 20 pieces spread over 0.3-2 s."""
        h.send_response(code)
        for key, value in headers.items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.flush()
        size = max(1, -(-len(data) // 20))
        starts = range(0, len(data), size)
        pause = self._uniform(0.3, 2.0) / max(1, len(starts))
        if not data:
            time.sleep(pause)
        for i in starts:
            time.sleep(pause)
            h.wfile.write(data[i : i + size])
            h.wfile.flush()

    @staticmethod
    def _rst(h: BaseHTTPRequestHandler) -> None:
        sock = h.connection
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        h.close_connection = True

    def _stream(
        self,
        h: BaseHTTPRequestHandler,
        upstream: http.client.HTTPResponse,
        caller: str,
        drop_after: float | None,
        what: str = "",
    ) -> None:
        """Relay a watch, chunk by chunk; closed after ``drop_after`` seconds when given, and
        every 5 s of a long watch, dropped with the ``watch_drop`` chance (while enabled).
        A drop is counted when it is done, not when drawn: a stream that ended first, or
        whose client died first, was never dropped."""
        h.send_response(upstream.status)
        for key, value in upstream.getheaders():
            if key.lower() not in HOP_BY_HOP:
                h.send_header(key, value)
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("Connection", "close")
        h.close_connection = True
        h.end_headers()
        timer: threading.Timer | None = None
        stopped = threading.Event()

        def drop() -> None:
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError, AttributeError):
                upstream.fp.raw._sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]

        def client_gone() -> bool:
            try:
                readable, _, _ = select.select([h.connection], [], [], 0)
                return bool(readable) and h.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        if drop_after is not None:

            def drop_on_time() -> None:
                if stopped.is_set() or client_gone():  # over already, or nobody to tell
                    drop()
                    return
                self._count("watch-drop", caller, what)
                drop()

            # a watch is idle most of the time: a timer drops it on time
            timer = threading.Timer(drop_after, drop_on_time)
        else:

            def maybe_drop() -> None:
                nonlocal timer
                if stopped.is_set():
                    return
                if client_gone():  # its client died (a killed extender): nobody to tell
                    drop()
                    return
                if self.enabled and self._uniform(0, 1) < self.rates.watch_drop / 3:
                    self._count("watch-drop", caller)
                    drop()
                    return
                timer = threading.Timer(5.0, maybe_drop)
                timer.daemon = True
                timer.start()

            timer = threading.Timer(5.0, maybe_drop)
        timer.daemon = True
        timer.start()
        try:
            while True:
                chunk = upstream.read1(65536)
                if not chunk:
                    break
                h.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (OSError, ValueError, http.client.HTTPException):
            pass
        finally:
            stopped.set()
            if timer is not None:
                timer.cancel()
