"""The extender's HTTP server: the verbs, health and metrics, bounded against any client."""

from __future__ import annotations

import logging
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from defrag.adapters import jsonio
from defrag.adapters.health import Probes, probe_answer
from defrag.adapters.httpserve import BoundedHandler, BoundedHTTPServer, ServerLimits
from defrag.extender.state import ClusterCache, StateUnavailable
from defrag.extender.verbs import Extender
from defrag.extender.wire import (
    BODY_BUDGET_BYTES,
    MAX_BODY_BYTES,
    VERBS,
    BadRequest,
    parse_args,
)
from defrag.model.status import Status
from defrag.ports import ClusterSource
from defrag.scoring.profile import ProfileConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ExtenderMetrics:
    registry: CollectorRegistry
    requests: Counter
    seconds: Histogram
    relists: Counter
    relist_seconds: Gauge
    state_age: Gauge
    closed: Counter
    fresh: Counter
    _children: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)
    """The labelled series looked up so far: a request counts in two of them, and finding a
    series by its labels builds its key and takes the metric's lock each time."""

    @classmethod
    def create(cls, cache: ClusterCache | None = None) -> ExtenderMetrics:
        registry = CollectorRegistry()
        metrics = cls(
            registry=registry,
            requests=Counter(
                "defrag_extender_requests",
                "Extender requests by verb and HTTP status code.",
                ["verb", "code"],
                registry=registry,
            ),
            seconds=Histogram(
                "defrag_extender_request_seconds",
                "Time to answer one extender request.",
                ["verb"],
                buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                registry=registry,
            ),
            relists=Counter(
                "defrag_extender_relists",
                "Cluster relists (watched: view builds) by result (ok, failed).",
                ["result"],
                registry=registry,
            ),
            relist_seconds=Gauge(
                "defrag_extender_relist_seconds",
                "Duration of the last cluster relist (watched: view build).",
                registry=registry,
            ),
            state_age=Gauge(
                "defrag_extender_state_age_seconds",
                "Seconds since the cluster state was last known current (watched: 0 while the "
                "watches are connected and the view has every change).",
                registry=registry,
            ),
            closed=Counter(
                "defrag_extender_connections_closed",
                "Connections closed by the server: idle (keep-alive idle timeout), read-timeout "
                "(a request not in within the read deadline), busy (connection pool full).",
                ["reason"],
                registry=registry,
            ),
            fresh=Counter(
                "defrag_extender_fresh_answers",
                "Watched: requests that wanted every change the store held (filter), by how "
                "they were answered: current (the view had them), ahead (the view with the "
                "pending pod changes applied, no build awaited), waited (for a build).",
                ["how"],
                registry=registry,
            ),
        )
        if cache is not None:

            def age() -> float:
                age = cache.state_age()
                return age if age != float("inf") else float("nan")

            metrics.state_age.set_function(age)
        return metrics

    def observe_fresh(self, how: str) -> None:
        self._child(self.fresh, how).inc()

    def observe_request(self, verb: str, code: int, seconds: float) -> None:
        """One answer of ``verb`` with HTTP status ``code``, ``seconds`` after it came."""
        self._child(self.requests, verb, str(code)).inc()
        self._child(self.seconds, verb).observe(seconds)

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:  # two threads may both look it up: labels() gives both the same
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_relist(self, status: Status, seconds: float) -> None:
        self.relists.labels(result="ok" if status.ok else "failed").inc()
        self.relist_seconds.set(seconds)


class BodyBudget:
    """Body bytes held at once, all requests together: a request waits (at most ``wait_s``)
    until its body fits before reading it, so N concurrent huge bodies queue, not pile up."""

    def __init__(self, capacity: int, wait_s: float) -> None:
        self.capacity = capacity
        self.wait_s = wait_s
        self.used = 0
        self._cond = threading.Condition()

    def acquire(self, n: int) -> bool:
        """Take ``n`` bytes (a body alone may always take up to the whole capacity)."""
        n = min(n, self.capacity)
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            while self.used and self.used + n > self.capacity:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            self.used += n
            return True

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= min(n, self.capacity)
            self._cond.notify_all()


