"""The one health/metrics answer (defrag/adapters/health.py) shared by the daemon, the
extender and the node agent: every probe path, a failing status, an unknown path."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Gauge

from defrag.adapters.health import HealthServer, Probes, probe_answer
from defrag.model.status import Status


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("defrag_probe_test", "A gauge for the probe test.", registry=registry).set(3)
    return registry


DOWN = Status.fail("a cycle has been running for 900 s", "rule leak could not be evaluated")


@pytest.mark.parametrize(
    ("path", "live", "ready", "code", "body"),
    [
        ("/healthz", Status.success(), DOWN, 200, "ok\n"),
        ("/healthz", DOWN, Status.success(), 503, f"{DOWN}\n"),
        ("/readyz", Status.success(), Status.success(), 200, "ok\n"),
        ("/readyz?verbose=1", Status.success(), DOWN, 503, f"{DOWN}\n"),  # query ignored
        ("/metrics", DOWN, DOWN, 200, "defrag_probe_test 3.0"),  # metrics even when not ready
    ],
)
def test_probe_answers(path: str, live: Status, ready: Status, code: int, body: str) -> None:
    probes = Probes.of_registry(_registry(), live=lambda: live, ready=lambda: ready)
    answer = probe_answer(path, probes)
    assert answer is not None
    assert answer.code == code
    assert body in answer.body.decode()


@pytest.mark.parametrize("path", ["/", "/filter", "/healthz/extra", "/metric"])
def test_other_paths_are_not_probes(path: str) -> None:
    assert probe_answer(path, Probes.of_registry(_registry())) is None


def test_health_server_serves_the_answers_over_http() -> None:
    ready = [DOWN]
    probes = Probes.of_registry(_registry(), ready=lambda: ready[0])

    def get(url: str) -> tuple[int, str, str]:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, resp.headers["Content-Type"], resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.headers["Content-Type"], err.read().decode()

    with HealthServer(("127.0.0.1", 0), probes).start() as server:
        assert get(server.url + "/readyz")[:2] == (503, "text/plain; charset=utf-8")
        ready[0] = Status.success()  # the probe is asked on every request, never cached
        assert get(server.url + "/readyz") == (200, "text/plain; charset=utf-8", "ok\n")
        code, ctype, body = get(server.url + "/metrics")
        assert (code, ctype.split(";")[0]) == (200, "text/plain")
        assert "defrag_probe_test 3.0" in body
        code, _, body = get(server.url + "/nope")
        assert code == 404 and "/healthz, /readyz, /metrics" in body


def test_metrics_carry_the_build_info() -> None:
    """``defrag_build_info{version,revision,python,allocator} 1`` on /metrics, after the
    process's own series, whichever process answers (they all answer through
    ``probe_answer``)."""
    import platform

    from defrag import __version__
    from defrag.adapters.health import build_info_exposition
    from defrag.adapters.heap import allocators

    registry = CollectorRegistry()
    Gauge("own_series", "a process's own", registry=registry).set(3)
    answer = probe_answer("/metrics", Probes.of_registry(registry))
    assert answer is not None and answer.code == 200
    text = answer.body.decode()
    assert "own_series 3.0" in text
    allocator = str(allocators({}))
    line = (
        f'defrag_build_info{{allocator="{allocator}",python="{platform.python_version()}",'
        f'revision="unknown",version="{__version__}"}} 1.0'
    )
    assert line in text.splitlines() or line in build_info_exposition({}).decode()
    assert allocator.startswith("pymalloc+")
    assert 'allocator="malloc+' in build_info_exposition({"PYTHONMALLOC": "malloc"}).decode()
    assert 'revision="abc1234"' in build_info_exposition({"DEFRAG_REVISION": "abc1234"}).decode()
    assert "defrag_build_info{" in text
