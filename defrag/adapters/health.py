"""Health and metrics over HTTP: the one place ``/healthz``, ``/readyz`` and ``/metrics`` are
answered, for the daemon, the extender and the node agent alike.

A process hands its :class:`Probes` (liveness, readiness, the metrics exposition) to
:func:`probe_answer`; the answer is the same everywhere: ``200`` with ``ok`` or ``503`` with
the reasons (:class:`~defrag.model.status.Status`) as plain text, and the Prometheus text
format on ``/metrics``. :class:`HealthServer` serves only these three paths (the daemon and the
agent listen with it); the extender answers them on its own bounded server through the same
function, so its probes mean what the others' mean.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from defrag import __version__
from defrag.adapters.heap import allocators
from defrag.adapters.httpserve import QuietHandler, QuietHTTPServer
from defrag.model.status import Status

log = logging.getLogger(__name__)

PROBE_PATHS = ("/healthz", "/readyz", "/metrics")
TEXT = "text/plain; charset=utf-8"


REVISION_ENV = "DEFRAG_REVISION"
"""The source revision the image was built from (the Dockerfile's ``REVISION`` build argument)."""


def build_info_exposition(environ: Mapping[str, str] | None = None) -> bytes:
    """``defrag_build_info{version,revision,python,allocator} 1``: which build answers, on the
    /metrics of every process (the daemon, the extender, the agent); ``allocator`` is Python's and
    the C library's (``pymalloc+glibc`` by default, ``malloc+jemalloc`` with jemalloc preloaded
    under every object: :func:`~defrag.adapters.heap.allocators`)."""
    registry = CollectorRegistry()
    gauge = Gauge(
        "defrag_build_info",
        "Always 1; the labels say which build of defrag this process runs.",
        ["version", "revision", "python", "allocator"],
        registry=registry,
    )
    env = os.environ if environ is None else environ
    revision = env.get(REVISION_ENV) or "unknown"
    gauge.labels(__version__, revision, platform.python_version(), str(allocators(env))).set(1)
    return generate_latest(registry)


BUILD_INFO = build_info_exposition()


def always_ok() -> Status:
    """A probe with nothing to check: the process answers, so it is alive."""
    return Status.success()


@dataclass(frozen=True, slots=True)
class Probes:
    """What a process says about itself: alive, ready, and its metrics."""

    metrics: Callable[[], bytes]
    live: Callable[[], Status] = always_ok
    ready: Callable[[], Status] = always_ok

    @classmethod
    def of_registry(
        cls,
        registry: CollectorRegistry,
        *,
        live: Callable[[], Status] = always_ok,
        ready: Callable[[], Status] = always_ok,
    ) -> Probes:
        return cls(lambda: generate_latest(registry), live, ready)


@dataclass(frozen=True, slots=True)
class Answer:
    code: int
    body: bytes
    content_type: str


def status_answer(status: Status) -> Answer:
    return Answer(200 if status.ok else 503, (str(status) + "\n").encode(), TEXT)


def probe_answer(path: str, probes: Probes) -> Answer | None:
    """The answer to ``GET path`` (query string ignored), or None when it is not a probe."""
    path = path.split("?", 1)[0]
    if path == "/healthz":
        return status_answer(probes.live())
    if path == "/readyz":
        return status_answer(probes.ready())
    if path == "/metrics":
        return Answer(200, probes.metrics() + BUILD_INFO, CONTENT_TYPE_LATEST)
    return None


class _ProbeHandler(QuietHandler):
    server: HealthServer

    def do_GET(self) -> None:
        answer = probe_answer(self.path, self.server.probes)
        if answer is None:
            paths = ", ".join(PROBE_PATHS)
            answer = Answer(404, f"not found; served: GET {paths}\n".encode(), TEXT)
        self.send_body(answer.code, answer.body, answer.content_type)


class HealthServer(QuietHTTPServer):
    """A threading server of :data:`PROBE_PATHS` only; :meth:`start` serves it on a thread."""

    def __init__(
        self, address: tuple[str, int], probes: Probes, *, logger: logging.Logger = log
    ) -> None:
        super().__init__(address, _ProbeHandler)
        self.probes = probes
        self.logger = logger
        self._thread: threading.Thread | None = None

    def start(self, name: str = "defrag-health") -> HealthServer:
        self._thread = threading.Thread(
            target=self.serve_forever, args=(0.2,), name=name, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (when started) and close the socket."""
        if self._thread is not None:
            self.shutdown()
            self._thread = None
        self.server_close()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> HealthServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


__all__ = ["PROBE_PATHS", "Answer", "HealthServer", "Probes", "always_ok", "probe_answer"]
