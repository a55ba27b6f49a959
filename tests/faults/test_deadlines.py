"""Deadlines that hold on the paths a user runs (issue 27, part 1): the real ``defrag`` command
in its own process against servers that trickle, hang or close early
(tests/support/slow_servers.py), over HTTP and HTTPS, with credentials in the URL.

Before (main at 30e232e): the request deadline shut ``conn.sock``, which http.client had already
set to None for a ``Connection: close`` answer, so a body trickling one byte every 2 s kept
``defrag detect --prom-timeout 3`` reading for the whole body (126 s for 62 bytes in the issue);
Kubernetes API calls had only a per-read timeout (30 s); no command had a limit of its own.
Each test below fails there (killed by its subprocess timeout, or no ``--deadline`` option).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from defrag.adapters.alertmanager import AlertmanagerSink
from defrag.detect.findings import Finding
from tests.support.kubeapi import KubeApi
from tests.support.slow_servers import Kind, SlowServer, Tls, self_signed
from tests.support.snapshots import scattered_20

ROOT = Path(__file__).resolve().parents[2]
LEAK_RULE = ROOT / "rules" / "leak.yaml"
SCATTERED = ROOT / "tests" / "fixtures" / "snapshots" / "scattered_20.json"
MARGIN_S = 5.0  # a loaded machine; a correctness bound, not a benchmark
STARTUP_S = 30.0  # Python and defrag.cli loading, on a machine shared with other builds
SECRET = "hunter2"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return self_signed(tmp_path_factory.mktemp("tls"))


CHILD = """
import sys, time
from defrag.cli import main
t0 = time.monotonic()
try:
    main()
finally:
    sys.stderr.write(f"\\n[command took {time.monotonic() - t0:.3f} s]\\n")
"""


def defrag(*args: str, env: dict[str, str] | None = None, limit_s: float = 90) -> tuple[
    subprocess.CompletedProcess[str], float
]:  # fmt: skip
    """The real CLI in its own process (killed past ``limit_s``) and how long the command ran,
    from after Python and ``defrag.cli`` were loaded to its exit. The whole process's wall
    time is bounded too, with room for a loaded machine's start-up."""
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        capture_output=True,
        text=True,
        timeout=limit_s,
        check=False,
        env={**os.environ, **(env or {})},
    )
    wall = time.monotonic() - t0
    found = re.search(r"\[command took ([0-9.]+) s\]", done.stderr)
    assert found, done.stderr
    took = float(found.group(1))
    assert wall < took + STARTUP_S, (wall, took)
    return done, took


