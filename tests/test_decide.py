"""The daemon's decision (defrag.decide): which goal, which pods, which window and whose budget a
cycle's plan has, whatever drives it (the daemon's cycle, the simulator)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from defrag.decide import URGENT_BUDGET_KEY, CycleConfig, decide, may_act
from defrag.detect.findings import Finding
from defrag.execute.windows import EarlyWindows, Window, WindowStatus
from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.plan.config import EvictionBudget, Goal
from defrag.plan.constraints import NOT_WORTH
from defrag.plan.history import NO_HISTORY, History
from defrag.plan.model import Blocked, Plan
from defrag.plan.patience import PackingPatience
from defrag.plan.spend import BudgetLedger
from defrag.scoring.profile import ProfileConfig, ScoringProfile

NOW = datetime(2026, 1, 1, 1, 0, tzinfo=UTC)
OPEN = (Window("0 0 * * *", 7200),)  # 00:00–02:00
CLOSED = (Window("0 12 * * *", 3600),)
CLUSTER = Cluster.build([], [])
PROFILE = ProfileConfig().for_cluster(CLUSTER)


def starved(name: str, action: str = "make-room", waited_h: float = 1.0) -> Finding:
    return Finding(
        "starvation", f"pod/default/{name}", "warning", "starved",
        since=NOW - timedelta(hours=waited_h), action=action,
    )  # fmt: skip


FRAGMENTED = Finding("fragmentation", "node/a", "info", "fragmented", action="repack")
PACKING = Finding("packing", "cluster", "info", "the scheduler packs", since=NOW)


@dataclass
class Planner:
    """Records what the decision asked for; answers with ``blocked`` and no steps."""

    blocked: tuple[Blocked, ...] = ()
    calls: list[tuple[Goal, frozenset[str] | None, BudgetLedger | None]] = field(
        default_factory=list
    )
    histories: list[History] = field(default_factory=list)

    def __call__(
        self,
        cluster: Cluster,
        goal: Goal,
        now: datetime,
        *,
        profile: ScoringProfile,
        pods: frozenset[str] | None = None,
        spent: BudgetLedger | None = None,
        history: History = NO_HISTORY,
    ) -> Plan:
        self.calls.append((goal, pods, spent))
        self.histories.append(history)
        return Plan(goal.value, profile.name, (), self.blocked)


@pytest.mark.parametrize(
    ("findings", "on_demand", "goal", "pods"),
    [
        # on demand (the default): a repack serves the starved pods make-room leaves waiting
        ([FRAGMENTED], True, None, None),
        ([starved("a")], True, Goal.ALL, {"default/a"}),
        ([starved("a"), FRAGMENTED], True, Goal.ALL, {"default/a"}),
        # off: the findings' actions alone
        ([FRAGMENTED], False, Goal.REPACK, frozenset()),
        ([starved("a")], False, Goal.MAKE_ROOM, {"default/a"}),
        ([starved("a"), FRAGMENTED], False, Goal.ALL, {"default/a"}),
        ([], False, None, None),
    ],
)
def test_the_goal_follows_the_findings_and_repacks_on_demand(
    findings: list[Finding], on_demand: bool, goal: Goal | None, pods: set[str] | None
) -> None:
    planner = Planner()
    config = CycleConfig(windows=OPEN, repack_on_demand=on_demand)
    decision = decide(CLUSTER, findings, NOW, config, planner, PROFILE)
    assert decision.goal is goal and decision.window.open
    if goal is None:
        assert planner.calls == [] and decision.plan is None
    else:
        assert planner.calls[0][:2] == (goal, frozenset(pods or ()))


def test_outside_the_windows_only_make_room_now_pods_get_a_plan_on_the_days_budget() -> None:
    planner = Planner()
    ledger = BudgetLedger(EvictionBudget(5), "x", 2)
    asked: list[WindowStatus] = []

    def spent(window: WindowStatus) -> BudgetLedger:
        asked.append(window)
        return ledger

    findings = [starved("a", "make-room-now"), starved("b")]
    config = CycleConfig(windows=CLOSED)
    decision = decide(CLUSTER, findings, NOW, config, planner, PROFILE, spent=spent)
    assert decision.window.open and decision.window.key == URGENT_BUDGET_KEY.format(
        day="2026-01-01"
    )
    assert planner.calls == [(Goal.MAKE_ROOM, frozenset({"default/a"}), ledger)]
    assert asked == [decision.window]  # the ledger port is asked for that window's spend
    # the simulator, which only acts, makes no plan while the windows are closed
    quiet = Planner()
    closed = decide(CLUSTER, [starved("b")], NOW, config, quiet, PROFILE, plan_closed=False)
    assert not closed.window.open and closed.plan is None and quiet.calls == []
    shown = decide(CLUSTER, [starved("b")], NOW, config, quiet, PROFILE)  # the daemon reports it
    assert shown.plan is not None and quiet.calls[0][2] is None


def test_while_the_scheduler_packs_the_starved_pods_are_held_back_and_nothing_is_planned() -> None:
    planner = Planner()
    config = CycleConfig(windows=OPEN, patience=PackingPatience(timedelta(hours=2)))
    findings = [starved("a", waited_h=1.0), starved("b", waited_h=3.0), PACKING]
    decision = decide(CLUSTER, findings, NOW, config, planner, PROFILE)
    assert (
        set(decision.held_back) == {"default/a"} and "held-back" in decision.held_back["default/a"]
    )
    assert planner.calls[0][1] == frozenset({"default/b"})
    assert decision.packing is PACKING
    # every pod held: no plan (a repack would serve none of them)
    held = decide(CLUSTER, [*findings[:1], PACKING], NOW, config, Planner(), PROFILE)
    assert held.plan is None and held.goal is None
    # the verdict stands from an earlier cycle for the patience's memory
    later = NOW + timedelta(hours=23)
    kept = decide(CLUSTER, [], later, config, Planner(), PROFILE, last_packing=PACKING)
    assert kept.packing is PACKING
    gone = decide(CLUSTER, [], NOW + timedelta(hours=25), config, Planner(), PROFILE,
                  last_packing=PACKING)  # fmt: skip
    assert gone.packing is None


def test_a_plan_every_pod_of_which_is_blocked_is_a_finding_unless_it_waits_for_its_worth() -> None:
    blocked = (Blocked("default/a", "pdb", "PodDisruptionBudget allows 0"),)
    decision = decide(CLUSTER, [starved("a")], NOW, CycleConfig(windows=OPEN), Planner(blocked),
                      PROFILE)  # fmt: skip
    assert [f.kind for f in decision.findings] == ["plan-blocked"]
    waiting = (Blocked("default/a", NOT_WORTH, "not yet"),)
    quiet = decide(CLUSTER, [starved("a")], NOW, CycleConfig(windows=OPEN), Planner(waiting),
                   PROFILE)  # fmt: skip
    assert quiet.findings == ()


def test_a_cycle_may_act_inside_a_window_or_when_a_rule_acts_outside_them() -> None:
    assert may_act(CycleConfig(windows=OPEN), NOW, urgent_rules=False)
    assert not may_act(CycleConfig(windows=CLOSED), NOW, urgent_rules=False)
    assert may_act(CycleConfig(windows=CLOSED), NOW, urgent_rules=True)
    assert not may_act(CycleConfig(), NOW, urgent_rules=False)  # no window configured


def test_a_window_opens_early_when_the_backlog_piles_up_and_stays_open_its_length() -> None:
    """The windows are closed (CLOSED: noon only); a starved 8-GPU pod pending 3 h is a backlog
    of 24 GPU-hours. At 01:00, the start of an hourly period, a window opens when the backlog
    reaches the bar, on the day's early-window budget; later in the hour it stays open for the
    cycle that remembers it, and at 01:30 no new one opens (checked at a period's start)."""
    pod = Pod("big", num_gpu=8, phase="Pending", created_at=NOW - timedelta(hours=3))
    cluster = Cluster.build([], [pod])
    findings = [starved("big", waited_h=3.0)]
    early = EarlyWindows(backlog_gpu_h=20.0, check_s=120.0)
    config = CycleConfig(windows=CLOSED, early=early)
    opened = decide(cluster, findings, NOW, config, Planner(), PROFILE, plan_closed=False)
    assert opened.backlog_gpu_h == pytest.approx(24.0)
    assert opened.window.open and opened.window.key == "backlog/2026-01-01"
    assert "backlog (24.0 GPU-hours)" in opened.window.reason and opened.plan is not None
    start = EarlyWindows.opened(opened.window)
    assert start == NOW
    later = NOW + timedelta(minutes=30)
    assert may_act(config, later, urgent_rules=False, opened_early=start)
    kept = decide(cluster, findings, later, config, Planner(), PROFILE, opened_early=start)
    assert kept.window.open and kept.window.end == NOW + timedelta(hours=1)
    assert not may_act(config, later, urgent_rules=False)
    fresh = decide(cluster, findings, later, config, Planner(), PROFILE, plan_closed=False)
    assert not fresh.window.open and fresh.plan is None
    # below the bar: nothing opens
    high = CycleConfig(windows=CLOSED, early=EarlyWindows(backlog_gpu_h=30.0))
    shut = decide(cluster, findings, NOW, high, Planner(), PROFILE, plan_closed=False)
    assert not shut.window.open and EarlyWindows.opened(shut.window) is None
