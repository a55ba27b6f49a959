"""The daemon: HTTP health and metrics, readiness, windows on their cron, SIGTERM, settings."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest
from freezegun import freeze_time

from defrag.adapters.kube import KubeError
from defrag.adapters.prometheus import MetricsError
from defrag.adapters.simcluster import SimClock, SimCluster, fragmented_cluster
from defrag.adapters.watched_cluster import StaleCluster
from defrag.cli.run import _detector, _planner, build, default_rules_dir
from defrag.daemon.cycle import CyclePorts, SystemClock
from defrag.daemon.service import Daemon
from defrag.decide import CycleConfig
from defrag.execute import EvictionBudget, Executor, ExecutorSettings, Window
from defrag.execute.mode import RunMode
from defrag.rules import load_rules
from defrag.settings import load_settings
from tests.support.binaries import free_port


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sim_daemon(
    windows: tuple[Window, ...] = (),
    dry_run: bool = True,
    clock: object = None,
    rules_dir: Path | None = None,
    **kw: object,
) -> tuple[SimCluster, Daemon]:
    sim_clock = SimClock(speedup=0)
    sim = SimCluster(fragmented_cluster(), sim_clock)
    use = clock or sim_clock
    settings = load_settings(None, {"windows.max_evictions_per_namespace": 20})
    ex = Executor(
        sim,
        sim,
        use,
        ExecutorSettings(EvictionBudget(20, 8, 20), poll_interval_s=10),  # type: ignore[arg-type]
        mode=RunMode(dry_run=dry_run),
        sleep=sim_clock.sleep,
    )
    ports = CyclePorts(
        sim,
        use,
        _detector(load_rules([rules_dir or default_rules_dir()]), None),  # type: ignore[arg-type]
        _planner(settings),
        ex,
    )
    return sim, Daemon(ports, CycleConfig(windows=windows), **kw)  # type: ignore[arg-type]


@pytest.fixture
def served() -> object:
    sim, daemon = sim_daemon(ready_age_limit_s=600)
    daemon._serve_http()  # the endpoints alone, no scheduler
    host, port = daemon.http_address
    yield sim, daemon, f"http://{host}:{port}"
    daemon.stop()


def test_health_readiness_and_metrics_over_http(served: tuple[SimCluster, Daemon, str]) -> None:
    sim, daemon, base = served
    assert get(base + "/healthz") == (200, "ok\n")
    code, body = get(base + "/readyz")
    assert code == 503 and "no cycle has succeeded yet" in body
    daemon.run_once()
    assert get(base + "/readyz") == (200, "ok\n")
    code, text = get(base + "/metrics")
    assert code == 200
    # The fragmented cluster: 20 free GPUs, none usable by an 8-GPU job, largest job 2.
    for line in (
        "defrag_free_gpus 20.0",
        "defrag_largest_placeable_job_gpus 2.0",
        "defrag_whole_free_nodes 0.0",
        'defrag_stranded_gpus{size="8"} 20.0',
        'defrag_findings{kind="starvation"} 1.0',
        'defrag_cycles_total{outcome="success"} 1.0',
        "defrag_leader 1.0",
        "defrag_circuit_open 0.0",
    ):
        assert line in text, line
    assert 'defrag_evictions_total{result="planned"}' in text  # dry run rehearsal
    assert "defrag_cycle_duration_seconds_count 1.0" in text
    assert get(base + "/nope")[0] == 404
    # Readiness lapses when the last good cycle grows old (simulated clock, 601 s > 600 s).
    sim.clock.sleep(601)
    code, body = get(base + "/readyz")
    assert code == 503 and "last good cycle 601 s ago (limit 600 s)" in body


def test_a_failed_cycle_is_counted_and_readiness_says_why() -> None:
    sim, daemon = sim_daemon()

    def broken() -> object:
        raise ConnectionError("API server unreachable")

    sim.snapshot = broken  # type: ignore[method-assign,assignment]
    with pytest.raises(ConnectionError):
        daemon.run_once()
    assert "last error: ConnectionError: API server unreachable" in str(daemon.ready())
    assert b'defrag_cycles_total{outcome="failure"} 1.0' in daemon.metrics.exposition()


@pytest.mark.parametrize(
    ("error", "traceback"),
    [
        (StaleCluster("the watched cluster is stale: a watch has been down for 31 s"), False),
        (KubeError("cannot list Pods: HTTP 503"), False),
        (MetricsError("Prometheus at http://p:9090 is unreachable"), False),
        (TimeoutError("the cycle's deadline of 6 s"), False),
        (KeyError("a defect"), True),
    ],
    ids=["stale view", "API server", "Prometheus", "deadline", "defect"],
)
def test_a_failed_cycle_is_one_line_unless_it_is_a_defect(
    error: Exception, traceback: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The outside failing (the chaos soak: a watch down past the staleness limit) is an error
    line with the reason, not a traceback every second; a defect keeps its traceback."""
    sim, daemon = sim_daemon()

    def broken() -> object:
        raise error

    sim.snapshot = broken  # type: ignore[method-assign,assignment]
    with caplog.at_level(logging.ERROR, logger="defrag.daemon.service"):
        daemon._safe_cycle()
    [record] = [r for r in caplog.records if r.getMessage().startswith("cycle failed")]
    assert (record.exc_info is not None) is traceback
    assert str(error).strip("'") in record.getMessage() or traceback