def refused_url() -> str:
    """A local address nothing listens on: a command pointed at it fails at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def ends_by(deadline_s: float, took: float, baseline: float, stderr: str) -> None:
    """``took`` (the command against the slow server) is bounded by the deadline plus what the
    same command costs against a refused address (``baseline``, measured just before on the
    same machine: loading, rules, retries on a loaded CPU) plus a margin. Without a deadline
    the slow servers hold a command for minutes (killed at 90 s)."""
    assert took < baseline + deadline_s + MARGIN_S, (took, baseline, stderr)


def one_clear_error(done: subprocess.CompletedProcess[str], shown: str) -> str:
    """Non-zero exit, no traceback, no password, an ``error:`` line naming the server."""
    assert done.returncode != 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert SECRET not in done.stderr + done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert shown in done.stderr, done.stderr
    return done.stderr


@pytest.fixture
def server(request: pytest.FixtureRequest, tls: Tls) -> Iterator[SlowServer]:
    kind, scheme = request.param
    with SlowServer(kind, interval_s=2.0, tls=tls if scheme == "https" else None) as srv:
        yield srv


PROM_CASES = [
    (kind, scheme)
    for kind in ("trickle", "trickle-keepalive", "hang", "headers-then-close", "close-mid-body")
    for scheme in ("http", "https")
]
IDS = [f"{k}-{s}" for k, s in PROM_CASES]


# --- Prometheus: detect, report --prometheus, run --once -------------------------------------


@pytest.mark.parametrize("server", PROM_CASES, ids=IDS, indirect=True)
def test_detect_ends_by_the_request_deadline(server: SlowServer, tls: Tls) -> None:
    """Before: ``trickle`` (Connection: close) read the whole body, 2 s a byte (killed at 90 s);
    the others already ended. After: every kind ends by 3 s (+ the baseline and a margin) with
    one clear line."""
    tail = ["--prom-timeout", "3", "-r", str(LEAK_RULE), "--prom-ca-file", str(tls.cert)]
    _, baseline = defrag("detect", "--prometheus", refused_url(), *tail)
    done, took = defrag("detect", "--prometheus", server.url_with(f"ops:{SECRET}"), *tail)
    ends_by(3, took, baseline, done.stderr)
    stderr = one_clear_error(done, server.url)
    assert "1 rule(s) could not be evaluated: gpu-memory-leak" in stderr


@pytest.mark.parametrize("server", PROM_CASES, ids=IDS, indirect=True)
def test_report_with_prometheus_ends_by_the_request_deadline(
    server: SlowServer, tls: Tls, tmp_path: Path
) -> None:
    """Before: report took no Prometheus TLS or timeout settings and read a trickle for ever.
    After: ``prometheus.ca_file`` and ``prometheus.timeout_s`` from ``--settings`` hold."""
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"prometheus:\n  ca_file: {tls.cert}\n  timeout_s: 3\n")
    tail = ["--settings", str(settings)]
    _, baseline = defrag("report", "-s", str(SCATTERED), "--prometheus", refused_url(), *tail)
    url = server.url_with(f"ops:{SECRET}")
    done, took = defrag("report", "-s", str(SCATTERED), "--prometheus", url, *tail)
    ends_by(3, took, baseline, done.stderr)
    one_clear_error(done, server.url)


@pytest.mark.parametrize("server", [("trickle", "https")], ids=["trickle-https"], indirect=True)
def test_the_command_deadline_bounds_many_queries(server: SlowServer, tls: Tls) -> None:
    """Every shipped rule queries Prometheus; each query alone stays within --prom-timeout 10s
    but together they would take minutes. ``--deadline 4s`` ends the whole command."""
    tail = ["--deadline", "4s", "--prom-ca-file", str(tls.cert)]
    _, baseline = defrag("detect", "--prometheus", refused_url(), *tail)
    done, took = defrag("detect", "--prometheus", server.url_with(f"ops:{SECRET}"), *tail)
    ends_by(4, took, baseline, done.stderr)
    stderr = one_clear_error(done, server.url)
    assert "defrag detect's deadline of 4 s (--deadline)" in stderr


def kubeconfig(tmp_path: Path, url: str, ca: Path | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "kubeconfig"
    authority = f"    certificate-authority: {ca}\n" if ca else ""
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
        f"clusters:\n- name: emu\n  cluster:\n    server: {url}\n{authority}"
        "users:\n- name: me\n  user: {}\n"
        "contexts:\n- name: emu\n  context:\n    cluster: emu\n    user: me\n"
    )
    return path


@pytest.mark.parametrize("kind", ["trickle", "hang"])
def test_run_once_ends_by_the_cycle_deadline(kind: Kind, tmp_path: Path, tls: Tls) -> None:
    """The daemon's cycle against a good API server and a wedged Prometheus (HTTPS, its CA from
    ``prometheus.ca_file``): every rule's query is cut, and the whole cycle ends by its
    deadline (``daemon.ready_max_age_s`` 6 s) although the rules' queries would add up to more.
    Before: the trickle read for ever (killed at 90 s)."""
    with KubeApi(scattered_20()["items"]) as api, SlowServer(kind, tls=tls) as prom:
        env = {
            "DEFRAG_CLUSTER__KUBECONFIG": str(kubeconfig(tmp_path, api.url)),
            "DEFRAG_PROMETHEUS__CA_FILE": str(tls.cert),
            "DEFRAG_PROMETHEUS__TIMEOUT_S": "4",
            "DEFRAG_DAEMON__CYCLE_INTERVAL_S": "5",
            "DEFRAG_DAEMON__READY_MAX_AGE_S": "6",
        }
        _, baseline = defrag("run", "--once", env={**env, "DEFRAG_PROMETHEUS__URL": refused_url()})
        env["DEFRAG_PROMETHEUS__URL"] = prom.url_with(f"ops:{SECRET}")
        done, took = defrag("run", "--once", env=env)
    ends_by(6, took, baseline, done.stderr)
    stderr = one_clear_error(done, prom.url)
    assert "could not be evaluated" in stderr


# --- the Kubernetes API: report / plan --kubeconfig, run --once -----------------------------


KUBE_CASES = [
    ("report", "trickle", "http"),
    ("report", "hang", "https"),
    ("report", "headers-then-close", "http"),
    ("plan", "trickle", "https"),
    ("plan", "close-mid-body", "http"),
]


@pytest.mark.parametrize(("command", "kind", "scheme"), KUBE_CASES)
def test_a_wedged_api_server_cannot_hold_a_command(
    command: str, kind: Kind, scheme: str, tmp_path: Path, tls: Tls
) -> None:
    """A proxy in front of the API emulator trickles (or drops) its real answers. Before: 30 s
    per read, 5 attempts, no ``--deadline``. After: the command ends by ``--deadline 5s``."""
    refused = kubeconfig(tmp_path / "refused", refused_url())
    _, baseline = defrag(command, "--kubeconfig", str(refused), "--deadline", "5s")
    with (
        KubeApi(scattered_20()["items"]) as api,
        SlowServer(kind, upstream=api.url, tls=tls if scheme == "https" else None) as proxy,
    ):
        config = kubeconfig(tmp_path, proxy.url, tls.cert if scheme == "https" else None)
        done, took = defrag(command, "--kubeconfig", str(config), "--deadline", "5s")
    ends_by(5, took, baseline, done.stderr)
    one_clear_error(done, proxy.url)


def test_run_once_against_a_trickling_api_server_ends_by_the_cycle_deadline(
    tmp_path: Path,
) -> None:
    """Before: the cycle's first list read the trickle for ever (killed at 90 s)."""
    env = {"DEFRAG_DAEMON__CYCLE_INTERVAL_S": "5", "DEFRAG_DAEMON__READY_MAX_AGE_S": "6"}
    refused = kubeconfig(tmp_path / "refused", refused_url())
    _, baseline = defrag("run", "--once", env={**env, "DEFRAG_CLUSTER__KUBECONFIG": str(refused)})
    with KubeApi(scattered_20()["items"]) as api, SlowServer("trickle", upstream=api.url) as px:
        env["DEFRAG_CLUSTER__KUBECONFIG"] = str(kubeconfig(tmp_path, px.url))
        done, took = defrag("run", "--once", env=env)
    ends_by(6, took, baseline, done.stderr)
    stderr = one_clear_error(done, px.url)
    assert "the cycle's deadline of 6 s" in stderr


