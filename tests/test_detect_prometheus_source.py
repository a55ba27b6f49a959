"""PrometheusSource against a scripted HTTP server: auth header, retries, errors, parsing."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from defrag.adapters.deadline import time_budget
from defrag.adapters.prometheus import (
    MetricsError,
    PrometheusSource,
    PrometheusUnreachable,
    PromQLError,
)
from defrag.ports import ConcurrentMetricsSource, Query

AT = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


class Script:
    """What the server answers next, and what it was asked."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, object]] = []
        self.requests: list[tuple[str, dict[str, list[str]], str | None]] = []
        self.by_query: Callable[[str], tuple[int, object]] | None = None
        """Answers by the query asked instead (requests in flight together)."""


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            script.requests.append(
                (url.path, parse_qs(url.query), self.headers.get("Authorization"))
            )
            if script.by_query is not None:
                status, body = script.by_query(parse_qs(url.query)["query"][0])
            else:
                status, body = script.answers.pop(0) if script.answers else (200, {})
            data = json.dumps(body).encode() if not isinstance(body, bytes) else body
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
    yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    httpd.shutdown()
    httpd.server_close()


def ok(result_type: str, result: object) -> tuple[int, object]:
    return 200, {"status": "success", "data": {"resultType": result_type, "result": result}}


def test_instant_vector_at_a_time_with_bearer_token(
    server: tuple[str, Script], tmp_path: Path
) -> None:
    url, script = server
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    script.answers.append(ok("vector", [{"metric": {"gpu": "0"}, "value": [1772452800, "41.5"]}]))
    samples = PrometheusSource(url, bearer_token_file=token, retries=0).instant("up", AT)
    assert [(dict(s.labels), s.points) for s in samples] == [
        ({"gpu": "0"}, ((1772452800.0, 41.5),))
    ]
    path, params, auth = script.requests[0]
    assert path == "/api/v1/query" and params["query"] == ["up"]
    assert params["time"] == [f"{AT.timestamp():.3f}"]
    assert auth == "Bearer s3cret"
    token.write_text("rotated")  # projected tokens rotate: read on every request
    script.answers.append(ok("vector", []))
    PrometheusSource(url, bearer_token_file=token, retries=0).instant("up", AT)
    assert script.requests[1][2] == "Bearer rotated"


def test_range_matrix_and_scalar(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers.append(ok("matrix", [{"metric": {}, "values": [[1, "1"], [31, "2.5"]]}]))
    [s] = PrometheusSource(url, retries=0).range("x", AT, AT, 30)
    assert s.points == ((1.0, 1.0), (31.0, 2.5))
    assert script.requests[0][1]["step"] == ["30"]
    script.answers.append(ok("scalar", [1772452800, "3"]))
    [scalar] = PrometheusSource(url, retries=0).instant("scalar(3)", AT)
    assert scalar.last == 3.0


def test_bad_promql_carries_prometheus_message(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers.append(
        (400, {"status": "error", "errorType": "bad_data", "error": "1:5: parse error: oops"})
    )
    with pytest.raises(PromQLError) as caught:
        PrometheusSource(url, retries=0).instant("sum(", AT)
    assert caught.value.query == "sum("
    assert caught.value.prometheus_message == "bad_data: 1:5: parse error: oops"
    assert str(caught.value) == "Prometheus rejected query 'sum(': bad_data: 1:5: parse error: oops"


def test_server_errors_are_retried_then_unreachable(server: tuple[str, Script]) -> None:
    url, script = server
    body = {"status": "error", "errorType": "unavailable", "error": "busy"}
    script.answers += [(503, body), (503, body), (503, body)]
    with pytest.raises(PrometheusUnreachable, match="failed query 'up': unavailable: busy"):
        PrometheusSource(url, retries=2, backoff_s=0).instant("up", AT)
    assert len(script.requests) == 3  # the first try and two retries


def test_retry_recovers(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers += [(503, b"down"), ok("vector", [])]
    assert PrometheusSource(url, retries=1, backoff_s=0).instant("up", AT) == []
    assert len(script.requests) == 2


def test_missing_token_file_is_named(server: tuple[str, Script], tmp_path: Path) -> None:
    url, _ = server
    source = PrometheusSource(url, bearer_token_file=tmp_path / "none", retries=0)
    with pytest.raises(MetricsError, match=f"cannot read bearer token file {tmp_path / 'none'}"):
        source.instant("up", AT)


def test_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="must start with http"):
        PrometheusSource("prometheus:9090")


# --- ask_all: several queries in flight at once, answered in the order asked --------------------


def by_query(meet: threading.Barrier) -> Callable[[str], tuple[int, object]]:
    """``n<k>``: a vector of value k; ``meet<k>``: the same, once another ``meet`` query is in
    flight too; ``bad<k>``: Prometheus's 400 for bad PromQL (web/api/v1/api.go: status error,
    errorType bad_data); ``sleep``: after 2 s."""

    def answer(query: str) -> tuple[int, object]:
        if query.startswith("meet"):
            meet.wait()
        if query == "sleep":
            time.sleep(2)
        if query.startswith("bad"):
            return 400, {"status": "error", "errorType": "bad_data", "error": f"{query} is bad"}
        vector = [{"metric": {"q": query}, "value": [AT.timestamp(), query.lstrip("nmetslp")]}]
        return 200, {"status": "success", "data": {"resultType": "vector", "result": vector}}

    return answer


def test_ask_all_has_queries_in_flight_together_answered_in_the_order_asked(
    server: tuple[str, Script],
) -> None:
    url, script = server
    script.by_query = by_query(threading.Barrier(2, timeout=5))
    source = PrometheusSource(url, retries=0, timeout_s=10)
    assert isinstance(source, ConcurrentMetricsSource)
    # meet1 and meet2 are answered only while both are in flight: asked one after another,
    # the first would wait on the barrier until it broke
    answers = source.ask_all([Query(q, AT) for q in ("n3", "meet1", "meet2", "n4")])
    assert [a[0].labels["q"] for a in answers] == ["n3", "meet1", "meet2", "n4"]
    assert [a[0].last for a in answers] == [3.0, 1.0, 2.0, 4.0]


def test_ask_all_raises_the_first_failure_in_the_order_asked(server: tuple[str, Script]) -> None:
    url, script = server
    script.by_query = by_query(threading.Barrier(2, timeout=5))
    source = PrometheusSource(url, retries=0, timeout_s=10)
    with pytest.raises(PromQLError, match="bad1 is bad"):
        source.ask_all([Query("n1", AT), Query("bad1", AT), Query("bad2", AT)])


def test_ask_all_runs_every_query_under_the_callers_budget(server: tuple[str, Script]) -> None:
    # a worker thread has no budget of its own: ask_all carries the caller's into it, so the
    # budget (0.5 s), not the query's own 10 s, is what ends the slow query
    url, script = server
    script.by_query = by_query(threading.Barrier(2, timeout=5))
    source = PrometheusSource(url, retries=0, timeout_s=10)
    with (
        time_budget(0.5, "the detection cycle's budget"),
        pytest.raises(PrometheusUnreachable, match="before the detection cycle's budget"),
    ):
        source.ask_all([Query("n1", AT), Query("sleep", AT)])
