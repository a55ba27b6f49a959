"""One cycle over the simulated cluster with the real detector and planner; fakes at the edges."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from defrag.adapters.simcluster import SIM_START, SimClock, SimCluster, fragmented_cluster
from defrag.cli.run import _detector, _planner, default_rules_dir
from defrag.daemon.cycle import CyclePorts, run_cycle
from defrag.daemon.service import DaemonMetrics, cycle_summary
from defrag.decide import CycleConfig, Detected, goal_for
from defrag.detect.findings import Finding
from defrag.execute import EvictionBudget, Executor, ExecutorSettings, Window
from defrag.execute.mode import RunMode
from defrag.model.cluster import Cluster
from defrag.model.resources import OwnerRef, Pod
from defrag.plan.model import Blocked, Plan
from defrag.rules import load_rules
from defrag.scoring.profile import ProfileConfig
from defrag.settings import load_settings

ALWAYS = (Window("* * * * *", 120),)  # every minute, two minutes long: always open
NIGHTLY = (Window("0 2 * * *", 3600),)  # the simulated clock starts at 01:50: closed


class RecordingSink:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.take_overs = 0
        self.times: list[datetime] = []
        self.fail = fail

    def sync(
        self, findings: Sequence[Finding], now: datetime, held_rules: Collection[str] = ()
    ) -> None:
        self.held = tuple(held_rules)
        self.calls.append(sorted(f.kind for f in findings))
        self.times.append(now)
        if self.fail:
            raise ConnectionError("alertmanager unreachable")

    def take_over(self) -> None:
        self.take_overs += 1


LIVE = RunMode.live()


def ports(
    sink: RecordingSink | None = None,
    rules_dir: Path | None = None,
    cluster: Cluster | None = None,
    mode: RunMode = RunMode(),
    **overrides: object,
) -> tuple[SimCluster, CyclePorts]:
    clock = SimClock(speedup=0)
    sim = SimCluster(cluster or fragmented_cluster(), clock)
    settings = load_settings(None, {"windows.max_evictions_per_namespace": 20, **overrides})
    executor = Executor(
        sim,
        sim,
        clock,
        ExecutorSettings(EvictionBudget(20, 8, 20), replacement_timeout_s=300, poll_interval_s=10),
        mode=mode,
        sleep=clock.sleep,
    )
    rules = load_rules([rules_dir or default_rules_dir()])
    return sim, CyclePorts(sim, clock, _detector(rules, None), _planner(settings), executor, sink)


def test_dry_run_plans_rehearses_and_expects_a_larger_job() -> None:
    sink = RecordingSink()
    sim, p = ports(sink)
    result = run_cycle(p, CycleConfig(windows=ALWAYS))
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
    sim, p = ports(mode=LIVE)
    result = run_cycle(p, CycleConfig(windows=ALWAYS))
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
    sim, p = ports(sink, mode=LIVE)
    result = run_cycle(p, CycleConfig(windows=windows), leader=leader)
    assert result.plan is not None and result.plan.steps  # it still plans and reports
    assert result.executed is None and sim.evictions == []
    assert sim.events == []
    if leader:
        assert reason in result.window.reason
    else:
        assert sink.calls == []  # only the leader sends alerts


def test_idle_gate_holds_execution_until_an_idle_finding() -> None:
    sim, p = ports(mode=LIVE)
    # No metrics in the simulated cluster: the idle detector finds nothing, so the gate holds.
    result = run_cycle(p, CycleConfig(windows=ALWAYS, idle_gate=True))
    assert not result.window.open and "idle gate" in result.window.reason
    assert result.executed is None and sim.evictions == []
    idle = Finding("idle", "cluster", "info", "quiet", action="alert")
    gated = CyclePorts(
        p.source,
        p.clock,
        lambda c, now, prof: [*p.detector(c, now, prof), idle],
        p.planner,
        p.executor,
        None,
    )
    run_cycle(gated, CycleConfig(windows=ALWAYS, idle_gate=True))
    assert sim.evictions


def test_failed_alert_delivery_is_recorded_not_fatal() -> None:
    _, p = ports(RecordingSink(fail=True))
    result = run_cycle(p, CycleConfig())
    assert result.alert_error == "ConnectionError: alertmanager unreachable"
    assert result.plan is not None


def test_open_breaker_blocks_execution_and_is_reported_every_cycle() -> None:
    sink = RecordingSink()
    sim, p = ports(sink, mode=LIVE)
    assert p.executor is not None
    p.executor.breaker.trip(("research/train-llm-0",), "test: stuck", SIM_START)
    for _ in range(2):
        result = run_cycle(p, CycleConfig(windows=ALWAYS))
        assert result.executed is None and result.circuit["open"]
    assert all("circuit-open" in kinds for kinds in sink.calls) and len(sink.calls) == 2
    assert sim.evictions == []


@pytest.mark.parametrize(
    ("blocked", "summary"),
    [
        (
            (Blocked("a/b", "pdb", "0 left"), Blocked("a/c", "pdb", "0 left")),
            "2 pod(s) blocked (2 by pdb)",
        ),
        # not worth it yet (the pod has waited too little for the work a room loses): no alert
        ((Blocked("a/b", "not-worth-it", "0.1 < 2.0 GPU-h"),), None),
        # a real fault beside it is still said, and only the fault is counted
        (
            (Blocked("a/b", "not-worth-it", "0.1 < 2.0 GPU-h"), Blocked("a/c", "gang", "1 of 4")),
            "1 pod(s) blocked (1 by gang)",
        ),
    ],
)
def test_empty_plan_with_blocked_pods_raises_a_plan_blocked_finding(
    blocked: tuple[Blocked, ...], summary: str | None
) -> None:
    plan = Plan("repack", "reserve-binpack", (), blocked)
    _, p = ports()
    stuck = CyclePorts(
        p.source,
        p.clock,
        p.detector,
        lambda c, g, now, profile, pods=None, spent=None, history=None: plan,
        p.executor,
        None,
    )
    result = run_cycle(stuck, CycleConfig())
    found = [f.summary for f in result.findings if f.kind == "plan-blocked"]
    assert found == ([f"no repack plan possible: {summary}"] if summary else [])


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


def urgent_rules(tmp_path: Path) -> Path:
    """The shipped rules, with the starvation rule's action set to make-room-now."""
    for source in default_rules_dir().glob("*.yaml"):
        text = source.read_text()
        if source.name == "starvation.yaml":
            assert "action: make-room\n" in text
            text = text.replace("action: make-room\n", "action: make-room-now\n")
        (tmp_path / source.name).write_text(text)
    return tmp_path


