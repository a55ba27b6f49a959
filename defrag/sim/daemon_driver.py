"""The daemon in the simulator's loop: its own decision, driven through ports backed by the
simulated state (``defrag simulate --defrag``, the timeline protocol).

Every simulated cycle (the settings' ``cycle_interval_s``) that could act — inside a configured
window, or at any cycle when a rule makes room outside them (:func:`defrag.decide.may_act`) —
does what the daemon's cycle does,
with the same code: the cluster view (:class:`~defrag.sim.daemon_view.ClusterView`), the
daemon's rules run on it by the daemon's detection (rules that need Prometheus are skipped, as
on a cluster without it), one scoring profile built for the view, then
:func:`defrag.decide.decide` with the daemon's planner (:func:`defrag.decide.planner_port`, its
owner lookup answered by :func:`~defrag.sim.daemon_view.owner_facts`), the simulated clock and
this driver's ledger. What the decision admits inside an open window (or the day's
make-room-now allowance) is carried out by the actuator: each eviction admitted through the
window's :class:`~defrag.plan.spend.BudgetLedger` (the executor's own admission), then applied
as a :class:`~defrag.sim.moves.Move` — a migration where the plan names a target, a requeue
where it preempts. Nothing here decides anything the daemon does not.

The cycles that cannot act are not simulated: on a cluster they change only how long a packing
verdict stands (the spreading rule's finding, remembered for
``planner.make_room_packing_memory_s``), which the next simulated cycle judges afresh. What
the simulator cannot have is left out, and said so: Prometheus series (leak and idle
rules are skipped, so the idle gate never opens), disruption budgets, the checkpoint
handshake's wait (a pod that answers it shows ``defrag.io/checkpoint: supported`` and is billed
its stall, ``defrag.sim.migration``), the drain's taint and timing (evictions land at once).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

from defrag.decide import URGENT, CycleConfig, Decision, decide, may_act, planner_port
from defrag.detect.findings import Finding
from defrag.detection import cycle_detector
from defrag.execute.windows import WindowStatus
from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.plan.config import PlannerConfig
from defrag.plan.model import Plan, Step
from defrag.plan.recent import NONE as NO_EVICTIONS
from defrag.plan.spend import BudgetLedger
from defrag.rules import RuleSet, load_rules, rules_paths
from defrag.settings import load_settings
from defrag.sim.daemon_view import ClusterView, moment
from defrag.sim.moves import Move, plan_moves
from defrag.sim.state import SimState


@dataclass(frozen=True, slots=True)
class DaemonSetup:
    """What the daemon is configured with, as the settings build it."""

    cycle: CycleConfig
    planner: PlannerConfig
    rules: RuleSet
    cycle_interval_s: float = 300.0


SIM_SETTINGS: Mapping[str, Any] = MappingProxyType(
    {
        "windows.max_evictions_per_node": 1_000_000,
        "windows.max_evictions_per_namespace": 1_000_000,
        "planner.depth": 0,
        "planner.min_gain_per_cost": 0.5,
    }
)
"""The simulator's settings where the user gives no settings file (the benchmark figures'; change
them and the figures change, docs/benchmarks.md), over the daemon's defaults:

* no per-node or per-namespace eviction limit: a trace's pods share one namespace (``openb``),
  and a room empties one node of at most its own pods;
* ``planner.depth: 0``: no chains of migrations for victims that fit nowhere (1: ~5x the time,
  +0.01 pt on openb); ``planner.min_gain_per_cost: 0.5``: repack keeps a drain only if it frees
  0.5 fragmented GPUs per unit of cost;