class _Handler(BoundedHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: kube-scheduler reuses its connections
    # Headers and body are separate writes: with Nagle on, the client's delayed ACK adds ~40 ms.
    disable_nagle_algorithm = True
    server: ExtenderHTTPServer
    logger = log

    _metered: str | None = None
    """The verb of the POST being answered: counted just before its answer is written, so a
    client that reads the answer and then asks /metrics always sees it counted."""
    _started: float = 0.0

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        verb, self._metered = self._metered, None
        if verb is not None:
            self.server.metrics.observe_request(verb, code, time.perf_counter() - self._started)
        self.send_body(code, body, content_type)

    def _json(self, code: int, data: Any) -> None:
        self._send(code, jsonio.dumps(data))

    def do_GET(self) -> None:
        self._metered = None
        self.request_read()
        answer = probe_answer(self.path, self.server.probes)
        if answer is None:
            self._json(404, {"Error": f"no such path {self.path.split('?', 1)[0]}"})
        else:
            self._send(answer.code, answer.body, answer.content_type)

    def do_POST(self) -> None:
        verb = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        self._started = time.perf_counter()
        self._metered = verb if verb in VERBS else None
        self._answer(verb)

    def _answer(self, verb: str) -> int:
        if verb not in VERBS:
            self.request_read()
            self.close_connection = True  # its body is not read: the connection cannot go on
            self._json(404, {"Error": f"unknown verb {verb!r}; served: {', '.join(VERBS)}"})
            return 404
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        length = self._content_length()
        if not chunked and (length is None or length > self.server.max_body_bytes):
            self.request_read()
            self.close_connection = True
            limit = self.server.max_body_bytes // 2**20
            self._json(
                400,
                {"Error": f"a body (Content-Length or chunked) of at most {limit} MiB is required"},
            )
            return 400
        budget = self.server.body_budget
        held = self.server.max_body_bytes if chunked else (length or 0)
        self.request_read()  # the headers are in; waiting for room is not the client's delay
        if not budget.acquire(held):
            # Read the body away (a chunk at a time, under the read deadline) so the client can
            # read the 503 instead of hitting a reset while it still sends.
            self.reading()
            drained = not chunked and self._discard(length or 0)
            self.request_read()
            self.close_connection = not drained
            self._json(503, {"Error": "server busy: too many large bodies in flight; retry"})
            return 503
        try:
            return self._answer_body(verb, chunked, length or 0)
        finally:
            budget.release(held)

    def _content_length(self) -> int | None:
        text = self.headers.get("Content-Length")
        try:
            length = int(text) if text is not None else -1
        except ValueError:
            return None
        return length if length >= 0 else None

    def _answer_body(self, verb: str, chunked: bool, length: int) -> int:
        limit = self.server.max_body_bytes
        self.reading()
        body = self._read_chunked(limit) if chunked else self._read_exact(length)
        self.request_read()
        if body is None:
            self.close_connection = True
            self._json(
                400,
                {"Error": f"body: incomplete, or larger than {limit // 2**20} MiB (chunked)"},
            )
            return 400
        extender = self.server.extender
        try:
            args = parse_args(body)
            if verb == "filter":
                body_out = jsonio.dumps(extender.filter(args))
            else:
                body_out = extender.prioritize_body(args)
        except BadRequest as exc:
            self._json(400, {"Error": str(exc)})
            return 400
        except StateUnavailable as exc:
            self._json(503, {"Error": f"defrag extender not ready: {exc}"})
            return 503
        except Exception as exc:  # never let one request take the server down
            log.exception("extender %s failed", verb)
            self._json(500, {"Error": f"internal error: {type(exc).__name__}: {exc}"})
            return 500
        self._send(200, body_out)
        return 200

    def _discard(self, length: int) -> bool:
        """Read ``length`` bytes and drop them; False if the client stopped short."""
        left = length
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 16))
            if not chunk:
                return False
            left -= len(chunk)
        return True

    def _read_exact(self, length: int) -> bytearray | None:
        """``length`` bytes into one buffer (no intermediate copies), or None if cut short."""
        buf = bytearray(length)
        view = memoryview(buf)
        got = 0
        while got < length:
            n = self.rfile.readinto(view[got:])
            if not n:
                return None
            got += n
        return buf

    def _read_chunked(self, limit: int) -> bytes | None:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024).split(b";", 1)[0].strip()
            try:
                size = int(line, 16)
            except ValueError:
                return None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            total += size
            if size < 0 or total > limit:
                return None
            chunk = self.rfile.read(size)
            if len(chunk) != size:
                return None
            parts.append(chunk)
            self.rfile.readline(8)  # the CRLF after each chunk