def test_make_room_now_executes_outside_the_windows(tmp_path: Path) -> None:
    sim, p = ports(rules_dir=urgent_rules(tmp_path), mode=LIVE)
    result = run_cycle(p, CycleConfig(windows=NIGHTLY))  # 01:50, window at 02:00
    assert result.window.open
    assert "outside every execution window" in result.window.reason
    assert "make-room-now for 1 starved pod(s)" in result.window.reason
    assert result.window.key == "outside-windows/2026-01-05"  # budgets counted per UTC day
    # Only make-room, for the pod the rule found — the fragmentation rule's repack waits.
    assert result.plan is not None and result.plan.goal == "make-room"
    assert result.executed is not None and result.executed.evicted
    assert sim.snapshot().pods["research/train-llm-0"].node is not None


def test_make_room_waits_for_the_window(tmp_path: Path) -> None:
    # The same cluster and rules but action make-room (the shipped one): nothing runs at 01:50.
    sim, p = ports(mode=LIVE)
    result = run_cycle(p, CycleConfig(windows=NIGHTLY))
    assert not result.window.open and result.executed is None and sim.evictions == []


def test_room_is_made_only_for_pods_a_rule_found() -> None:
    # A priority-500 pod pending for one minute: above the inference pods (100), so make-room
    # could evict them for it, but below the rule's min_priority (1000) and its `for` (15m).
    etl = Pod(
        "etl-0",
        namespace="batch",
        num_gpu=4,
        cpu_milli=1000,
        priority=500,
        owner=OwnerRef("Job", "etl"),
        phase="Pending",
        created_at=SIM_START - timedelta(minutes=1),
        pending_since=SIM_START - timedelta(minutes=1),
    )
    cluster = fragmented_cluster().with_pod_added(etl)
    _, p = ports(cluster=cluster)
    result = run_cycle(p, CycleConfig(windows=ALWAYS))
    assert result.plan is not None
    targets = " ".join(result.plan.targets)
    assert "research/train-llm-0" in targets and "batch/etl-0" not in targets
    # Asked for every pending pod, the planner makes room for it too: the rule kept it out.
    profile = ProfileConfig().for_cluster(cluster)
    everyone = p.planner(cluster, "make-room", SIM_START, profile=profile, pods=None)
    assert "batch/etl-0" in " ".join(everyone.targets)