def test_make_room_now_outside_the_window_leaves_the_window_gauge_at_0(tmp_path: Path) -> None:
    rules = tmp_path / "starvation.yaml"
    text = (default_rules_dir() / "starvation.yaml").read_text()
    rules.write_text(text.replace("action: make-room\n", "action: make-room-now\n"))
    # The simulated clock starts at 01:50; the nightly window opens at 02:00.
    _, daemon = sim_daemon((Window("0 2 * * *", 3600),), dry_run=False, rules_dir=tmp_path)
    result = daemon.run_once()
    assert result.executed is not None and result.executed.evicted  # room made at once
    assert b"defrag_window_open 0.0" in daemon.metrics.exposition()


def test_windows_open_and_close_on_their_cron_with_the_wall_clock() -> None:
    # The nightly window, 02:00-03:00 UTC; the real clock is frozen and moved by hand.
    sim, daemon = sim_daemon((Window("0 2 * * *", 3600),), dry_run=False, clock=SystemClock())
    # ignore: freezegun scans every module; the kubernetes client's lazy models would be
    # imported (and their pydantic schemas built) mid-scan, with datetime already faked.
    with freeze_time("2026-01-05 01:59:00", tz_offset=0, ignore=["kubernetes"]) as frozen:
        before = daemon.run_once()
        assert not before.window.open and before.executed is None and sim.evictions == []
        frozen.move_to("2026-01-05 02:00:00")
        inside = daemon.run_once()
        assert inside.window.open and inside.window.start == datetime(2026, 1, 5, 2, tzinfo=UTC)
        assert inside.executed is not None and inside.executed.evicted
        frozen.move_to("2026-01-05 03:00:00")
        after = daemon.run_once()
        assert not after.window.open and after.executed is None
        assert "next opens 2026-01-06T02:00:00+00:00" in after.window.reason


def test_scheduler_runs_cycles_and_stop_releases_everything() -> None:
    _, daemon = sim_daemon(cycle_interval_s=3600)
    released: list[bool] = []
    daemon.elector.release = lambda: released.append(True)  # type: ignore[method-assign]
    daemon.start()  # the first cycle runs at once
    deadline = time.monotonic() + 10
    while daemon.health.last_result is None and time.monotonic() < deadline:
        time.sleep(0.05)
    daemon.stop()
    assert daemon.health.last_result is not None
    assert daemon.ports.executor is not None and daemon.ports.executor.stop_requested.is_set()
    assert released == [True] and daemon.stopped.is_set()


def test_sigterm_stops_the_daemon_cleanly() -> None:
    port = free_port()
    env = {
        **os.environ,
        "DEFRAG_HTTP__PORT": str(port),
        "DEFRAG_HTTP__HOST": "127.0.0.1",
        "DEFRAG_SIM__SPEEDUP": "1",
        "DEFRAG_LOGGING__FORMAT": "json",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", "from defrag.cli import main; main()", "run", "--cluster", "sim"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        ready = (0, "")
        while time.monotonic() < deadline:
            try:
                ready = get(f"http://127.0.0.1:{port}/readyz")
                if ready[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert ready == (200, "ok\n")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert '"message": "signal 15: finishing the current step and stopping"' in err


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"cluster.kind": "sim", "detection.rules_dir": "/nonexistent"}, "/nonexistent"),
        ({"cluster.kind": "sim", "alerts.urls": ["ftp://x"]}, "setting alerts.urls"),
    ],
)
def test_bad_wiring_settings_name_what_is_wrong(overrides: dict[str, object], message: str) -> None:
    from defrag.settings import SettingsError

    with pytest.raises(SettingsError, match=message):
        build(load_settings(None, overrides))


class Toggle:
    def __init__(self) -> None:
        self.leader = False

    def is_leader(self) -> bool:
        return self.leader

    def release(self) -> None:
        return None