class _StatusHandler(_Handler):
    """Only ``GET /healthz``, ``/readyz`` and ``/metrics``: the address that kubelet probes and
    Prometheus reach, while ``filter`` and ``prioritize`` stay on the loopback address that the
    kube-scheduler beside the extender calls (deploy/components/extender)."""

    def do_POST(self) -> None:
        self.request_read()
        self.close_connection = True  # its body is not read: the connection cannot go on
        self._json(404, {"Error": "this address serves only GET /healthz, /readyz and /metrics"})


class ExtenderHTTPServer(BoundedHTTPServer):
    logger = log

    def __init__(
        self,
        address: tuple[str, int],
        extender: Extender,
        metrics: ExtenderMetrics,
        limits: ServerLimits | None = None,
        *,
        handler: type[_Handler] = _Handler,
        max_body_bytes: int = MAX_BODY_BYTES,
        body_budget_bytes: int = BODY_BUDGET_BYTES,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(address, handler, limits)
        self.extender = extender
        self.metrics = metrics
        self.probes = Probes.of_registry(metrics.registry, ready=extender.cache.readiness)
        self.max_body_bytes = max_body_bytes
        self.body_budget = BodyBudget(max(body_budget_bytes, 1), wait_s=self.limits.read_timeout_s)
        self.scheme = "http"
        if tls is not None:
            # The handshake runs in the connection's thread (BoundedHandler.setup), under the
            # read deadline, never in the accept loop.
            self.socket = tls.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )
            self.scheme = "https"

    def count_closed(self, reason: str) -> None:
        super().count_closed(reason)
        self.metrics.closed.labels(reason=reason).inc()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"{self.scheme}://{host!s}:{port}"


def tls_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2+) from PEM files, as kube-scheduler's ``enableHTTPS``
    extender config expects; :class:`ssl.SSLError`/:class:`OSError` name a bad file."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert_file), str(key_file))
    return context


def serve(
    source: ClusterSource,
    *,
    profile: ProfileConfig = ProfileConfig(),
    host: str = "0.0.0.0",
    port: int = 8888,
    relist_interval_s: float = 10.0,
    max_staleness_s: float = 120.0,
    limits: ServerLimits | None = None,
    tls: ssl.SSLContext | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> ExtenderHTTPServer:
    """Build the cache, the extender and the server, relist once and start relisting.

    The caller runs ``server.serve_forever()`` (or a thread of it) and ``server.shutdown()``.
    """
    cache = ClusterCache(
        source, profile, relist_interval_s=relist_interval_s, max_staleness_s=max_staleness_s
    )
    metrics = ExtenderMetrics.create(cache)
    cache.on_relist = metrics.observe_relist
    cache.on_fresh = metrics.observe_fresh
    server = ExtenderHTTPServer(
        (host, port),
        Extender(cache),
        metrics,
        limits,
        max_body_bytes=max_body_bytes,
        body_budget_bytes=max(max_body_bytes, BODY_BUDGET_BYTES),
        tls=tls,
    )
    cache.start()
    return server


def serve_status(server: ExtenderHTTPServer, host: str, port: int) -> ExtenderHTTPServer:
    """A second server for ``server``'s probes and metrics only (same cache, same registry).

    The caller runs its ``serve_forever()`` and, when done, ``shutdown()`` and
    ``server_close()``; :func:`stop` on the main server stops the shared cache.
    """
    return ExtenderHTTPServer(
        (host, port), server.extender, server.metrics, server.limits, handler=_StatusHandler
    )


def stop(server: ExtenderHTTPServer) -> None:
    """Stop relisting and close the socket (after ``shutdown()`` if it was serving)."""
    server.extender.cache.stop()
    server.server_close()