# --- Alertmanager ----------------------------------------------------------------------------


def finding() -> Finding:
    return Finding("leak", "pod/ml/a", "warning", "a leaks")


@pytest.mark.parametrize("kind", ["trickle", "hang"])
def test_alertmanager_gives_up_by_its_deadline(kind: Kind) -> None:
    """A send to a trickling Alertmanager ends by timeout_s per attempt (before: the trickle
    was read whole, 2 s a byte), and inside a cycle's budget by the budget."""
    from defrag.adapters.deadline import time_budget  # here: main before has none to import

    with SlowServer(kind, body=b"{}" * 20) as am:
        sink = AlertmanagerSink(
            [am.url_with(f"am:{SECRET}")], timeout_s=2, retry_attempts=2, retry_wait_s=0.1
        )
        t0 = time.monotonic()
        report = sink.sync_report([finding()], datetime.now(UTC))
        took = time.monotonic() - t0
        assert report.all_failed and took < 2 * (2 + 2) + MARGIN_S, (took, report)
        assert SECRET not in str(report)
        sink2 = AlertmanagerSink([am.url], timeout_s=30, retry_attempts=3)
        t0 = time.monotonic()
        with time_budget(3, "the cycle's deadline of 3 s"):
            report = sink2.sync_report([finding()], datetime.now(UTC))
        took = time.monotonic() - t0
        assert report.all_failed and took < 3 + MARGIN_S, (took, report)
        assert "the cycle's deadline of 3 s" in str(report.failures)


def test_the_extenders_watched_source_ends_each_list_by_its_request_deadline(
    tmp_path: Path,
) -> None:
    """The extender's list + watch source behind a proxy that trickles the API's real answers a
    byte every 0.5 s: no single read waits long enough to time out, so only a deadline on the
    whole request ends it. Two attempts of 1 s each, then one error naming the server."""
    from defrag.adapters.kube import RetryPolicy, connect
    from defrag.adapters.kube_watch import KubeWatchSource

    with (
        KubeApi(scattered_20()["items"]) as api,
        SlowServer("trickle", upstream=api.url, interval_s=0.5) as proxy,
    ):
        source = KubeWatchSource(
            connect(str(kubeconfig(tmp_path, proxy.url))),
            retry=RetryPolicy(attempts=2, backoff_s=0, timeout_s=1),
        )
        started = time.monotonic()
        with pytest.raises(TimeoutError) as caught:
            source.sync()
        took = time.monotonic() - started
        health = source.health()
    assert took < 2 * 1 + MARGIN_S, took
    assert "did not answer within 1 s (the whole request)" in str(caught.value)
    assert proxy.url.split("//")[1] in str(caught.value)
    assert not health.synced
