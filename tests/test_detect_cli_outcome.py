"""``defrag detect`` says what it did (issue 22, A): which rules ran, which were skipped and
why, which could not be evaluated, and where its alerts went and how many; "no findings" only
when every rule ran. Exit codes: 0 done, 1 findings with --fail-on-findings, 2 bad input,
3 incomplete (a rule not evaluated, or no Alertmanager took the alerts). docs/cli.md."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.cli import app

ROOT = Path(__file__).resolve().parents[1]
SCATTERED = str(Path(__file__).parent / "fixtures" / "snapshots" / "scattered_20.json")
RULES = ROOT / "rules"
SNAPSHOT_RULES = ["-r", str(RULES / "fragmentation.yaml"), "-r", str(RULES / "starvation.yaml")]
AT = "2026-11-29T12:00:00Z"
DOWN = "http://127.0.0.1:9"  # port 9 (discard): nothing listens, refused at once
runner = CliRunner()


@pytest.fixture(autouse=True)
def no_default_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``detect`` without --snapshot reads the cluster kubectl would (``$KUBECONFIG``,
    ``~/.kube/config``): none here, whatever the machine running the tests has."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture()
def empty_cluster(tmp_path: Path) -> str:
    """The scattered cluster's nodes without a pod: nothing to find."""
    doc = json.loads(Path(SCATTERED).read_text())
    doc["items"] = [i for i in doc["items"] if i["kind"] == "Node"]
    path = tmp_path / "empty.json"
    path.write_text(json.dumps(doc))
    return str(path)


