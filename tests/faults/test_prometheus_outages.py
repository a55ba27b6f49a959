"""Slow, dead and wrong Prometheus servers (issue 15, items 3 and 4): the CLI and the Prometheus
adapter against tests/support/broken_prometheus.py.

Every test says how it failed before the change (commit 9928191, main before h-outage).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.adapters.prometheus import (
    MetricsError,
    PrometheusBadAnswer,
    PrometheusSource,
    PrometheusUnreachable,
)
from defrag.cli import app
from defrag.redact import redact_text, redact_url
from tests.support.broken_prometheus import Fault, broken_prometheus, refused_url

ROOT = Path(__file__).resolve().parents[2]
LEAK_RULE = ROOT / "rules" / "leak.yaml"
SCATTERED = ROOT / "tests" / "fixtures" / "snapshots" / "scattered_20.json"
runner = CliRunner()

SLOW = ["trickle", "trickle-headers", "hang"]


def defrag(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """The real CLI in its own process, killed (and the test failed) past ``timeout_s``."""
    return subprocess.run(
        [sys.executable, "-c", "from defrag.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.parametrize("kind", SLOW)
def test_a_slow_prometheus_cannot_hang_detect(kind: str) -> None:
    """Before: the timeout bounded each socket read, so a server sending one byte every 2 s
    (body or headers) kept ``detect --prom-timeout 3`` waiting for ever (the subprocess timeout
    killed it); now the whole query has a 3 s deadline and the rule is reported failed."""
    with broken_prometheus(Fault(kind, interval_s=2.0)) as prom:
        done = defrag(
            "detect", "--prometheus", prom.url, "--prom-timeout", "3", "-r", str(LEAK_RULE)
        )
    assert done.returncode == 3, done.stderr  # incomplete (docs/cli.md, Exit codes)
    assert "did not answer query" in done.stderr
    assert "within 3 s (the whole request)" in done.stderr
    assert "1 rule(s) could not be evaluated: gpu-memory-leak" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", SLOW)
def test_the_deadline_leaves_no_thread_and_no_connection_behind(kind: str) -> None:
    """Before: no deadline thread existed, and the query never returned. Now the deadline's
    timer is joined when the query ends and the server sees its connection closed."""
    with broken_prometheus(Fault(kind, interval_s=0.2)) as prom:
        source = PrometheusSource(prom.url, timeout_s=1, retries=0)
        with pytest.raises(PrometheusUnreachable, match="within 1 s"):
            source.instant("up")
        assert not [t for t in threading.enumerate() if t.name == "request-deadline"]
        if kind != "hang":  # a trickle notices the closed connection at its next write
            assert prom.wait_idle(timeout_s=30), "the server still writes to the connection"
        source.close()


# Answers that are not what Prometheus's HTTP API sends for a query (docs/querying/api.md):
# the JSON envelope without data.result, a result of the wrong type, points that are not
# numbers, and things that are not JSON at all.
WRONG_SHAPES = {
    "result-object": '{"status":"success","data":{"resultType":"vector","result":{}}}',
    "no-data": '{"status":"success"}',
    "json-list": "[]",
    "json-string": '"ok"',
    "result-null": '{"status":"success","data":{"resultType":"vector","result":null}}',
    "item-string": '{"status":"success","data":{"resultType":"vector","result":["up"]}}',
    "value-short": '{"status":"success","data":{"resultType":"vector",'
    '"result":[{"metric":{},"value":[1]}]}}',
    "value-text": '{"status":"success","data":{"resultType":"matrix",'
    '"result":[{"metric":{},"values":[["x","1"]]}]}}',
    "metric-list": '{"status":"success","data":{"resultType":"vector",'
    '"result":[{"metric":[],"value":[1,"1"]}]}}',
    "html": "<html><body>Sign in</body></html>",
    "empty": "",
}


@pytest.mark.parametrize("name", sorted(WRONG_SHAPES))
def test_a_wrong_shaped_answer_is_a_clear_error(name: str) -> None:
    """Before: the client's ``response.json()["data"]["result"]`` raised KeyError/TypeError
    out of the adapter (``detect -s … --prometheus`` printed a traceback); non-JSON read as
    "unreachable"; a ``null`` result read as no series. Now: PrometheusBadAnswer naming the
    server and the query, and ``detect`` exits 1 with one line per rule, no traceback."""
    with broken_prometheus(Fault("body", body=WRONG_SHAPES[name])) as prom:
        source = PrometheusSource(prom.url, timeout_s=5, retries=0)
        with pytest.raises(PrometheusBadAnswer) as caught:
            source.instant("up")
        message = str(caught.value)
        assert f"Prometheus at {prom.url} answered query 'up'" in message
        assert any(w in message for w in ("wrong shape", "not JSON", "not a Prometheus API"))
        result = runner.invoke(
            app,
            ["detect", "-s", str(SCATTERED), "--prometheus", prom.url, "-r", str(LEAK_RULE)],
        )
    assert result.exit_code == 3, result.output
    assert isinstance(result.exception, SystemExit)
    assert "rule gpu-memory-leak" in result.stderr and "answered query" in result.stderr
    assert "Traceback" not in result.output


def test_server_errors_are_retried_within_the_deadline_then_reported() -> None:
    """Guard (held before too, through urllib3's Retry): a 503 is tried 1 + retries times; a
    500 carries Prometheus's own error message and is not retried."""
    with broken_prometheus(Fault("status", status=503)) as prom:
        source = PrometheusSource(prom.url, timeout_s=10, retries=2, backoff_s=0.05)
        with pytest.raises(PrometheusUnreachable, match="internal: storage is on fire"):
            source.instant("up")
        assert prom.requests == 3
    with broken_prometheus(Fault("status", status=500)) as prom:
        source = PrometheusSource(prom.url, timeout_s=10, retries=2, backoff_s=0.05)
        with pytest.raises(PrometheusUnreachable, match="internal: storage is on fire"):
            source.instant("up")
        assert prom.requests == 1


@pytest.mark.parametrize("kind", ["refused", "status", "hang", "body"])
def test_detect_with_a_snapshot_runs_the_rules_it_can(kind: str) -> None:
    """Before: GPU indices from DCGM were read first and their failure ended ``detect`` with
    exit 2 and no findings at all (a wrong-shaped answer: a traceback). Now the snapshot-only
    rules run and print their findings, and the exit status (3, incomplete) and the error
    name the rules that could not be evaluated."""
    fault = {
        "refused": None,
        "status": Fault("status", status=500),
        "hang": Fault("hang"),
        "body": Fault("body", body=WRONG_SHAPES["no-data"]),
    }[kind]
    rules = ["-r", str(ROOT / "rules")]
    if fault is None:
        url = refused_url()
        result = runner.invoke(
            app, ["detect", "-s", str(SCATTERED), "--prometheus", url, "-o", "json", *rules]
        )
    else:
        with broken_prometheus(fault) as prom:
            result = runner.invoke(
                app,
                [
                    *("detect", "-s", str(SCATTERED), "--prometheus", prom.url),
                    *("--prom-timeout", "2", "-o", "json", *rules),
                ],
            )
    assert result.exit_code == 3, result.output
    doc = json.loads(result.stdout)
    # scattered_20: the cluster finding and gpu-01 … gpu-06 (tests/test_rules_cli.py)
    fragmentation = [f["subject"] for f in doc["findings"] if f["kind"] == "fragmentation"]
    assert fragmentation == ["cluster"] + [f"node/gpu-0{i}" for i in range(1, 7)]
    failed = sorted(line.split(" ", 2)[1] for line in doc["failures"])
    assert failed == ["cluster-idle", "gpu-memory-leak"]
    assert "2 rule(s) could not be evaluated: cluster-idle, gpu-memory-leak" in result.stderr
    assert "Traceback" not in result.output


SECRET_URLS = [
    ("http://alice:s3cret@{host}", "http://{host}"),
    ("https://alice:s3cret@{host}/prom", "https://{host}/prom"),
    ("http://{host}/?token=s3cret&x=1", "http://{host}/?token=REDACTED&x=1"),
    ("http://{host}/api?access_token=s3cret", "http://{host}/api?access_token=REDACTED"),
    ("http://{host}/?X-Amz-Signature=s3cret", "http://{host}/?X-Amz-Signature=REDACTED"),
    ("http://{host}/?query=up", "http://{host}/?query=up"),
]


@pytest.mark.parametrize(("url", "shown"), SECRET_URLS)
def test_redaction_masks_credentials_and_keeps_the_rest(url: str, shown: str) -> None:
    """Before: only the Alertmanager sink dropped user:password; nothing masked tokens in
    query strings or in library messages. One helper now does both."""
    host = "prom.example:9090"
    assert redact_url(url.format(host=host)) == shown.format(host=host)
    text = f"HTTPConnectionPool: Max retries exceeded with url: {url.format(host=host)} (boom)"
    assert "s3cret" not in redact_text(text)
    assert "Authorization: Bearer REDACTED" in redact_text("Authorization: Bearer abcdefgh12345")


def test_credentials_in_the_prometheus_url_are_never_printed() -> None:
    """Before: ``detect`` printed the URL as given, password included, in every failure line."""
    url = refused_url().replace("http://", "http://alice:s3cret@")
    result = runner.invoke(app, ["detect", "--prometheus", url, "-r", str(LEAK_RULE)])
    assert result.exit_code == 3
    assert "s3cret" not in result.output and "alice" not in result.output
    assert f"Prometheus at {redact_url(url)} is unreachable" in result.stderr


def test_a_bad_answer_is_a_metrics_error() -> None:
    """Callers that catch MetricsError (report, rules check) catch wrong answers too."""
    assert issubclass(PrometheusBadAnswer, MetricsError)
