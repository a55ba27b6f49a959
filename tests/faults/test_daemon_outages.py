"""The daemon through Prometheus outages and wedged cycles (issue 15, items 3 and 4).

Real parts: the real Prometheus (backfilled DCGM history, tests/support/prometheus.py) behind
a proxy that can break (tests/support/broken_prometheus.py), the real Alertmanager and its
webhook receiver (tests/support/alertmanager.py), the Kubernetes API emulator and the real
``defrag run`` process. Every test says how it failed before the change (commit 9928191).
"""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from defrag.adapters.alertmanager import AlertmanagerSink
from defrag.adapters.prometheus import PrometheusSource
from defrag.cli.app import load_cluster
from defrag.cli.run import _detector, _planner
from defrag.daemon.cycle import CyclePorts
from defrag.daemon.service import Daemon, configure_logging
from defrag.decide import CycleConfig
from defrag.model.cluster import Cluster
from defrag.rules import load_rules
from defrag.settings import load_settings
from tests.support.alertmanager import Notification, WebhookReceiver, alertmanager_with_receiver
from tests.support.binaries import free_port
from tests.support.broken_prometheus import Fault, broken_prometheus
from tests.support.kubeapi import KubeApi
from tests.support.prometheus import END, make_fleet, prometheus_server, write_openmetrics
from tests.support.snapshots import scattered_20
from tests.test_daemon_cli import kubeconfig

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCATTERED = ROOT / "tests" / "fixtures" / "snapshots" / "scattered_20.json"
LEAK = "GPUMemoryLeakSuspected"
FAILED = "DefragRuleEvaluationFailed"


class FixedClock:
    """The detection clock: the backfilled history ends at END (queries name their time)."""

    def now(self) -> datetime:
        return END


class StaticSource:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def snapshot(self) -> Cluster:
        return self.cluster


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # one GPU leaking 2,000 MiB/h (node-000 GPU 0, pod ml/leak-0), three flat ones
    fleet = make_fleet(["leak", "flat", "flat", "flat"], hours=12, step_s=30)
    path = tmp_path_factory.mktemp("om") / "history.om"
    with path.open("w") as out:
        write_openmetrics(fleet, out)
    with prometheus_server(path) as server:
        yield server.url


def count(rx: WebhookReceiver, name: str, status: str) -> int:
    return len(rx.matching(name, status))


def has(name: str, status: str) -> Callable[[list[Notification]], bool]:
    def check(ns: list[Notification]) -> bool:
        return any(n.name == name and n.status == status for n in ns)

    return check