class _Alertmanager(BaseHTTPRequestHandler):
    posted: list[dict[str, object]]

    def do_GET(self) -> None:  # the sink reads the active alerts once, to adopt them
        self._answer(b"[]")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        type(self).posted.extend(json.loads(self.rfile.read(length)))
        self._answer(b"")

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def alertmanager() -> Iterator[tuple[str, list[dict[str, object]]]]:
    handler = type("Handler", (_Alertmanager,), {"posted": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.posted
    finally:
        server.shutdown()
        server.server_close()


def test_unreachable_prometheus_is_not_no_findings() -> None:
    result = runner.invoke(app, ["detect", "--prometheus", DOWN, "--prom-timeout", "1"])
    assert result.exit_code == 3, result.output
    assert "no findings" not in result.stdout
    assert "nothing evaluated: no rule ran" in result.stdout
    assert "rules: 0 ran, 1 skipped, 6 not evaluated" in result.stderr  # spreading: no cluster
    assert "error: 6 rule(s) could not be evaluated" in result.stderr
    doc = json.loads(
        runner.invoke(
            app, ["detect", "--prometheus", DOWN, "--prom-timeout", "1", "-o", "json"]
        ).stdout
    )
    assert doc["complete"] is False and doc["ran"] == [] and len(doc["failures"]) == 6


@pytest.mark.parametrize(
    ("args", "code", "stdout", "stderr"),
    [
        # every rule ran, nothing found: the only "no findings"
        (SNAPSHOT_RULES, 0, "no findings: all 4 rule(s) ran", "rules: 4 ran (gpu-fragmentation"),
        # the metric rules skip without Prometheus, by choice: said, not an error
        ([], 0, "no findings from the 4 rule(s) that ran", "skipped rule cluster-idle: no metr"),
        # a rule that could not be evaluated: incomplete
        (["--prometheus", DOWN], 3, "no findings from the 4 rule(s)", "not evaluated: rule clu"),
    ],
)
def test_what_ran_and_the_exit_code(
    empty_cluster: str, args: list[str], code: int, stdout: str, stderr: str
) -> None:
    result = runner.invoke(app, ["detect", "-s", empty_cluster, "--at", AT, *args])
    assert result.exit_code == code, result.output
    assert stdout in result.stdout
    assert stderr in result.stderr
    assert "alerts: not sent (no --alertmanager)" in result.stderr


@pytest.mark.parametrize(("flag", "code"), [([], 0), (["--fail-on-findings"], 1)])
def test_findings_exit_0_unless_asked_to_fail(flag: list[str], code: int) -> None:
    result = runner.invoke(app, ["detect", "-s", SCATTERED, "--at", AT, *SNAPSHOT_RULES, *flag])
    assert result.exit_code == code, result.output
    assert "no findings" not in result.stdout


def test_json_says_ran_skipped_and_failed(empty_cluster: str) -> None:
    result = runner.invoke(app, ["detect", "-s", empty_cluster, "--at", AT, "-o", "json"])
    doc = json.loads(result.stdout)
    assert doc["ran"] == [
        "gpu-fragmentation",
        "high-priority-starved",
        "fragmented-starved",
        "unsatisfiable-pending",
    ]
    # an empty cluster has no placement to judge: the spreading rule is skipped, not run
    assert set(doc["skipped"]) == {"cluster-idle", "gpu-memory-leak", "gpu-pods-spread"}
    assert doc["failures"] == [] and doc["alerts"] is None and doc["complete"] is True


def test_alerts_delivered_are_said_where_and_how_many(
    alertmanager: tuple[str, list[dict[str, object]]],
) -> None:
    url, posted = alertmanager
    args = ["detect", "-s", SCATTERED, *SNAPSHOT_RULES, "--alertmanager", url]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    firing = len(posted)
    assert firing == 8  # the cluster, six nodes and the starving pod
    assert f"alerts: delivered to {url}: {firing} firing, 0 resolved" in result.stderr
    doc = json.loads(runner.invoke(app, [*args, "-o", "json"]).stdout)
    assert doc["alerts"]["delivered"] is True
    assert doc["alerts"]["results"][0]["url"] == url


def test_undelivered_alerts_are_incomplete() -> None:
    args = ["detect", "-s", SCATTERED, *SNAPSHOT_RULES, "--alertmanager", DOWN]
    result = runner.invoke(app, args)
    assert result.exit_code == 3, result.output
    assert f"alerts: not delivered to {DOWN}:" in result.stderr
    assert "error: alerts not sent:" in result.stderr
    doc = json.loads(runner.invoke(app, [*args, "-o", "json"]).stdout)
    assert doc["alerts"]["delivered"] is False and doc["complete"] is False


@pytest.fixture()
def empty_prometheus(tmp_path: Path) -> Iterator[str]:
    """A real Prometheus with an empty TSDB and nothing to scrape: every query answers, with no
    series."""
    import subprocess

    from tests.support.binaries import free_port, require_binary, stop_process, wait_ready

    binary = require_binary("prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "prometheus.log"
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_ready("prometheus", url, proc, log, timeout_s=30, interval_s=0.1)
        yield url
    finally:
        stop_process(proc)


@pytest.mark.integration
def test_an_empty_prometheus_has_its_own_exit_code(empty_prometheus: str) -> None:
    """Before: "nothing evaluated" and exit 0, where an unreachable Prometheus exits 3 and
    findings (with --fail-on-findings) exit 1. Now: every rule skipped for lack of data is
    exit 4 (docs/cli.md, Exit codes), said in one error line."""
    empty = runner.invoke(app, ["detect", "--prometheus", empty_prometheus, "--fail-on-findings"])
    down = runner.invoke(app, ["detect", "--prometheus", DOWN, "--fail-on-findings"])
    assert (empty.exit_code, down.exit_code) == (4, 3), empty.output + down.output
    assert "rules: 0 ran, 7 skipped" in empty.stderr
    (error,) = [line for line in empty.stderr.splitlines() if line.startswith("error:")]
    assert "nothing evaluated: all 7 rule(s) were skipped" in error


def test_the_summary_names_the_rules_that_ran_after_ran(empty_cluster: str) -> None:
    """Before: ``rules: 3 ran, 3 skipped (gpu-fragmentation, …)`` put the rules that ran
    after the word "skipped"."""
    result = runner.invoke(app, ["detect", "-s", empty_cluster, "--at", AT])
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("rules:")]
    assert line == (
        "rules: 4 ran (gpu-fragmentation, high-priority-starved, fragmented-starved, "
        "unsatisfiable-pending), 3 skipped"
    )