* one window every ``window_every_h`` hours (the timeline's window period, the peers' too), an
  hour long (:func:`window_schedule`)."""

WINDOW_LENGTH_S = 3600.0


def window_schedule(every_h: float) -> list[dict[str, object]]:
    """The simulator's default windows: one opening every ``every_h`` hours from midnight, an
    hour long, as a settings ``windows.schedule``; ValueError when ``every_h`` is not a whole
    number of hours that divides a day (a crontab cannot say it: give a settings file)."""
    hours = round(every_h)
    if abs(every_h - hours) > 1e-9 or hours < 1 or 24 % hours:
        raise ValueError(
            f"a window every {every_h:g} h has no crontab form (a whole divisor of 24 h); "
            "give a settings file with windows.schedule"
        )
    cron = "0 0 * * *" if hours == 24 else f"0 */{hours} * * *"
    return [{"cron": cron, "length_s": WINDOW_LENGTH_S, "timezone": "UTC"}]


def daemon_setup(
    settings_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    window_every_h: float = 6.0,
    policy: str | None = None,
) -> DaemonSetup:
    """The daemon's configuration as its settings build it: from ``settings_file`` (the very
    file the Deployment mounts), else :data:`SIM_SETTINGS` with :func:`window_schedule`; then
    ``overrides`` (dotted keys, as flags); ``policy``: the scheduler score the simulated cluster
    runs (the scoring profile's policy). Rules: the settings' ``detection.rules_dir``, else the
    one rules lookup. Raises :class:`~defrag.settings.SettingsError` or
    :class:`~defrag.rules.RulesError` naming what is wrong."""
    base: dict[str, Any] = {}
    if settings_file is None:
        base = {**SIM_SETTINGS, "windows.schedule": window_schedule(window_every_h)}
    if policy is not None:
        base["scoring.policy"] = policy
    settings = load_settings(settings_file, {**base, **(overrides or {})})
    rules = load_rules(rules_paths((), settings.detection.rules_dir))
    return DaemonSetup(
        settings.cycle_config(),
        settings.planner_config(),
        rules,
        settings.daemon.cycle_interval_s,
    )


@dataclass(slots=True)
class CycleRecord:
    """One simulated cycle's decision and what the actuator did with it."""

    hour: float
    decision: Decision
    findings: tuple[Finding, ...]
    moves: tuple[Move, ...] = ()
    refused: tuple[str, ...] = ()


@dataclass(slots=True)
class SimLedger:
    """The ledger port: each window opening's (and each day's out-of-window) spend, counted
    by the one :class:`BudgetLedger` type against the executor's window budget."""

    budgets: PlannerConfig
    ledgers: dict[str, BudgetLedger] = field(default_factory=dict)

    def spent(self, window: WindowStatus) -> BudgetLedger | None:
        if not window.open:
            return None
        return self.ledger(window.key).copy()

    def ledger(self, key: str) -> BudgetLedger:
        found = self.ledgers.get(key)
        if found is None:
            found = self.ledgers[key] = BudgetLedger(self.budgets.window_budget(), key)
        return found


class DaemonDriver:
    """The :class:`~defrag.sim.hooks.DefragHook` (and tick hook) that runs the daemon's cycle."""

    def __init__(
        self, setup: DaemonSetup, *, view: ClusterView | None = None, record: bool = False
    ) -> None:
        self.setup = setup
        self.view = view if view is not None else ClusterView()
        self.detector = cycle_detector(setup.rules, None)
        # Every simulated owner is a kind that recreates its pods (the view's): the kinds decide,
        # as for the daemon without an API server to read owners from.
        self.planner = planner_port(setup.planner)
        self.ledger = SimLedger(setup.planner)
        self.packing: Finding | None = None
        self.evicted = NO_EVICTIONS
        """The daemon's evictions within the anti-thrash guard (the actuator records them)."""
        self.opened_early: datetime | None = None
        self.observed: Cluster | None = None
        """The cluster the last decision was made on."""
        self.tick_every_h = setup.cycle_interval_s / 3600.0
        self.urgent_rules = any(
            getattr(loaded.rule, "action", None) == URGENT for loaded in setup.rules.enabled()
        )
        self.history: list[CycleRecord] | None = [] if record else None
        """With ``record``: every cycle's decision (the differential test reads it)."""

    # the timeline protocol's hooks: the daemon acts at its cycles only
    def on_unschedulable(self, state: SimState, pod: Pod, now: float) -> Sequence[Move]:
        return ()

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        return ()

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]:
        at = moment(now)
        if not may_act(
            self.setup.cycle, at, urgent_rules=self.urgent_rules, opened_early=self.opened_early
        ):
            return ()  # nothing could be admitted: the cycle is not simulated
        decision, findings = self.decide(state, now)
        moves: tuple[Move, ...] = ()
        refused: tuple[str, ...] = ()
        plan = decision.plan
        if plan is not None and not plan.empty and decision.window.open:
            moves, refused = self.actuate(state, plan, decision.window)
            # as the daemon does: the evicted pods as the cluster showed them (their owners)
            shown = self.observed.pods if self.observed is not None else {}
            gone = (shown.get(s.pod) for s in plan.steps if s.pod not in refused)
            self.evicted = self.evicted.record((p for p in gone if p is not None), at)
        if self.history is not None:
            self.history.append(CycleRecord(now, decision, findings, moves, refused))
        return moves

    def decide(self, state: SimState, now: float) -> tuple[Decision, tuple[Finding, ...]]:
        """The daemon's decision for the state at simulated hour ``now``, and the findings it
        was made on."""
        at = moment(now)
        cluster = self.observed = self.view.cluster(state, now)
        profile = self.setup.cycle.profile.for_cluster(cluster)
        findings = tuple(self.detector(cluster, at, profile))
        guard = self.setup.cycle.evict_again_after
        if guard is not None:
            self.evicted = self.evicted.pruned(at, guard)
        decision = decide(
            cluster, findings, at, self.setup.cycle, self.planner, profile,
            last_packing=self.packing, spent=self.ledger.spent, plan_closed=False,
            evicted=self.evicted, opened_early=self.opened_early,
        )  # fmt: skip
        self.packing = decision.packing
        self.opened_early = decision.opened_early
        return decision, findings

    def actuate(
        self, state: SimState, plan: Plan, window: WindowStatus
    ) -> tuple[tuple[Move, ...], tuple[str, ...]]:
        """The plan's evictions the window's budget admits, each as the executor admits it, as
        moves; the pods refused (none, when the plan was made within what the window has
        left)."""
        ledger = self.ledger.ledger(window.key)
        admitted: list[Step] = []
        refused: list[str] = []
        for step in plan.steps:
            if step.kind not in ("migrate", "preempt"):
                continue
            if ledger.admit([(step.pod.partition("/")[0], step.source)]).ok:
                admitted.append(step)
            else:
                refused.append(step.pod)
        return plan_moves(state.arrays.index, admitted), tuple(refused)


__all__ = [
    "SIM_SETTINGS",
    "CycleRecord",
    "DaemonDriver",
    "DaemonSetup",
    "SimLedger",
    "daemon_setup",
    "window_schedule",
]
