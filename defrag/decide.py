"""The daemon's decision: from one cycle's findings and cluster view to the plan it may carry out.

:func:`decide` is the one piece of code that says, each cycle, which starved pods get a room,
which wait (the packing patience and its memory), whether a repack serves anyone, which
window and whose budget the plan spends, and what the plan is. It reads the world only
through its arguments — the cluster view, the findings, the moment, the planner and the
window's spend (the ledger port) — and writes nothing. Two drivers call it:

* the daemon's cycle (:func:`defrag.daemon.cycle.run_cycle`), with the Kubernetes snapshot,
  the rules' findings, the wall clock and the executor's ledger (the Lease's record);
* the simulator (:mod:`defrag.sim.daemon_driver`), with the simulated cluster as a view, the
  same detectors run on it, the simulated clock and its own ledger of the same type.

Outside the windows, a starvation rule whose action is ``make-room-now`` still gets room made
for the pods it found (docs/daemon.md, "Windows"): the decision plans make-room for those pods
only, counted against a day's out-of-window budget (:data:`URGENT_BUDGET_KEY`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol

from defrag.detect.findings import Finding
from defrag.execute.windows import EarlyWindows, Window, WindowStatus, window_status
from defrag.model.cluster import Cluster
from defrag.model.units import GPU_MILLI
from defrag.model.utc import utc
from defrag.plan.config import Goal, PlannerConfig
from defrag.plan.constraints import NOT_WORTH
from defrag.plan.history import NO_HISTORY, History
from defrag.plan.model import Blocked, Plan
from defrag.plan.patience import STARVATION_KIND, PackingPatience, held_back
from defrag.plan.planner import OwnerLookup, make_plan, plan_with_owners
from defrag.plan.recent import DEFAULT_GUARD, RecentEvictions
from defrag.plan.recent import NONE as NO_EVICTIONS
from defrag.plan.spend import BudgetLedger
from defrag.scoring.profile import ProfileConfig, ScoringProfile


@dataclass(frozen=True, slots=True)
class Detected:
    """What a detector found, the rules it could not evaluate (rule → why) and the rules it
    skipped because their inputs are missing (rule → why)."""

    findings: tuple[Finding, ...]
    failed: Mapping[str, str] = field(default_factory=dict, hash=False)
    skipped: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)


Detector = Callable[[Cluster, datetime, ScoringProfile], "Sequence[Finding] | Detected"]
"""Findings for a cluster at a moment, scored with the cycle's profile for that cluster (the
daemon binds rules and metrics); a detector that can tell which rules it could not evaluate
returns :class:`Detected`."""


class Planner(Protocol):
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
        """A plan for a cluster, a goal (repack, make-room, all) and a moment, scored with the
        cycle's ``profile``; ``pods``: make room only for these pending pods (None: every
        pending pod that qualifies); ``spent``: what the plan's window has spent so far (the
        plan spends only what is left); ``history``: the daemon's recent evictions and the
        packing verdict."""
        ...


Spent = Callable[[WindowStatus], "BudgetLedger | None"]
"""The ledger port: what the window opening (or the day's out-of-window allowance) has spent
so far; None when nothing is counted (a driver that never acts)."""


URGENT = "make-room-now"
"""The finding action that asks for room even outside the execution windows."""
GOALS_BY_ACTION = {"repack": Goal.REPACK, "make-room": Goal.MAKE_ROOM, URGENT: Goal.MAKE_ROOM}
URGENT_BUDGET_KEY = "outside-windows/{day}"
"""Out-of-window make-room shares one set of per-window budgets per UTC day."""


@dataclass(frozen=True, slots=True)
class CycleConfig:
    """What the decision is configured with (``Settings.cycle_config()`` builds it)."""

    goal: str = "auto"
    """auto: from the findings' actions; or always repack / make-room / all."""
    windows: tuple[Window, ...] = ()
    idle_gate: bool = False
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    """The configured scoring profile; each cycle builds one :class:`ScoringProfile` from it
    for its snapshot and hands that to detection, the planner and the figures (``/metrics``)."""
    patience: PackingPatience = field(default_factory=PackingPatience)
    """How long make-room waits for departures while the scheduler packs
    (:mod:`defrag.plan.patience`)."""
    repack_on_demand: bool = True
    """(goal auto) Repack only for starved pods a window's make-room left without room: a
    repack finding alone plans nothing, and a make-room plan in a window may repack (the
    planner's ``PlanOptions.repack_on_demand`` decides when). False: the findings' actions
    alone say whether to repack."""
    early: EarlyWindows | None = None
    """Open a window early when the starved pods' backlog piles up (None: never)."""
    evict_again_after: timedelta | None = DEFAULT_GUARD
    """How long the daemon remembers its evictions (the planner's anti-thrash guard)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What one cycle decided: the window it is in, the plan (None: none) and why pods wait."""

    window: WindowStatus
    goal: Goal | None
    plan: Plan | None
    held_back: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Starved pods make-room did not serve this cycle because the scheduler packs → why."""
    packing: Finding | None = None
    """The packing finding that stood this cycle (the next cycle's ``last_packing``)."""
    findings: tuple[Finding, ...] = ()
    """The decision's own findings (a plan every pod of which is blocked)."""
    backlog_gpu_h: float = 0.0
    """The starved pods' GPUs × hours pending, summed (what opens a window early)."""

    @property
    def opened_early(self) -> datetime | None:
        """The start of the early window this cycle is in (the next cycle's ``opened_early``)."""
        return EarlyWindows.opened(self.window)


def decide(
    cluster: Cluster,
    findings: Sequence[Finding],
    now: datetime,
    config: CycleConfig,
    planner: Planner,
    profile: ScoringProfile,
    *,
    last_packing: Finding | None = None,
    spent: Spent | None = None,
    plan_closed: bool = True,
    evicted: RecentEvictions = NO_EVICTIONS,
    opened_early: datetime | None = None,
) -> Decision:
    """The cycle's decision at ``now`` for ``cluster`` and its ``findings``.

    ``last_packing``: the packing finding an earlier cycle left standing (its
    :attr:`Decision.packing`), which holds for the patience's memory. ``spent``: the ledger
    port (None: every plan starts from nothing spent). ``plan_closed``: plan while the window
    is closed too (the daemon reports that plan; a driver that only acts passes False).
    ``evicted``: the daemon's own evictions so far (a victim evicted within
    ``config.evict_again_after`` is refused). ``opened_early``: the start of the early window an
    earlier cycle opened (:attr:`Decision.window`), which stays open its length."""
    idle = any(f.kind == "idle" for f in findings) if config.idle_gate else None
    window = window_status(config.windows, now, idle=idle)
    auto = config.goal == "auto"
    goal = goal_for(findings, config.goal)
    room_for = starved_pods(findings, frozenset({"make-room", URGENT})) if auto else None
    urgent = starved_pods(findings, frozenset({URGENT}))
    backlog = backlog_gpu_hours(cluster, findings, room_for or frozenset(), now)
    if not window.open and urgent:  # only the make-room-now pods may be helped now
        window = urgent_window(window, urgent, now)
        goal, room_for = Goal.MAKE_ROOM, urgent
    elif not window.open and config.early is not None and idle is not False:
        window = config.early.status(window, now, backlog, opened_early)
    elif auto and config.repack_on_demand:
        # a repack serves the starved pods make-room leaves without room, or no one
        goal = Goal.ALL if room_for else None
    # While the scheduler packs, a starved pod waits for departures (defrag.plan.patience).
    packing = config.patience.standing(findings, last_packing, now)
    held = held_back(findings, room_for, config.patience, now, packing) if room_for else {}
    if held:
        room_for = frozenset(room_for or ()) - held.keys()
        if not room_for:
            goal = Goal.REPACK if goal is Goal.ALL and not config.repack_on_demand else None
    plan = None
    if goal is not None and (window.open or plan_closed):
        ledger = spent(window) if spent is not None else None
        history = History(evicted=evicted, packing=packing is not None)
        plan = planner(
            cluster, goal, now, profile=profile, pods=room_for, spent=ledger, history=history
        )
    own: tuple[Finding, ...] = ()
    faults = [b for b in plan.blocked if b.constraint != NOT_WORTH] if plan is not None else []
    if plan is not None and plan.empty and faults:
        # "not worth it yet" is the planner waiting, not a fault: it raises no alert
        own = (blocked_finding(plan, faults, now),)
    return Decision(window, goal, plan, held, packing, own, backlog)


def may_act(
    config: CycleConfig, now: datetime, *, urgent_rules: bool, opened_early: datetime | None = None
) -> bool:
    """Whether a cycle at ``now`` could admit anything: a configured window is open (the idle
    gate can only close it), a rule makes room outside the windows (``urgent_rules``), an early
    window may open now (its check) or is open (``opened_early``). A cycle that cannot act
    changes nothing but the packing verdict's memory."""
    if urgent_rules or window_status(config.windows, now).open:
        return True
    early = config.early
    return early is not None and early.may_open(now, opened_early)


def planner_port(config: PlannerConfig, owners: OwnerLookup | None = None) -> Planner:
    """The decision's planner: :func:`~defrag.plan.planner.make_plan` with the one
    :class:`~defrag.plan.config.PlannerConfig` the settings build (``defrag plan --settings``
    plans with the same), making room only for the pods the decision names, within what the
    window has left. With ``owners``, every victim's controlling owner is read first
    (:func:`~defrag.plan.planner.plan_with_owners`): only a pod its controller will recreate is
    evicted."""

    def plan(
        cluster: Cluster,
        goal: Goal,
        now: datetime,
        *,
        profile: ScoringProfile,
        pods: frozenset[str] | None = None,
        spent: BudgetLedger | None = None,
        history: History = NO_HISTORY,
    ) -> Plan:
        options = replace(config.options, only=pods)
        if owners is not None:
            return plan_with_owners(
                cluster, owners, goal, profile=profile, config=config, options=options,
                now=now, spent=spent, history=history,
            )  # fmt: skip
        return make_plan(
            cluster, goal, profile=profile, config=config, options=options, now=now,
            spent=spent, history=history,
        )  # fmt: skip

    return plan


def goal_for(findings: Sequence[Finding], configured: str) -> Goal | None:
    """The plan goal: the configured one, or (auto) what the findings ask for; None = no plan."""
    if configured != "auto":
        return Goal(configured)
    goals = {GOALS_BY_ACTION[f.action] for f in findings if f.action in GOALS_BY_ACTION}
    if not goals:
        return None
    return goals.pop() if len(goals) == 1 else Goal.ALL


def backlog_gpu_hours(
    cluster: Cluster, findings: Sequence[Finding], pods: frozenset[str], now: datetime
) -> float:
    """The starved pods' (``pods``, ``namespace/name``) GPUs × hours pending since their
    starvation findings say, summed."""
    total = 0.0
    for f in findings:
        key = f.subject.removeprefix("pod/")
        if f.kind != STARVATION_KIND or key not in pods or f.since is None:
            continue
        pod = cluster.pods.get(key)
        if pod is None:
            continue
        hours = max((utc(now) - utc(f.since)).total_seconds() / 3600.0, 0.0)
        total += pod.gpu_demand_milli / GPU_MILLI * hours
    return round(total, 6)


def starved_pods(findings: Sequence[Finding], actions: frozenset[str]) -> frozenset[str]:
    """``namespace/name`` of the pods that findings with one of ``actions`` are about."""
    return frozenset(
        f.subject.removeprefix("pod/")
        for f in findings
        if f.action in actions and f.subject.startswith("pod/")
    )


def urgent_window(closed: WindowStatus, pods: frozenset[str], now: datetime) -> WindowStatus:
    """The window a make-room-now plan runs in while the configured windows are closed."""
    return WindowStatus(
        open=True,
        reason=f"{closed.reason}; make-room-now for {len(pods)} starved pod(s)",
        next_open=closed.next_open,
        budget_key=URGENT_BUDGET_KEY.format(day=utc(now).date().isoformat()),
    )


def blocked_finding(plan: Plan, blocked: Sequence[Blocked], now: datetime) -> Finding:
    """A plan every pod of which is blocked (``DefragPlanBlocked``)."""
    by_constraint: dict[str, int] = {}
    for b in blocked:
        by_constraint[b.constraint] = by_constraint.get(b.constraint, 0) + 1
    parts = ", ".join(f"{n} by {c}" for c, n in sorted(by_constraint.items()))
    return Finding(
        kind="plan-blocked",
        subject="cluster",
        severity="warning",
        summary=f"no {plan.goal} plan possible: {len(blocked)} pod(s) blocked ({parts})",
        evidence={"blocked": [b.to_dict() for b in blocked[:20]], "goal": plan.goal},
        since=now,
        labels={"detector": "planner"},
    )


__all__ = [
    "GOALS_BY_ACTION",
    "URGENT",
    "URGENT_BUDGET_KEY",
    "CycleConfig",
    "Decision",
    "Detected",
    "Detector",
    "Planner",
    "Spent",
    "backlog_gpu_hours",
    "decide",
    "goal_for",
    "may_act",
    "planner_port",
    "starved_pods",
    "urgent_window",
]
