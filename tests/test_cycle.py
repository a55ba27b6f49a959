"""One cycle over the simulated cluster with the real detector and planner; fakes at the edges."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from defrag.adapters.simcluster import SIM_START, SimClock, SimCluster, fragmented_cluster
from defrag.cli.run import _detector, _planner, default_rules_dir
from defrag.cycle import CycleConfig, CyclePorts, goal_for, run_cycle
from defrag.detect.findings import Finding
from defrag.execute import Budgets, Executor, ExecutorSettings, Window
from defrag.plan.model import Blocked, Plan
from defrag.rules import load_rules
from defrag.settings import load_settings

ALWAYS = (Window("* * * * *", 120),)  # every minute, two minutes long: always open
NIGHTLY = (Window("0 2 * * *", 3600),)  # the simulated clock starts at 01:50: closed


class RecordingSink:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.times: list[datetime] = []
        self.fail = fail

    def sync(self, findings: Sequence[Finding], now: datetime) -> None:
        self.calls.append(sorted(f.kind for f in findings))
        self.times.append(now)
        if self.fail:
            raise ConnectionError("alertmanager unreachable")


def ports(sink: RecordingSink | None = None, **overrides: object) -> tuple[SimCluster, CyclePorts]:
    clock = SimClock(speedup=0)
    sim = SimCluster(fragmented_cluster(), clock)
    settings = load_settings(None, {"max_evictions_per_namespace": 20, **overrides})
    executor = Executor(
        sim,
        sim,
        clock,
        ExecutorSettings(Budgets(20, 8, 20), replacement_timeout_s=300, poll_interval_s=10),
        sleep=clock.sleep,
    )
    rules = load_rules([default_rules_dir()])
    return sim, CyclePorts(sim, clock, _detector(rules, None), _planner(settings), executor, sink)


def test_dry_run_plans_rehearses_and_expects_a_larger_job() -> None:
    sink = RecordingSink()
    sim, p = ports(sink)
    result = run_cycle(p, CycleConfig(dry_run=True, windows=ALWAYS))
    assert result.plan is not None and result.plan.steps
    assert result.executed is not None and set(result.executed.counts) == {"planned"}
    assert sim.evictions == []
    # 20 free GPUs one or two per node: 2 before; the plan frees a whole node: 8 after.
    assert (result.before["largest_placeable_job"], result.after["largest_placeable_job"]) == (2, 8)
    assert result.after_source == "expected"
    assert sink.calls == [sorted(f.kind for f in result.findings)]
    doc = result.to_dict()
    assert set(doc) >= {"findings", "plan", "executed", "before", "after"}


def test_live_cycle_in_an_open_window_moves_pods_and_verifies() -> None:
    sim, p = ports()
    result = run_cycle(p, CycleConfig(dry_run=False, windows=ALWAYS))
    assert result.executed is not None and result.executed.evicted
    assert result.after_source == "observed"
    # The starving 8-GPU job took the room the plan made: verified by the target placed, not
    # by the figures (the job consumed the whole node the plan freed).
    assert result.verification is not None and result.verification["met"]
    assert "research/train-llm-0" in result.verification["targets_placed"]
    assert sim.snapshot().pods["research/train-llm-0"].node is not None


@pytest.mark.parametrize(
    ("windows", "leader", "reason"),
    [(NIGHTLY, True, "outside every execution window"), (ALWAYS, False, "follower")],
)
def test_no_execution_outside_windows_or_for_a_follower(
    windows: tuple[Window, ...], leader: bool, reason: str
) -> None:
    sink = RecordingSink()
    sim, p = ports(sink)
    result = run_cycle(p, CycleConfig(dry_run=False, windows=windows), leader=leader)
    assert result.plan is not None and result.plan.steps  # it still plans and reports
    assert result.executed is None and sim.evictions == []
    assert sim.events == []
    if leader:
        assert reason in result.window.reason
    else:
        assert sink.calls == []  # only the leader sends alerts


def test_idle_gate_holds_execution_until_an_idle_finding() -> None:
    sim, p = ports()
    # No metrics in the simulated cluster: the idle detector finds nothing, so the gate holds.
    result = run_cycle(p, CycleConfig(dry_run=False, windows=ALWAYS, idle_gate=True))
    assert not result.window.open and "idle gate" in result.window.reason
    assert result.executed is None and sim.evictions == []
    idle = Finding("idle", "cluster", "info", "quiet", action="alert")
    gated = CyclePorts(
        p.source, p.clock, lambda c, now: [*p.detector(c, now), idle], p.planner, p.executor, None
    )
    run_cycle(gated, CycleConfig(dry_run=False, windows=ALWAYS, idle_gate=True))
    assert sim.evictions


def test_failed_alert_delivery_is_recorded_not_fatal() -> None:
    _, p = ports(RecordingSink(fail=True))
    result = run_cycle(p, CycleConfig(dry_run=True))
    assert result.alert_error == "ConnectionError: alertmanager unreachable"
    assert result.plan is not None


def test_open_breaker_blocks_execution_and_is_reported_every_cycle() -> None:
    sink = RecordingSink()
    sim, p = ports(sink)
    assert p.executor is not None
    p.executor.breaker.trip(("research/train-llm-0",), "test: stuck", SIM_START)
    for _ in range(2):
        result = run_cycle(p, CycleConfig(dry_run=False, windows=ALWAYS))
        assert result.executed is None and result.circuit["open"]
    assert all("circuit-open" in kinds for kinds in sink.calls) and len(sink.calls) == 2
    assert sim.evictions == []


def test_empty_plan_with_blocked_pods_raises_a_plan_blocked_finding() -> None:
    plan = Plan(
        "repack",
        "reserve-binpack",
        (),
        (Blocked("a/b", "pdb", "0 left"), Blocked("a/c", "pdb", "0 left")),
    )
    _, p = ports()
    blocked = CyclePorts(p.source, p.clock, p.detector, lambda c, g, now: plan, p.executor, None)
    result = run_cycle(blocked, CycleConfig())
    found = [f for f in result.findings if f.kind == "plan-blocked"]
    assert len(found) == 1 and "2 pod(s) blocked (2 by pdb)" in found[0].summary


def finding(action: str) -> Finding:
    return Finding("fragmentation", f"node/{action}", "warning", "x", action=action)


@pytest.mark.parametrize(
    ("actions", "configured", "goal"),
    [
        ([], "auto", None),
        (["alert"], "auto", None),
        (["repack", "repack"], "auto", "repack"),
        (["make-room"], "auto", "make-room"),
        (["repack", "make-room", "alert"], "auto", "all"),
        ([], "repack", "repack"),  # a configured goal plans even with nothing found
    ],
)
def test_goal_follows_the_findings_actions(
    actions: list[str], configured: str, goal: str | None
) -> None:
    assert goal_for([finding(a) for a in actions], configured) == goal


def test_cycle_uses_the_clock_it_is_given() -> None:
    sim, p = ports()
    sim.clock.sleep(timedelta(hours=1).total_seconds())
    result = run_cycle(p, CycleConfig())
    assert result.started == SIM_START + timedelta(hours=1)


def test_alerts_carry_wall_clock_time_under_a_simulated_clock() -> None:
    # The simulated clock starts at SIM_START (months away from now); Alertmanager expires
    # alerts by its own clock, so the sink must be given real time.
    sink = RecordingSink()
    _, p = ports(sink)
    result = run_cycle(p, CycleConfig())
    assert result.started == SIM_START
    assert abs((sink.times[0] - datetime.now(UTC)).total_seconds()) < 60