def test_an_outage_neither_resolves_nor_refires_a_live_alert(prom: str) -> None:
    """Before: the two cycles without Prometheus found no leak, so the leak alert was resolved
    (the receiver got ``resolved``) and fired again when Prometheus came back (a second
    ``firing``); the cycles counted as successes, /readyz said ok, nothing named the rule, and
    the URL's password was in the log. Now the alert is held as it was, the rule is reported
    (metric, /readyz, DefragRuleEvaluationFailed) and the password appears nowhere."""
    rules = load_rules([ROOT / "rules" / "leak.yaml"])
    stderr = io.StringIO()
    saved_handlers = logging.getLogger().handlers[:]
    saved_stderr, sys.stderr = sys.stderr, stderr
    configure_logging("text", "INFO")
    try:
        with (
            broken_prometheus(upstream=prom) as proxy,
            alertmanager_with_receiver() as (am, rx),
        ):
            url = proxy.url.replace("http://", "http://alice:s3cret@")
            metrics = PrometheusSource(url, timeout_s=5, retries=0)
            sink = AlertmanagerSink(
                [am.url], cluster="it", resend_interval_s=0.3, ttl_s=30, retry_wait_s=0.05
            )
            ports = CyclePorts(
                source=StaticSource(load_cluster([SCATTERED])),
                clock=FixedClock(),
                detector=_detector(rules, metrics),
                planner=_planner(load_settings(None, {"cluster.kind": "sim"})),
                alerts=sink,
            )
            daemon = Daemon(ports, CycleConfig(), ready_age_limit_s=1e9)

            first = daemon.run_once()
            assert [f.subject for f in first.findings] == ["pod/ml/leak-0"]
            rx.wait_for(has(LEAK, "firing"))
            assert daemon.ready().ok

            proxy.stop()  # Prometheus down for two cycles: connections refused
            for _ in range(2):
                down = daemon.run_once()
                assert down.rule_failures.keys() == {"gpu-memory-leak"}
                assert sink.last_report is not None
                assert sink.last_report.transition.resolved == ()
            rx.wait_for(has(FAILED, "firing"))
            ready = daemon.ready()
            assert not ready.ok
            assert "rule gpu-memory-leak could not be evaluated" in str(ready)
            assert "is unreachable" in str(ready)
            exposition = daemon.metrics.exposition().decode()
            assert 'defrag_rule_evaluation_failures_total{rule="gpu-memory-leak"} 2.0' in (
                exposition
            )
            assert 'defrag_rule_evaluation_failing{rule="gpu-memory-leak"} 1.0' in exposition
            assert 'defrag_cycles_total{outcome="degraded"} 2.0' in exposition
            (held,) = am.alerts(alertname=LEAK)
            assert held["status"]["state"] == "active"
            (failed,) = am.alerts(alertname=FAILED)
            assert failed["labels"]["rule"] == "gpu-memory-leak"
            assert failed["annotations"]["runbook_url"].endswith("#defragruleevaluationfailed")

            proxy.start()  # back
            back = daemon.run_once()
            assert not back.rule_failures
            rx.wait_for(has(FAILED, "resolved"))  # the barrier: same cycle, same group_wait
            assert count(rx, LEAK, "firing") == 1
            assert count(rx, LEAK, "resolved") == 0
            assert daemon.ready().ok
            exposition = daemon.metrics.exposition().decode()
            assert 'defrag_rule_evaluation_failing{rule="gpu-memory-leak"} 0.0' in exposition
            assert "s3cret" not in exposition and "s3cret" not in str(ready)
    finally:
        sys.stderr = saved_stderr
        logging.getLogger().handlers[:] = saved_handlers
    log = stderr.getvalue()
    assert "rule gpu-memory-leak could not be evaluated (alerts held)" in log
    assert "s3cret" not in log and "alice" not in log


class CountingElector:
    def __init__(self) -> None:
        self.renewed = threading.Event()

    def is_leader(self) -> bool:
        self.renewed.set()
        return True

    def release(self) -> None:
        return None


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_wedged_cycle_fails_liveness_and_lets_the_lease_lapse() -> None:
    """Before: /healthz answered 200 whatever the cycle did, and the Lease was renewed every
    tick while the cycle hung. Now, past the cycle's deadline, /healthz is 503 with the reason
    and the elector is no longer asked to renew; both recover when the cycle ends."""
    release = threading.Event()
    entered = threading.Event()

    def stuck(cluster: Cluster, now: datetime, profile: object) -> list[object]:
        entered.set()
        release.wait(60)
        return []

    elector = CountingElector()
    ports = CyclePorts(
        source=StaticSource(load_cluster([SCATTERED])),
        clock=FixedClock(),
        detector=stuck,  # type: ignore[arg-type]
        planner=_planner(load_settings(None, {"cluster.kind": "sim"})),
    )
    daemon = Daemon(
        ports,
        CycleConfig(),
        cycle_deadline_s=0.5,
        elector=elector,
        elector_interval_s=0.1,
        stop_grace_s=5,
    )
    daemon.start()
    try:
        assert entered.wait(30)
        base = "http://{}:{}".format(*daemon.http_address)
        deadline = time.monotonic() + 30
        status = get(f"{base}/healthz")
        while status[0] == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
            status = get(f"{base}/healthz")
        assert status[0] == 503
        assert "past its deadline of 0 s" in status[1] or "past its deadline of 1 s" in status[1]
        elector.renewed.clear()
        # ten elector ticks (0.1 s apart) while the cycle stays wedged: none renews
        time.sleep(1.0)
        assert not elector.renewed.is_set()
        assert "defrag_cycle_overdue 1.0" in daemon.metrics.exposition().decode()
        release.set()
        assert elector.renewed.wait(30)  # renewing again once the cycle is over
        assert get(f"{base}/healthz") == (200, "ok\n")
    finally:
        release.set()
        daemon.stop()


GRACE_S = 30  # Kubernetes' default terminationGracePeriodSeconds