def test_skipped_rules_travel_in_the_cycle_result_to_the_daemon_metrics() -> None:
    """Without Prometheus the shipped metric rules (leak, idle) are skipped: the reason is in
    the cycle's result, and recording the result sets their gauge (no side channel)."""
    from defrag.daemon.service import DaemonMetrics
    from defrag.detection import NO_METRICS_SOURCE

    _, p = ports()
    result = run_cycle(p, CycleConfig(windows=ALWAYS))
    rules = load_rules([default_rules_dir()])
    metric_rules = {r.rule.name for r in rules.enabled() if r.rule.detector in ("leak", "idle")}
    assert metric_rules and dict(result.rules_skipped) == dict.fromkeys(
        metric_rules, NO_METRICS_SOURCE
    )
    metrics = DaemonMetrics()
    metrics.record(result, 0.1)
    text = metrics.exposition().decode()
    for name in metric_rules:
        assert f'defrag_rule_skipped{{rule="{name}"}} 1.0' in text


def without_priorities(train_gpus: int = 8, pending_for: timedelta = timedelta(hours=2)) -> Cluster:
    """:func:`fragmented_cluster` as a cluster without PriorityClasses: every inference pod and
    the pending training job at priority 0 (the DaemonSet pods keep theirs); the job asks
    ``train_gpus`` and has waited ``pending_for``."""
    base = fragmented_cluster()
    pods = []
    for pod in base.pods.values():
        if pod.namespace == "inference":
            pod = replace(pod, priority=0)
        elif pod.key == "research/train-llm-0":
            since = SIM_START - pending_for
            pod = replace(
                pod, priority=0, priority_class="", num_gpu=train_gpus, gang="",
                created_at=since, pending_since=since,
            )  # fmt: skip
        pods.append(pod)
    return Cluster.build(list(base.nodes), pods, base.pdbs)


@pytest.mark.parametrize(
    ("cluster", "reason", "room"),
    [
        # 20 GPUs free, 1–2 per node: an 8-GPU job of priority 0 waits for fragmentation only
        (without_priorities(), "fragmented", True),
        # 24 > 20 GPUs free: only preemption could help, and the rule leaves it to the scheduler
        (without_priorities(train_gpus=24), None, False),
        # fragmented, but pending 20 min, under the rule's 30 min `for`
        (without_priorities(pending_for=timedelta(minutes=20)), None, False),
    ],
)
def test_a_cluster_without_priority_classes_gets_room_for_a_fragmented_job(
    cluster: Cluster, reason: str | None, room: bool
) -> None:
    _, p = ports(cluster=cluster)
    result = run_cycle(p, CycleConfig(windows=ALWAYS))
    starved = [f for f in result.findings if f.kind == "starvation"]
    assert [(f.labels["rule"], f.evidence["reason"]) for f in starved] == (
        [("fragmented-starved", reason)] if reason else []
    )
    if not room:  # no pod waits: the fragmentation rule's repack alone serves no one
        assert result.plan is None
        return
    assert result.plan is not None
    assert any("research/train-llm-0" in t for t in result.plan.targets) is room
    # the room's steps (the fragmentation rule's repack may add its own, for no pod)
    room_steps = [s for s in result.plan.steps if s.for_pod == "research/train-llm-0"]
    assert bool(room_steps) is room
    # victims of the job's own priority (0) are only moved where they re-fit, never preempted
    assert all(s.kind == "migrate" and s.target for s in result.plan.steps)


