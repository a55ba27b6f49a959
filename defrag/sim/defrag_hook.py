"""The planner in the simulator's loop (``defrag simulate --defrag``).

* Fill protocol: a pod that fits nowhere triggers make-room with migrations only — victims of
  any priority move to where the scheduler would put them, nothing is lost, nothing waits.
* Timeline protocol: **the daemon's semantics** (docs/daemon.md, docs/simulator.md):

  - every ``on_tick`` is a daemon cycle (300 s). Every enabled starvation rule the daemon
    reads (the shipped ``rules/starvation.yaml``: high priority, any reason; any priority,
    ``fragmented`` only) finds the pending pods it selects (``min_priority``,
    ``priority_classes``, ``any_priority``) pending at least its ``for:`` and waiting for one
    of its ``reasons`` (the detector's own :func:`~defrag.detectors.starvation.core.diagnose`
    on the simulator's nodes); a pod several rules find is the first rule's, as in
    detection. The trace's QoS classes read as priority values :data:`RULE_PRIORITY`. Room is
    made for the pods of rules whose action is ``make-room`` — by the planner's make-room
    (:func:`~defrag.plan.planner.make_rooms`, the daemon's own: pods of any priority moved
    where they re-fit at once, then strictly lower ones preempted, no swaps; higher priority
    first) inside an execution window, and at any cycle for those of a ``make-room-now``
    rule;
  - the node a room frees is held for its pod (``Move.for_pod``: the timeline keeps other
    pods off it until the pod starts or the executor's replacement timeout passes), as the
    executor does with ``defrag.io/reserved-for``;
  - a window opens every ``window_every_h`` for ``window_length_h``: make-room for what the
    rule finds, then a repack; evictions per window opening are capped (``window_evictions``);
  - the planner sees each running pod's last checkpoint as ``defrag.io/last-checkpoint`` and
    its (re)start as its creation time, with the cycle's time as ``now``, so its cost prices
    the work an eviction would lose (``checkpoint_aware=False``: no pod shows when it started
    or checkpointed, and every eviction costs its restart alone);
  - make-room weighs each room against the pod's wait so far (``room_worth``): its lost work
    and restarts must not exceed the pod's GPUs × hours pending.

Every call plans on a private :class:`~defrag.plan.workspace.Workspace` copied from the
simulator's state and answers with :class:`~defrag.sim.hooks.Move` s in the order the plan
made them, so the simulator can apply them one by one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from defrag.detect.findings import Finding
from defrag.detectors.spreading.core import SpreadingParams, detect_spreading
from defrag.detectors.starvation.core import StarvationParams, diagnose, selects_priority
from defrag.model.resources import CHECKPOINT_ANNOTATION, Pod
from defrag.plan.budget import DEFAULT_CEILING, DEFAULT_PER_GPU, DemandBudget
from defrag.plan.config import (
    DEFAULT_MAX_EVICTIONS,
    UNLIMITED,
    Constraints,
    EvictionBudget,
    MakeRoomMode,
    PlannerConfig,
    PlanOptions,
)
from defrag.plan.constraints import Ledger
from defrag.plan.makeroom import make_room
from defrag.plan.model import Step
from defrag.plan.patience import DEFAULT_MEMORY, DEFAULT_PATIENCE, PackingPatience
from defrag.plan.planner import Rooms, make_rooms
from defrag.plan.repack import repack
from defrag.plan.room import SearchContext
from defrag.plan.workspace import Occupant, Workspace, cpu_of_gpuless
from defrag.scoring.profile import ProfileConfig
from defrag.sim.hooks import REQUEUE, DefragHook, Move
from defrag.sim.state import Placed, SimState

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
"""Simulated hour 0 as a wall-clock time (for the annotations and the rule's ``for:``)."""

RULE_PRIORITY = {"LS": 2000, "Guaranteed": 1500, "Burstable": 1000, "BE": 0}
"""How the rule reads the trace's QoS classes as PriorityClass values: every class above
best effort at or above the shipped rule's ``min_priority: 1000``, best effort below it."""

PROTOCOLS = ("fill", "timeline")


SIM_PLANNER = PlannerConfig(
    Constraints(
        budget=EvictionBudget(total=DEFAULT_MAX_EVICTIONS, per_node=None, per_namespace=None)
    ),
    PlanOptions(depth=0, min_gain_per_cost=0.5),
)
"""The planner configuration of the simulator's runs (the benchmark figures' — change it and
they change; docs/benchmarks.md): the daemon's defaults but

* the daemon's ``max_evictions_per_window`` (10) as each window's least budget, raised to the
  window's demand (:class:`~defrag.plan.budget.DemandBudget`, ``HookOptions.follow_demand``:
  the daemon's ``eviction_budget_follows_demand``); no per-node or per-namespace limit (trace
  pods have no namespaces, and a room empties one node of at most its own pods); make-room-now
  plans outside windows share 10 evictions per simulated day (64 fixed per window before
  issue 25);
* ``depth=0``: no chains of migrations for victims that fit nowhere (1: ~5x the time, +0.01
  pt on openb);
* repack keeps a drain only if it frees 0.5 fragmented GPUs per unit of cost.

Trace pods have no owners, PDBs or ages, so only the eviction filters of ``constraints`` apply
(:class:`~defrag.plan.room.SearchContext` ``enforce=False``); the fill protocol also drops the worth
check, swaps and the moves-per-room limit (nothing is lost there)."""


@dataclass(frozen=True, slots=True)
class HookOptions:
    """What only the simulator has, and the planner's configuration (:data:`SIM_PLANNER`)."""

    planner: PlannerConfig = field(default_factory=lambda: SIM_PLANNER)
    """The planner's configuration: ``constraints.budget.total`` is the evictions per window
    opening (timeline), the options the make-room and repack knobs."""
    window_pending: int = 32
    """Starved pods given room per cycle (timeline), most urgent first."""
    repack: bool = True
    repack_on_demand: bool = True
    """Timeline: a window repacks only when the rule found starved pods that make-room left
    without room (a drain no pending pod waits for is paid for now and mostly never used:
    bench/bench_lost_work.py; False: every window repacks)."""
    checkpoint_aware: bool = True
    """Timeline: the planner prices lost work from ``defrag.io/last-checkpoint``."""
    rule: str | None = None
    """Timeline: the starvation rule file (default: the shipped ``rules/starvation.yaml``)."""
    make_room_now: bool | None = None
    """Timeline: make room outside windows too for every starved pod (None: for those of the
    rules whose ``action`` is ``make-room-now``)."""
    window_length_h: float = 1.0
    """Timeline: how long each execution window stays open."""
    follow_demand: bool = True
    """Timeline: each window's budget follows its backlog (:class:`DemandBudget`: the starved
    pods' GPUs × ``evictions_per_gpu``, at least ``constraints.budget.total``, at most
    ``window_ceiling``); False: the fixed budget."""
    window_ceiling: int = DEFAULT_CEILING
    evictions_per_gpu: float = DEFAULT_PER_GPU
    packing_patience_h: float | None = (
        None if DEFAULT_PATIENCE is None else DEFAULT_PATIENCE.total_seconds() / 3600
    )
    """Timeline: while the spreading rule (the daemon's, judged at each window opening) says
    the scheduler packs, make room only for pods pending this long (None, the default: never;
    0: as under a spreading scheduler) — the daemon's ``make_room_packing_patience_s``."""
    packing_memory_h: float = DEFAULT_MEMORY.total_seconds() / 3600
    """Timeline: how long a packing finding stands after the last window opening that found
    it — the daemon's ``make_room_packing_memory_s``."""


PLANNER_OPTIONS = {
    "candidates": "candidates",
    "tries": "tries",
    "depth": "depth",
    "min_gain_per_cost": "min_gain_per_cost",
    "swaps": "swaps",
    "room_worth": "room_worth",
    "max_moves_per_room": "max_moves_per_room",
    "spare_jobs": "spare_jobs",
}
"""Flat hook options (``bench_peers --hook-option``) that set a :class:`PlanOptions` field."""


def hook_options(**opts: Any) -> HookOptions:
    """:class:`HookOptions` from flat names: its own fields, the :data:`PLANNER_OPTIONS`,
    ``migrate_any_priority`` (the make-room mode), ``window_evictions`` (the budget's total)
    and ``unknown_hours`` (the cost's :attr:`~defrag.plan.cost.CostModel.unknown_hours`),
    applied to ``planner`` (default :data:`SIM_PLANNER`)."""
    planner = opts.pop("planner", SIM_PLANNER)
    own = set(HookOptions.__dataclass_fields__) - {"planner"}
    extra = {"migrate_any_priority", "window_evictions", "unknown_hours"}
    known = own | set(PLANNER_OPTIONS) | extra
    unknown = sorted(set(opts) - known)
    if unknown:
        raise ValueError(f"unknown defrag hook option(s): {', '.join(unknown)}")
    changes = {PLANNER_OPTIONS[k]: v for k, v in opts.items() if k in PLANNER_OPTIONS}
    if "migrate_any_priority" in opts:
        changes["mode"] = MakeRoomMode.of(
            preempt=planner.options.mode.preempts,
            migrate_any_priority=bool(opts["migrate_any_priority"]),
        )
    if "unknown_hours" in opts:
        cost = replace(planner.options.cost, unknown_hours=float(opts["unknown_hours"]))
        changes["cost"] = cost
    if changes:
        planner = planner.with_options(**changes)
    if "window_evictions" in opts:
        budget = planner.constraints.budget
        planner = planner.with_budget(replace(budget, total=int(opts["window_evictions"])))
    return HookOptions(planner=planner, **{k: v for k, v in opts.items() if k in own})


def starvation_rules(path: str | None) -> tuple[StarvationParams, ...]:
    """Every enabled starvation rule of ``path``, else those the daemon would read (the one
    rules lookup: ``$DEFRAG_RULES_DIR``, else the shipped rules), in the daemon's order."""
    from defrag.rules import load_rules, rules_paths

    paths = rules_paths([path] if path else ())
    found = tuple(r.rule.params() for r in load_rules(paths).enabled("starvation"))
    if not found:
        where = ", ".join(map(str, paths))
        raise ValueError(f"{where}: no enabled starvation rule")
    assert all(isinstance(p, StarvationParams) for p in found)
    return found


def spreading_rules() -> tuple[SpreadingParams, ...]:
    """The enabled spreading rules the daemon would read (the one rules lookup)."""
    from defrag.rules import load_rules, rules_paths

    found = tuple(r.rule.params() for r in load_rules(rules_paths(())).enabled("spreading"))
    assert all(isinstance(p, SpreadingParams) for p in found)
    return found


MAKES_ROOM = frozenset({"make-room", "make-room-now"})
"""The rule actions the daemon makes room for (defrag.daemon.cycle)."""


class PlannerHook:
    """The :class:`~defrag.sim.hooks.DefragHook` backed by the planner."""

    def __init__(self, protocol: str, options: HookOptions) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
        self.protocol = protocol
        self.options = options
        timeline = protocol == "timeline"
        self.rules = starvation_rules(options.rule) if timeline else (StarvationParams(),)
        self.make_room_now = options.make_room_now
        """True: rooms at any cycle for every starved pod; None: for a make-room-now rule's."""
        self.urgent_rules = any(r.action == "make-room-now" for r in self.rules)
        self.open_until = -math.inf
        self.spent: dict[tuple[str, int], int] = {}
        """Evictions per budget key: a window opening, or a day outside windows."""
        self.budget_key: tuple[str, int] = ("", 0)
        self.totals: dict[tuple[str, int], int] = {}
        """Each window opening's budget, fixed when it opens."""
        self.shown = _Annotator()
        hours = options.packing_patience_h
        self.patience = PackingPatience(
            None if hours is None else timedelta(hours=hours),
            timedelta(hours=options.packing_memory_h),
        )
        self.spreading = spreading_rules() if timeline else ()
        self.packing: Finding | None = None
        """The packing finding standing at the last window opening (found then, or an earlier
        opening's within the patience's memory; None: none)."""
        floor = options.planner.constraints.budget.total
        self.demand = (
            DemandBudget(floor, max(options.window_ceiling, floor), options.evictions_per_gpu)
            if options.follow_demand and floor is not None
            else None
        )

    # --- fill --------------------------------------------------------------------------------

    def on_unschedulable(self, state: SimState, pod: Pod, now: float) -> Sequence[Move]:
        if self.protocol == "timeline":
            return ()  # the daemon acts on the rule's findings, at its cycles (on_tick)
        if pod.gpu_demand_milli > int(state.arrays.free_share().sum()):
            return ()  # not enough free GPU in the whole cluster: no move can help
        ws, ctx = self._workspace(state, max_evictions=None, now=None)
        # nothing is lost in the fill protocol: no worth check, no swaps, no moves limit, no
        # job spared
        options = replace(
            self.options.planner.options,
            room_worth=0.0, swaps=False, max_moves_per_room=None, spare_jobs=False,
        )  # fmt: skip
        result = make_room(ws, ctx, pod, options, MakeRoomMode.FILL)
        return _moves(ws, result.steps) if result.ok else ()

    # --- timeline: the daemon -------------------------------------------------------------

    def starved(self, state: SimState, now: float, *, urgent: bool = False) -> list[Pod]:
        """The pending pods the starvation rules find at ``now`` and make room for, most urgent
        first (higher priority, then pending longer), as the cluster shows them: pending since
        they were (re-)queued. ``urgent``: only those to help outside windows."""
        found = []
        for pod in state.pending.values():
            job = state.jobs.get(pod.key)
            since = job.queued_at if job is not None else None
            if since is None:
                continue
            rule = self._rule_for(state, pod, (now - since) * 3600.0)
            if rule is None or rule.action not in MAKES_ROOM:
                continue
            if not self.patience.admits(self.packing, timedelta(hours=now - since)).ok:
                continue  # the scheduler packs: the pod waits for departures
            if urgent and not (self.make_room_now or rule.action == "make-room-now"):
                continue
            shown = replace(pod, pending_since=EPOCH + timedelta(hours=since))
            found.append((-pod.priority, since, pod.key, shown))
        return [p for *_, p in sorted(found, key=lambda t: t[:3])]

    def _rule_for(self, state: SimState, pod: Pod, waited_s: float) -> StarvationParams | None:
        """The first rule that finds ``pod`` (as detection reports it), or None. The reason is
        diagnosed once, and only for a rule that filters by it."""
        priority = RULE_PRIORITY.get(pod.qos, pod.priority)
        reason = None
        for rule in self.rules:
            if waited_s < rule.for_s - 1e-6:
                continue
            if not selects_priority(priority, pod.priority_class, rule):
                continue
            if not rule.every_reason:
                reason = reason or diagnose(pod, state.arrays, state.policy).reason
                if reason not in rule.reasons:
                    continue
            return rule
        return None

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]:
        if self.protocol != "timeline" or not state.pending:
            return ()
        in_window = now < self.open_until - 1e-9
        now_too = self.urgent_rules if self.make_room_now is None else self.make_room_now
        if not in_window and not now_too:
            return ()
        starved = self.starved(state, now, urgent=not in_window)
        if not starved:
            return ()
        budget = self._budget(now, in_window, starved)
        if budget <= 0:
            return ()
        ws, ctx = self._workspace(state, max_evictions=budget, now=now)
        return self._spend(ws, self._make_room(ws, ctx, starved))

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        if self.protocol != "timeline":
            return ()
        self.open_until = now + self.options.window_length_h
        self.packing = self._packing(state, now, self.packing)
        starved = self.starved(state, now)
        budget = self._budget(now, True, starved)
        ws, ctx = self._workspace(state, max_evictions=budget, now=now)
        rooms = self._rooms(ws, ctx, starved)
        steps = list(rooms.steps)
        if self.options.repack and self._repack_wanted(starved, rooms):
            gain = self.options.planner.options.min_gain_per_cost
            packed = repack(ws, ctx, state.mix, min_gain_per_cost=gain)
            steps.extend(packed.steps)
        return self._spend(ws, steps)

    def _packing(self, state: SimState, now: float, last: Finding | None) -> Finding | None:
        """The packing finding that stands at ``now`` as the daemon's cycle judges it: the
        spreading rules on the state (the cluster with its pods' bind times, the default
        profile), else ``last`` within the patience's memory; None when patience cannot hold
        anything back."""
        if not self.spreading or not self.patience.holds_back:
            return None
        cluster = state.to_cluster(EPOCH)
        profile = ProfileConfig().for_cluster(cluster)
        moment = EPOCH + timedelta(hours=now)
        found = [
            f
            for params in self.spreading
            for f in detect_spreading(cluster, params, moment, profile=profile).findings
        ]
        return self.patience.standing(found, last, moment)

    def _make_room(self, ws: Workspace, ctx: SearchContext, starved: Sequence[Pod]) -> list[Step]:
        return list(self._rooms(ws, ctx, starved).steps)

    def _rooms(self, ws: Workspace, ctx: SearchContext, starved: Sequence[Pod]) -> Rooms:
        groups = [[pod] for pod in starved[: self.options.window_pending]]
        return make_rooms(ws, ctx, groups, self.options.planner.options)

    def _repack_wanted(self, starved: Sequence[Pod], rooms: Rooms) -> bool:
        """Whether the window's repack serves a waiting pod: always unless
        ``repack_on_demand``; else when some starved pod got no room (each pod given room is
        one of ``rooms.targets``)."""
        return not self.options.repack_on_demand or len(starved) > len(rooms.targets)

    def _budget(self, now: float, in_window: bool, starved: Sequence[Pod]) -> int:
        """Evictions left under the current budget: a window opening's (its demand when it
        opened, with ``follow_demand``), else the day's outside windows."""
        key = ("window", int(self.open_until * 1e6)) if in_window else ("day", int(now // 24))
        self.budget_key = key
        total = self.options.planner.constraints.budget.total
        assert total is not None, "the simulator's windows need an eviction budget"
        if in_window and self.demand is not None:
            total = self.totals.setdefault(key, self.demand.total(starved))
        return total - self.spent.get(key, 0)

    def _spend(self, ws: Workspace, steps: Sequence[Step]) -> tuple[Move, ...]:
        moves = _moves(ws, steps)
        self.spent[self.budget_key] = self.spent.get(self.budget_key, 0) + len(moves)
        return moves

    def _workspace(
        self, state: SimState, *, max_evictions: int | None, now: float | None
    ) -> tuple[Workspace, SearchContext]:
        aware = now is not None and self.options.checkpoint_aware
        if aware and state.jobs:
            assert now is not None
            where = self.shown.seats(state, now)
            rows = [{k: where[k] for k in r} for r in state.rows]
            cpu = cpu_of_gpuless(state.placed.values(), len(state.arrays))  # reads no pod shown
            ws = Workspace(state.arrays.copy(), rows, where=where, gpuless_cpu=cpu)
        else:
            ws = Workspace(state.arrays.copy(), state.rows, where=state.placed)
        config = self.options.planner.constraints
        budget = UNLIMITED if max_evictions is None else replace(config.budget, total=max_evictions)
        constraints = replace(config, budget=budget)
        # Blind: the cycle's time is known (pods' waits too), but no pod shows when it started
        # or checkpointed, so every eviction costs its restart alone (GPUs × kind's overhead).
        moment = EPOCH + timedelta(hours=now) if now is not None else None
        cost = self.options.planner.options.cost
        ctx = SearchContext(
            state.policy, Ledger((), constraints), constraints, cost, moment, enforce=False
        )
        return ws, ctx


Shown = tuple[Pod, float, float | None, Pod]
"""A running pod as last shown: (its pod, its start, its last checkpoint shown, the pod shown)."""


class _Annotator:
    """Running pods as the cluster shows them at the hook's cycles: created at their
    (re)start, annotated with ``defrag.io/last-checkpoint`` when they checkpoint (a pod that
    never does shows none). A pod shown at an earlier cycle is shown by the same object while
    its start and last checkpoint stand (a serving pod's moves with every cycle)."""

    def __init__(self) -> None:
        self.known: dict[str, Shown] = {}

    def seats(self, state: SimState, now: float) -> dict[str, Occupant]:
        """The running pods' seats, each pod shown when first read (:class:`_Seat`)."""
        self.known = {k: v for k, v in self.known.items() if k in state.placed}
        show = partial(self.pod, state, now)
        return {k: _Seat(pl, show) for k, pl in state.placed.items()}

    def pod(self, state: SimState, now: float, placed: Placed) -> Pod:
        job = state.jobs.get(placed.pod.key)
        if job is None or job.started is None:
            return placed.pod
        last = job.last_checkpoint(now)
        # A checkpointing pod shows its (re)start until its first checkpoint in this run: it
        # resumed from the state saved then; a serving pod (interval 0) shows ``now``.
        shown = max(last, job.started) if last is not None and job.interval_h is not None else None
        hit = self.known.get(placed.pod.key)
        if hit is not None and hit[0] is placed.pod and hit[1:3] == (job.started, shown):
            return hit[3]
        notes = dict(placed.pod.annotations)
        if shown is not None:
            notes[CHECKPOINT_ANNOTATION] = (EPOCH + timedelta(hours=shown)).isoformat()
        created = EPOCH + timedelta(hours=job.started)
        pod = replace(placed.pod, created_at=created, annotations=notes)
        self.known[placed.pod.key] = (placed.pod, job.started, shown, pod)
        return pod


class _Seat:
    """A running pod's seat whose pod is shown (:class:`_Annotator`) when first read: a plan
    reads the pods of the few nodes it searches, not the thousands the cycle's workspace holds
    (the workspace lives within one hook call, while the simulator's state stands still)."""

    __slots__ = ("_placed", "_show", "gpus", "pod", "row")
    pod: Pod
    row: int
    gpus: tuple[int, ...]

    def __init__(self, placed: Placed, show: Callable[[Placed], Pod]) -> None:
        self._placed, self._show = placed, show
        self.row, self.gpus = placed.row, placed.gpus

    def __getattr__(self, name: str) -> Any:
        """Only an unset slot gets here: ``pod``, on its first read."""
        if name != "pod":
            raise AttributeError(name)
        self.pod = self._show(self._placed)
        return self.pod


def make_defrag_hook(policy: str, protocol: str, **opts: Any) -> DefragHook:
    """The simulator's factory. ``policy`` is the run's policy name (the hook scores with the
    run's own policy object, from the state); ``opts`` as :func:`hook_options` reads them."""
    del policy  # the state carries the policy object the run uses
    return PlannerHook(protocol, hook_options(**opts))


def _moves(ws: Workspace, steps: Sequence[Step]) -> tuple[Move, ...]:
    """The plan's evictions as moves: a migration to its target, a preemption to the queue."""
    index = ws.arrays.index
    return tuple(
        Move(
            s.pod,
            index[s.source],
            index[s.target] if s.kind == "migrate" and s.target is not None else REQUEUE,
            s.gpus if s.kind == "migrate" else (),
            s.for_pod,
        )
        for s in steps
        if s.kind in ("migrate", "preempt")
    )


__all__ = [
    "EPOCH",
    "RULE_PRIORITY",
    "SIM_PLANNER",
    "HookOptions",
    "PlannerHook",
    "hook_options",
    "make_defrag_hook",
    "starvation_rules",
]
