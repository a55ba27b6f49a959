"""PrometheusSource.ask_all: several queries in flight at once, answered in the order asked."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from defrag.adapters.deadline import time_budget
from defrag.adapters.prometheus import PrometheusSource, PrometheusUnreachable, PromQLError
from defrag.ports import ConcurrentMetricsSource, Query

AT = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def url() -> Iterator[str]:
    """Answers ``n<k>`` with a vector of value k; ``meet<k>`` only once another ``meet``
    query is in flight too (a barrier of 2); ``bad<k>`` with Prometheus's 400 for bad PromQL
    (web/api/v1/api.go: status error, errorType bad_data); ``sleep`` after 2 s."""
    meet = threading.Barrier(2, timeout=5)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query)["query"][0]
            status, body = 200, {"status": "success"}
            if query.startswith("meet"):
                meet.wait()
            if query == "sleep":
                time.sleep(2)
            if query.startswith("bad"):
                status = 400
                body = {"status": "error", "errorType": "bad_data", "error": f"{query} is bad"}
            else:
                value = query.lstrip("nmetslp") or "0"
                body["data"] = {
                    "resultType": "vector",
                    "result": [{"metric": {"q": query}, "value": [AT.timestamp(), value]}],
                }
            data = json.dumps(body).encode()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # shut at a deadline
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_queries_are_in_flight_together_and_answered_in_the_order_asked(url: str) -> None:
    source = PrometheusSource(url, retries=0, timeout_s=10)
    assert isinstance(source, ConcurrentMetricsSource)
    # meet1 and meet2 are answered only while both are in flight: asked one after another,
    # the first would wait on the barrier until it broke
    answers = source.ask_all([Query(q, AT) for q in ("n3", "meet1", "meet2", "n4")])
    assert [a[0].labels["q"] for a in answers] == ["n3", "meet1", "meet2", "n4"]
    assert [a[0].last for a in answers] == [3.0, 1.0, 2.0, 4.0]


def test_the_first_failure_in_the_order_asked_raises(url: str) -> None:
    source = PrometheusSource(url, retries=0, timeout_s=10)
    with pytest.raises(PromQLError, match="bad1 is bad"):
        source.ask_all([Query("n1", AT), Query("bad1", AT), Query("bad2", AT)])


def test_the_callers_budget_bounds_every_query(url: str) -> None:
    # a worker thread has no budget of its own: ask_all carries the caller's into it, so the
    # budget (0.5 s), not the query's own 10 s, is what ends the slow query
    source = PrometheusSource(url, retries=0, timeout_s=10)
    with (
        time_budget(0.5, "the detection cycle's budget"),
        pytest.raises(PrometheusUnreachable, match="before the detection cycle's budget"),
    ):
        source.ask_all([Query("n1", AT), Query("sleep", AT)])
