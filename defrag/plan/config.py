"""The planner's configuration: the one value that says what a plan may touch and how hard the
planner tries — the twin of :class:`defrag.scoring.profile.ProfileConfig`.

It is read once: the daemon's settings build it (``Settings.planner_config()``), and
``defrag run``, ``defrag plan --settings`` and the simulator's hook (which keeps only what is
simulator-specific beside it) all plan with the :class:`PlannerConfig` they were handed. The
defaults here are the daemon's defaults; the settings take theirs from this module.

* :class:`Goal` — what a plan is for (``repack``, ``make-room``, ``all``), spelled once;
* :class:`MakeRoomMode` — which victims make-room may move or preempt;
* :class:`EvictionBudget` — evictions in all, per node, per namespace: the planner's ledger
  (:class:`~defrag.plan.constraints.Ledger`) and the executor's
  (:class:`~defrag.execute.budgets.BudgetLedger`) both count against it;
* :class:`Constraints` — the per-pod knobs (minimum age, the eviction filters) and the budget;
* :class:`PlanOptions` — how hard the planner tries, what counts as starved;
* :class:`PlannerConfig` — the two together.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from enum import StrEnum

from defrag.model.selectors import LabelSelector
from defrag.plan.budget import DemandBudget
from defrag.plan.cost import DEFAULT_COST, CostModel
from defrag.plan.departures import DEFAULT_HORIZON_H
from defrag.plan.recent import DEFAULT_GUARD


class RoomValue(StrEnum):
    """What a room is worth, weighed against its cost (docs/planning.md, "What a room is
    worth")."""

    FORECAST = "forecast"
    """The wait it saves: the pod's GPUs × the hours until the cluster would free such a room
    by itself (:mod:`defrag.plan.departures`; the horizon when the scheduler does not pack, as
    it fills what departures free)."""
    WAITED = "waited"
    """The wait so far: the pod's GPUs × the hours it has been pending (the planner before
    the forecast)."""


class Goal(StrEnum):
    """What a plan is for."""

    REPACK = "repack"
    MAKE_ROOM = "make-room"
    ALL = "all"

    @property
    def makes_room(self) -> bool:
        return self in (Goal.MAKE_ROOM, Goal.ALL)

    @property
    def repacks(self) -> bool:
        return self in (Goal.REPACK, Goal.ALL)


GOALS: tuple[str, ...] = tuple(g.value for g in Goal)


class MakeRoomMode(StrEnum):
    """Which victims make-room may touch, and how (docs/planning.md, "Make room")."""

    MIGRATE_THEN_PREEMPT = "migrate-then-preempt"
    """Victims of any priority moved where each re-fits at once; only if no such room works
    out, strictly lower victims that fit nowhere preempted (the default since issue 17)."""
    MIGRATE = "migrate"
    """As above, never preempting (``defrag plan --no-preempt``)."""
    LOWER_PRIORITY = "lower-priority"
    """Only victims strictly below the pending pod, moved or preempted (the planner before
    issue 17; ``make_room_moves_any_priority: false``)."""
    LOWER_PRIORITY_MIGRATE = "lower-priority-migrate"
    """Only victims strictly below the pending pod, moved only."""
    FILL = "fill"
    """The simulator's fill protocol: victims of any priority, migrations only, no priority
    rule even for chained victims (nothing is lost, nothing waits)."""

    @classmethod
    def of(cls, *, preempt: bool, migrate_any_priority: bool) -> MakeRoomMode:
        """The mode of the two operator switches (``--no-preempt``,
        ``make_room_moves_any_priority``)."""
        if migrate_any_priority:
            return cls.MIGRATE_THEN_PREEMPT if preempt else cls.MIGRATE
        return cls.LOWER_PRIORITY if preempt else cls.LOWER_PRIORITY_MIGRATE

    @property
    def preempts(self) -> bool:
        return self in (MakeRoomMode.MIGRATE_THEN_PREEMPT, MakeRoomMode.LOWER_PRIORITY)

    @property
    def migrates_any_priority(self) -> bool:
        return self in (MakeRoomMode.MIGRATE_THEN_PREEMPT, MakeRoomMode.MIGRATE)

    def without_preemption(self) -> MakeRoomMode:
        if self is MakeRoomMode.FILL:
            return self
        return MakeRoomMode.of(preempt=False, migrate_any_priority=self.migrates_any_priority)


DEFAULT_MAX_EVICTIONS = 10
DEFAULT_MAX_PER_NODE = 8
DEFAULT_MAX_PER_NAMESPACE = 5
DEFAULT_MIN_AGE = timedelta(0)


@dataclass(frozen=True, slots=True)
class EvictionBudget:
    """The most evictions of one plan (the daemon: of one window opening): in all, from one
    node, in one namespace. ``None`` is unlimited. The planner plans within it and the
    executor enforces it again as evictions go out, across the plans of a window."""

    total: int | None = DEFAULT_MAX_EVICTIONS
    per_node: int | None = DEFAULT_MAX_PER_NODE
    per_namespace: int | None = DEFAULT_MAX_PER_NAMESPACE

    def __post_init__(self) -> None:
        for name in ("total", "per_node", "per_namespace"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"EvictionBudget.{name}: {value} is negative")


UNLIMITED = EvictionBudget(None, None, None)


@dataclass(frozen=True, slots=True)
class Constraints:
    """What a plan may touch: per pod (age, the eviction filters) and in all (the budget)."""

    min_age: timedelta = DEFAULT_MIN_AGE
    """Pods younger than this stay (unknown creation time counts as old enough)."""
    priority_threshold: int | None = None
    """Pods with priority at or above this are never evicted (setting
    ``planner.evict_priority_threshold``, ``defrag plan --protect-priority``; system-critical pods
    never are)."""
    budget: EvictionBudget = field(default_factory=EvictionBudget)
    namespaces_include: frozenset[str] = frozenset()
    """Only pods in these namespaces may be evicted (empty: every namespace)."""
    namespaces_exclude: frozenset[str] = frozenset()
    """Pods in these namespaces are never evicted."""
    label_selector: LabelSelector | None = None
    """Only pods whose labels match may be evicted (None: every pod)."""
    owner_kinds: frozenset[str] = frozenset()
    """Controller kinds (``Kind.group``, or ``Kind`` in the core group) trusted to recreate
    their pods beside :data:`~defrag.plan.owners.RECREATING_KINDS` (setting
    ``planner.evict_owner_kinds``)."""
    evict_again_after: timedelta | None = DEFAULT_GUARD
    """A pod (or its workload) the daemon evicted less than this ago is not evicted again
    (:mod:`defrag.plan.recent`; setting ``planner.evict_again_after_s``); None: no guard."""

    def __post_init__(self) -> None:
        if self.namespaces_include and self.namespaces_exclude:
            raise ValueError(
                "namespaces_include and namespaces_exclude are mutually exclusive "
                "(descheduler's DefaultEvictor takes one or the other)"
            )


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """How hard the planner tries; what counts as starved."""

    cost: CostModel = DEFAULT_COST
    starved_priority: int = 0
    """Pending pods at or above this priority may get room made for them."""
    starved_after: timedelta = timedelta(0)
    """…once they have been pending this long (since ``pending_since``, else creation)."""
    only: frozenset[str] | None = None
    """Make room only for these pending pods (``namespace/name``; a gang when one of its pods
    is named) — the pods a starvation rule found; None: every pending pod that qualifies."""
    mode: MakeRoomMode = MakeRoomMode.MIGRATE_THEN_PREEMPT
    """Which victims make-room may move or preempt."""
    swaps: bool = False
    """Allow a room that preempts as much GPU as it frees (one job run instead of another:
    the scheduler's own priority preemption does that; defrag leaves it to it by default)."""
    room_worth: float = 1.0
    """The margin: make room only when what it is worth (``room_value``) reaches this × its
    cost (the lost work and restarts of its evictions, :mod:`defrag.plan.cost`); 0: always."""
    room_value: RoomValue = RoomValue.FORECAST
    """What a room is worth: the wait it saves (forecast) or the pod's wait so far."""
    room_horizon_h: float = DEFAULT_HORIZON_H
    """The forecast counts waits up to this many hours."""
    spare_jobs: bool = False
    """Never move a multi-GPU job that does not answer the checkpoint handshake to make room
    for a multi-GPU pod of equal or lower priority (:mod:`defrag.plan.spare`)."""
    max_moves_per_room: int | None = None
    """Skip rooms that need more evictions than this (None: no limit)."""
    depth: int = 1
    """Chains of migrations for victims that fit nowhere (make room for them in turn)."""
    candidates: int = 32
    """Nodes priced per pending pod (the ones needing the least freed)."""
    tries: int = 8
    """Victim sets tried per pending pod, cheapest first."""
    min_gain_per_cost: float = 0.05
    """Repack keeps a drain only if it frees this many fragmented GPUs per unit of cost
    (0.05: one GPU of FGD fragmentation per 20 GPU-hours of lost work)."""
    report_nodes: bool = True
    """Include per-node rows in ``before``/``after``."""
    sizes: tuple[int, ...] = field(default=(1, 2, 4, 8))
    """Job sizes of the fragmentation reports."""
    max_rooms: int | None = None
    """Make room for at most this many starved groups per plan, most urgent first (None: all):
    a cycle's plan stays small, and what it leaves waits for the next cycle."""
    repack_on_demand: bool = False
    """A plan that makes room and repacks (goal ``all``) repacks only when a starved group got
    no room: a drain no pending pod waits for is paid for now and mostly never used. A
    repack-only plan always repacks."""


DEFAULT_OPTIONS = PlanOptions()
DEFAULT_DEMAND = DemandBudget(DEFAULT_MAX_EVICTIONS)
"""The daemon's default: a window's budget follows its backlog from 10 up to 512."""


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """Everything the planner is configured with: built once (from the settings) and handed
    to every planner — the daemon's, ``defrag plan``'s, the simulator's."""

    constraints: Constraints = field(default_factory=Constraints)
    options: PlanOptions = DEFAULT_OPTIONS
    demand: DemandBudget | None = field(default_factory=lambda: DEFAULT_DEMAND)
    """A make-room plan's eviction total follows its backlog (the starved pods' GPUs,
    :class:`~defrag.plan.budget.DemandBudget`; ``constraints.budget.total`` is its floor, as
    ``demand.floor`` should be); None: the fixed ``constraints.budget``."""

    def window_budget(self) -> EvictionBudget:
        """The budget the executor enforces across a window's plans: the fixed one, or with
        a demand budget its ceiling (each plan is sized by its own backlog within it)."""
        budget = self.constraints.budget
        return budget if self.demand is None else replace(budget, total=self.demand.ceiling)

    def with_budget(self, budget: EvictionBudget) -> PlannerConfig:
        return replace(self, constraints=replace(self.constraints, budget=budget))

    def with_options(self, **changes: object) -> PlannerConfig:
        return replace(self, options=replace(self.options, **changes))  # type: ignore[arg-type]

    def with_constraints(self, **changes: object) -> PlannerConfig:
        return replace(self, constraints=replace(self.constraints, **changes))  # type: ignore[arg-type]


__all__ = [
    "DEFAULT_DEMAND",
    "DEFAULT_MAX_EVICTIONS",
    "DEFAULT_MAX_PER_NAMESPACE",
    "DEFAULT_MAX_PER_NODE",
    "DEFAULT_MIN_AGE",
    "DEFAULT_OPTIONS",
    "GOALS",
    "UNLIMITED",
    "Constraints",
    "EvictionBudget",
    "Goal",
    "MakeRoomMode",
    "PlanOptions",
    "PlannerConfig",
    "RoomValue",
]