PACKS = Finding("packing", "cluster", "info", "the scheduler packs GPU pods: of 280 …")


def finding_also(p: CyclePorts, *extra: Finding) -> CyclePorts:
    """The ports with a detector that finds what theirs does, and ``extra``."""
    detector = p.detector

    def detect(cluster: Cluster, now: datetime, profile: object) -> object:
        got = detector(cluster, now, profile)  # type: ignore[arg-type]
        assert isinstance(got, Detected)
        return replace(got, findings=(*got.findings, *extra))

    return replace(p, detector=detect)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("packing", "patience_s", "room"),
    [
        # the scheduler packs and the patience is null: no room while it does
        (True, None, False),
        # a patience of 24 h: the job has waited 2 h < 24 h, held back
        (True, 86400.0, False),
        # a patience of 1 h: 2 h ≥ 1 h → room
        (True, 3600.0, True),
        # no packing finding (a spreading scheduler, or thin evidence): room as ever
        (False, None, True),
    ],
)
def test_make_room_waits_for_departures_while_the_scheduler_packs(
    packing: bool, patience_s: float | None, room: bool
) -> None:
    overrides = {} if patience_s is None else {"planner.make_room_packing_patience_s": patience_s}
    patience = load_settings(None, overrides).packing_patience()
    if patience_s is None:  # the setting's null (a flag cannot say null)
        patience = replace(patience, patience=None)
    _, p = ports(cluster=without_priorities())
    p = finding_also(p, *([PACKS] if packing else []))
    result = run_cycle(p, CycleConfig(windows=ALWAYS, patience=patience))
    # the starvation finding stays (it is alerted either way)
    assert any(f.kind == "starvation" for f in result.findings)
    steps = result.plan.steps if result.plan is not None else ()
    assert any(s.for_pod == "research/train-llm-0" for s in steps) is room
    if room:
        assert result.held_back == {}
    else:
        (why,) = result.held_back.values()
        assert list(result.held_back) == ["research/train-llm-0"]
        # what an operator of the running daemon sees: the cycle's log line and the gauge
        assert "; 1 starved pod(s) held back: the scheduler packs;" in cycle_summary(result)
        metrics = DaemonMetrics()
        metrics.record(result, 0.1)
        assert "defrag_make_room_held_back 1.0" in metrics.exposition().decode()
        limit = "makes no room" if patience_s is None else "waits 24 h before making room"
        assert why.startswith(f"held-back: pending 2 h; make-room {limit} while the scheduler")


@pytest.mark.parametrize(
    ("now_found", "memory_s", "room"),
    [
        # the rule says nothing this cycle (its share dipped under the bar): the finding of a
        # cycle 1 h ago stands (1 h ≤ the 24 h default memory), the pod is held back
        ("nothing", None, False),
        # a memory of 0: only the cycle that finds it
        ("nothing", 0.0, True),
        # the scheduler is found spreading now: the older finding does not stand
        ("spreading", None, True),
    ],
)
def test_a_packing_finding_stands_across_cycles_for_the_memory(
    now_found: str, memory_s: float | None, room: bool
) -> None:
    overrides = {} if memory_s is None else {"planner.make_room_packing_memory_s": memory_s}
    settings = load_settings(None, overrides)
    _, p = ports(cluster=without_priorities())
    earlier = Finding(
        "packing", "cluster", "info", "packs", since=p.clock.now() - timedelta(hours=1)
    )
    spreads = Finding("spreading", "cluster", "info", "spreads", since=p.clock.now())
    p = finding_also(p, *([spreads] if now_found == "spreading" else []))
    # a patience of null holds every starved pod back while the finding stands
    patience = replace(settings.packing_patience(), patience=None)
    config = CycleConfig(windows=ALWAYS, patience=patience)
    result = run_cycle(p, config, last_packing=earlier)
    steps = result.plan.steps if result.plan is not None else ()
    assert any(s.for_pod == "research/train-llm-0" for s in steps) is room
    # what the next cycle is handed: the finding while it stands
    assert result.packing is (None if room else earlier)
    if not room:
        assert "as of " in result.held_back["research/train-llm-0"]