def stderr_within_grace(proc: subprocess.Popen[str], after: str, tail: int) -> str:
    """``proc``'s stderr once it ends within the grace period; else it is killed and the test
    fails with the end of its log."""
    try:
        _, err = proc.communicate(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(
            f"still running {GRACE_S} s {after}; its log ends:\n{err[-tail:]}"
        ) from None
    return err


def test_sigterm_ends_a_daemon_stuck_on_a_stalled_prometheus_within_the_grace_period(
    tmp_path: Path,
) -> None:
    """Before: the cycle's query to a Prometheus trickling one byte every 2 s never ended (the
    timeout bounded each read), /healthz stayed 200, and SIGTERM waited for the cycle
    (scheduler shutdown with wait=True): the process was still there after 30 s. Now /healthz
    turns 503 past the cycle deadline and SIGTERM ends the process within the grace period."""
    with (
        KubeApi(scattered_20()["items"]) as api,
        broken_prometheus(Fault("trickle", interval_s=2.0, trickle_bytes=10_000)) as prom,
    ):
        # drawn once the test's own servers hold their ports: drawn before, the OS could hand
        # the same port to one of them, and /healthz would be that server's 404
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEFRAG_")}
        env.update(
            {
                "DEFRAG_CLUSTER__KUBECONFIG": str(kubeconfig(tmp_path, api.url)),
                "DEFRAG_PROMETHEUS__URL": prom.url,
                "DEFRAG_PROMETHEUS__TIMEOUT_S": "600",  # the query outlasts the grace period
                "DEFRAG_DAEMON__READY_MAX_AGE_S": "2",  # the cycle deadline
                # must be shorter than ready_max_age_s (settings that must agree)
                "DEFRAG_DAEMON__CYCLE_INTERVAL_S": "1",
                "DEFRAG_HTTP__HOST": "127.0.0.1",
                "DEFRAG_HTTP__PORT": str(port),
                "DEFRAG_DETECTION__RULES_DIR": str(ROOT / "rules"),
            }
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", "from defrag.cli import main; main()", "run"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            health = (0, "")
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    health = get(f"http://127.0.0.1:{port}/healthz")
                    if health[0] == 503 and prom.requests:
                        break
                except OSError:
                    pass
                time.sleep(0.2)
            # The stalled query began; /healthz says 503 while the cycle is past its deadline,
            # a window that closes once the cycle's deadline cuts the query (it may be missed).
            assert prom.requests, health
            if health[0] == 503:
                assert "past its deadline of 2 s" in health[1]
            proc.send_signal(signal.SIGTERM)
            err = stderr_within_grace(proc, "after SIGTERM", 8000)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert "signal 15: finishing the current step and stopping" in err
    # Either SIGTERM came while a cycle still ran, or (since requests are cut at the cycle's
    # deadline) the stalled query had already been cut and the cycle reported its rules failed.
    assert "a cycle is still running" in err or "the cycle's deadline of 2 s" in err, err
    assert "Traceback" not in err
    if proc.returncode != 0:
        # The stop itself hung and the last resort ended the process (within the grace period,
        # which is what Kubernetes needs): say where it hung, for the next reader of the log.
        assert proc.returncode == 1 and "Timeout (0:00:20)!" in err, (proc.returncode, err)
        hung = err[-6000:]
        warnings.warn(f"the stop hung; the watchdog ended the process:\n{hung}", stacklevel=1)


HUNG_STOP = """
import threading, sys
from defrag.cli.app import load_cluster
from defrag.cli.run import _planner
from defrag.decide import CycleConfig
from defrag.daemon.cycle import CyclePorts
from defrag.daemon.service import Daemon, configure_logging
from defrag.settings import load_settings
from tests.faults.test_daemon_outages import SCATTERED, FixedClock, StaticSource

class HungElector:  # an API server that takes the Lease's release and never answers
    def is_leader(self):
        return True

    def release(self):
        print("releasing the Lease", file=sys.stderr, flush=True)
        threading.Event().wait()

ports = CyclePorts(
    source=StaticSource(load_cluster([SCATTERED])),
    clock=FixedClock(),
    detector=lambda cluster, now, profile: [],
    planner=_planner(load_settings(None, {"cluster.kind": "sim"})),
)
daemon = Daemon(ports, CycleConfig(), elector=HungElector(), stop_grace_s=1, cycle_interval_s=3600)
configure_logging("text", "INFO")
daemon.serve_forever()
print("serve_forever returned", file=sys.stderr, flush=True)
"""


def test_sigterm_ends_the_process_whatever_the_stop_waits_on() -> None:
    """Before: the stop ran on a thread the main thread waited for without a bound, so a stop
    stuck on anything but the cycle (the Lease's release, a join at exit) kept the process past
    Kubernetes' grace period, to be killed with no word of where it hung. Now the process ends
    by ``stop_grace_s`` + STOP_SLACK_S (1 + 10 s here) with exit status 1 and every thread's
    stack on stderr, the stuck call named."""
    from defrag.daemon.service import STOP_SLACK_S

    proc = subprocess.Popen(
        [sys.executable, "-c", HUNG_STOP],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # started: its first cycle is logged after the handlers are set
            seen.append(line)
            if "cycle (leader, dry run)" in line:
                break
        assert proc.poll() is None, "".join(seen)
        signaled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)  # a second signal starts no second stop
        _, err = proc.communicate(timeout=GRACE_S)
        took = time.monotonic() - signaled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    assert took >= 1 + STOP_SLACK_S - 1, took  # not before the bound: the stop had its time
    assert err.count("releasing the Lease") == 1, err
    assert "serve_forever returned" not in err
    assert "Timeout (0:00:11)!" in err, err  # faulthandler's heading, then every stack
    assert "in release" in err and "in stop" in err, err


SIGTERM_OFF_MAIN = """
import signal, sys, threading
from defrag.cli.app import load_cluster
from defrag.cli.run import _planner
from defrag.decide import CycleConfig
from defrag.daemon.cycle import CyclePorts
from defrag.daemon.service import Daemon, configure_logging
from defrag.settings import load_settings
from tests.faults.test_daemon_outages import SCATTERED, FixedClock, StaticSource

ports = CyclePorts(
    source=StaticSource(load_cluster([SCATTERED])),
    clock=FixedClock(),
    detector=lambda cluster, now, profile: [],
    planner=_planner(load_settings(None, {"cluster.kind": "sim"})),
)
daemon = Daemon(ports, CycleConfig(), stop_grace_s=1, cycle_interval_s=3600)
sent = []

def on_cycle(result):  # on the scheduler's worker thread, once the main thread waits
    if not sent:
        sent.append(1)
        print("SIGTERM taken by a worker thread", file=sys.stderr, flush=True)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

daemon.on_cycle = on_cycle
configure_logging("text", "INFO")
daemon.serve_forever()
print("serve_forever returned", file=sys.stderr, flush=True)
"""


def test_sigterm_taken_by_another_thread_than_the_main_one_stops_the_daemon() -> None:
    """Before: the main thread waited for the stop without a timeout, and a Python signal
    handler runs only when the main thread executes bytecode. A SIGTERM whose C-level handler
    ran on another thread, or on the main thread just before it blocked (a daemon sent SIGTERM
    as it started, on a loaded machine, hung so once in 95 tries: no "signal 15" line, alive
    40 s later), interrupted no wait: the handler never ran, so neither the stop nor the
    watchdog it armed — the process ran on until something else woke the main thread
    (python/cpython#85300). Here the signal is sent to a worker thread, which makes the lost
    wake-up certain. Now the main thread waits in slices and stops as asked, exit status 0."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_OFF_MAIN], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    err = stderr_within_grace(proc, "after a SIGTERM taken by a worker thread", 4000)
    assert "SIGTERM taken by a worker thread" in err, err
    assert proc.returncode == 0, err
    assert "signal 15: finishing the current step and stopping" in err, err
    assert "serve_forever returned" in err, err


def test_run_once_with_prometheus_down_reports_the_rules_and_exits_3(tmp_path: Path) -> None:
    """Before: ``run --once`` logged "rule failed" and exited 0, and its output and log
    carried the Prometheus password. Now the cycle's other work is printed, the rules that
    could not be evaluated are named, the exit status is 3 (a server, as for ``detect``;
    docs/cli.md), and the password appears nowhere."""
    from typer.testing import CliRunner

    from defrag.cli import app
    from tests.support.broken_prometheus import refused_url

    url = refused_url().replace("http://", "http://alice:s3cret@")
    with KubeApi(scattered_20()["items"]) as api:
        env = {
            "DEFRAG_CLUSTER__KUBECONFIG": str(kubeconfig(tmp_path, api.url)),
            "DEFRAG_PROMETHEUS__URL": url,
            "DEFRAG_DETECTION__RULES_DIR": str(ROOT / "rules"),
        }
        clean = {k: None for k in os.environ if k.startswith("DEFRAG_")}
        result = CliRunner().invoke(app, ["run", "--once"], env={**clean, **env})
    assert result.exit_code == 3, result.output
    assert "rule gpu-memory-leak not evaluated (its alerts held)" in result.stdout
    assert "2 rule(s) could not be evaluated: cluster-idle, gpu-memory-leak" in result.stderr
    assert "s3cret" not in result.output and "alice" not in result.output


def test_detect_from_cron_keeps_the_alerts_of_a_rule_it_could_not_evaluate() -> None:
    """Before: ``detect --alertmanager`` adopted the leak alert an earlier run had sent, found
    no leak (Prometheus was down) and resolved it. Now the alert stays active and
    DefragRuleEvaluationFailed names the rule."""
    from typer.testing import CliRunner

    from defrag.cli import app
    from defrag.detect.findings import Finding
    from tests.support.broken_prometheus import refused_url

    earlier = Finding(  # what an earlier `detect` run sent for the leak rule
        "leak",
        "pod/ml/leak-0",
        "warning",
        "GPU memory of ml/leak-0 grows",
        labels={"rule": "gpu-memory-leak", "detector": "leak", "node": "node-000"},
    )
    with alertmanager_with_receiver() as (am, rx):
        AlertmanagerSink([am.url], cluster="it").sync([earlier], datetime.now(UTC))
        rx.wait_for(has(LEAK, "firing"))
        result = CliRunner().invoke(
            app,
            [
                *("detect", "--prometheus", refused_url(), "-r", str(ROOT / "rules" / "leak.yaml")),
                *("--alertmanager", am.url, "--cluster-label", "it"),
            ],
        )
        assert result.exit_code == 3, result.output  # incomplete (docs/cli.md)
        rx.wait_for(has(FAILED, "firing"))  # the barrier: the same POST as a resolve would be
        assert count(rx, LEAK, "resolved") == 0
        (leak,) = am.alerts(alertname=LEAK)
        assert leak["status"]["state"] == "active"
        (failed,) = am.alerts(alertname=FAILED)
        assert failed["labels"]["rule"] == "gpu-memory-leak"


def test_another_replica_takes_the_lease_from_a_wedged_leader() -> None:
    """Before: the wedged leader's elector job renewed the Lease every tick while its cycle
    hung, so the other replica could never take over. Now renewals stop past the cycle
    deadline; the Lease (2 s) expires and the other replica's LeaseElector takes it."""
    from defrag.adapters.kube import LeaseElector

    release = threading.Event()
    entered = threading.Event()

    def stuck(cluster: Cluster, now: datetime, profile: object) -> list[object]:
        entered.set()
        release.wait(60)
        return []

    with KubeApi(scattered_20()["items"]) as api:

        def elector(who: str) -> LeaseElector:
            return LeaseElector(api.client(), "defrag-system", "defrag", who, lease_duration_s=2)

        wedged = Daemon(
            CyclePorts(
                source=StaticSource(load_cluster([SCATTERED])),
                clock=FixedClock(),
                detector=stuck,  # type: ignore[arg-type]
                planner=_planner(load_settings(None, {"cluster.kind": "sim"})),
            ),
            CycleConfig(),
            cycle_deadline_s=0.5,
            elector=elector("a"),
            elector_interval_s=0.2,
            stop_grace_s=5,
        )
        other = elector("b")
        wedged.start()
        try:
            assert entered.wait(30)
            lease = api.get("Lease", "defrag", "defrag-system")
            assert lease is not None and lease["spec"]["holderIdentity"] == "a"
            deadline = time.monotonic() + 30
            while not other.is_leader() and time.monotonic() < deadline:
                time.sleep(0.2)
            lease = api.get("Lease", "defrag", "defrag-system")
            assert lease is not None and lease["spec"]["holderIdentity"] == "b"
        finally:
            release.set()
            wedged.stop()