def test_a_replica_reconciles_when_it_becomes_leader() -> None:
    from defrag.execute.journal import JournalStep, new_journal
    from defrag.model.resources import DRAIN_TAINT_KEY

    sim, daemon = sim_daemon(dry_run=False, elector=Toggle())
    # The previous leader died mid-drain on gpu-00.
    sim.taint_node("gpu-00", DRAIN_TAINT_KEY, "plan-old", "NoSchedule")
    sim.annotate_node(
        "gpu-00",
        new_journal(
            "gpu-00", "plan-old", sim.clock.now(), (JournalStep("inference/chat-004"),)
        ).annotations(),
    )
    follower = daemon.run_once()
    assert not follower.leader and sim.snapshot().node("gpu-00").taints != ()
    daemon.elector.leader = True  # type: ignore[attr-defined]
    daemon.run_once()
    assert sim.snapshot().node("gpu-00").taints == ()
    assert next(e.reason for e in sim.events if e.kind == "Node") == "DefragReconciled"


def test_checkpoint_handshakes_are_counted_on_metrics_by_result() -> None:
    """Every result is on /metrics from the start at 0; an execution's outcomes add to theirs
    (an outcome with no handshake adds to none)."""
    from dataclasses import replace

    from prometheus_client import generate_latest

    from defrag.execute.outcome import Execution, StepOutcome

    sim, daemon = sim_daemon()
    text = generate_latest(daemon.metrics.registry).decode()
    for result in ("checkpointed", "deadline-passed", "gone", "request-failed", "would-ask"):
        assert f'defrag_checkpoint_requests_total{{result="{result}"}} 0.0' in text, result
    cycle = daemon.run_once()
    now = sim.clock.now()
    steps = (
        StepOutcome("ml/a", "n1", "n2", "migrate", "evicted", checkpoint="checkpointed"),
        StepOutcome("ml/b", "n1", "n2", "migrate", "evicted", checkpoint="checkpointed"),
        StepOutcome("ml/c", "n1", "n2", "migrate", "evicted", checkpoint="deadline-passed"),
        StepOutcome("ml/d", "n1", "n2", "migrate", "evicted"),
    )
    daemon.metrics.record(replace(cycle, executed=Execution("p", False, "w", now, now, steps)), 0.1)
    text = generate_latest(daemon.metrics.registry).decode()
    assert 'defrag_checkpoint_requests_total{result="checkpointed"} 2.0' in text
    assert 'defrag_checkpoint_requests_total{result="deadline-passed"} 1.0' in text
    assert 'defrag_checkpoint_requests_total{result="gone"} 0.0' in text


def test_the_cycle_report_names_the_pods_asked_or_that_would_be_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dataclasses import replace

    from defrag.cli.run import print_cycle
    from defrag.execute.outcome import Execution, StepOutcome

    sim, daemon = sim_daemon()
    cycle = daemon.run_once()
    now = sim.clock.now()
    steps = (
        StepOutcome("ml/a", "n1", "n2", "migrate", "planned", checkpoint="would-ask"),
        StepOutcome("ml/b", "n1", "n2", "migrate", "planned", checkpoint="would-ask"),
        StepOutcome("ml/c", "n1", "n2", "migrate", "planned"),
    )
    capsys.readouterr()
    print_cycle(replace(cycle, executed=Execution("p", True, "w", now, now, steps)))
    out = capsys.readouterr().out
    assert "checkpoint would ask: ml/a, ml/b" in out
    assert "ml/c" not in out


def test_each_cycle_is_handed_the_packing_finding_the_last_one_left_standing() -> None:
    """The daemon carries the patience's memory from cycle to cycle: the second cycle, whose
    detection finds no packing, still has the first cycle's finding (its result's
    ``packing``), and a failed cycle in between does not drop it."""
    from dataclasses import replace

    from defrag.detect.findings import Finding

    _, daemon = sim_daemon()
    detector = daemon.ports.detector
    calls = {"n": 0}

    def detect(cluster: object, now: datetime, profile: object) -> object:
        calls["n"] += 1
        if calls["n"] == 2:
            raise MetricsError("Prometheus is down")
        got = detector(cluster, now, profile)  # type: ignore[arg-type]
        if calls["n"] == 1:
            packs = Finding("packing", "cluster", "info", "packs", since=now)
            return replace(got, findings=(*got.findings, packs))  # type: ignore[type-var]
        return got

    daemon.ports = replace(daemon.ports, detector=detect)  # type: ignore[arg-type]
    first = daemon.run_once()
    assert first.packing is not None and first.packing.summary == "packs"
    with pytest.raises(MetricsError):
        daemon.run_once()
    third = daemon.run_once()
    assert not any(f.kind == "packing" for f in third.findings)
    assert third.packing is first.packing
