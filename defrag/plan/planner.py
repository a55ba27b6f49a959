"""``make_plan``: one plan for a cluster — make room for starved pods, then repack.

Both run on a :class:`~defrag.plan.workspace.Workspace` copied from the cluster, with the
scheduler's own filter + score, so every migration names the node the scheduler is expected
to choose. The plan is deterministic for a given cluster, goal, policy, constraints and time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from defrag.model.cluster import Cluster
from defrag.model.resources import OwnerRef, Pod
from defrag.model.utc import utc
from defrag.plan import constraints as c
from defrag.plan.config import (
    Constraints,
    Goal,
    PlannerConfig,
    PlanOptions,
    RoomValue,
)
from defrag.plan.constraints import Ledger, gang_of
from defrag.plan.drainworth import Beneficiaries, Waiting
from defrag.plan.history import NO_HISTORY, History
from defrag.plan.makeroom import candidate_rows, describe, make_room, room_worth
from defrag.plan.model import Blocked, Plan, RoomWorth, Step
from defrag.plan.owners import OwnerFacts, owner_key, read_kind
from defrag.plan.repack import repack
from defrag.plan.room import SearchContext
from defrag.plan.seating import departures_of
from defrag.plan.spend import BudgetLedger
from defrag.plan.waiting import waiting
from defrag.plan.workspace import Workspace
from defrag.scoring.fragmentation import fragmentation_report
from defrag.scoring.profile import ProfileConfig, ScoringProfile


class PlanError(ValueError):
    """A goal or policy the planner does not know."""


def make_plan(
    cluster: Cluster,
    goal: Goal | str = Goal.ALL,
    *,
    profile: ScoringProfile | None = None,
    config: PlannerConfig | None = None,
    constraints: Constraints | None = None,
    now: datetime,
    options: PlanOptions | None = None,
    owners: Mapping[str, OwnerFacts] | None = None,
    spent: BudgetLedger | None = None,
    history: History = NO_HISTORY,
) -> Plan:
    """The plan for ``cluster`` and ``goal``, every move scored with ``profile`` (the one the
    caller built for this snapshot; None: the default configuration for this cluster, as
    ``ProfileConfig().for_cluster(cluster)`` builds it). Its mix also measures the before and
    after fragmentation.

    ``config`` is the planner's configuration (the one the settings build; None: the
    defaults, which are the daemon's); ``constraints`` or ``options``, when given, replace
    its part of that name (tests and benchmarks set one part alone). ``owners``: the
    controlling owners looked up so far (:func:`plan_with_owners`); a victim's owner not among
    them is judged by its kind alone. ``spent``: what the window has spent so far; the plan
    spends only what is left of it. ``history``: what earlier cycles tell it (the daemon's
    recent evictions, whether the scheduler packs; :mod:`defrag.plan.history`)."""
    try:
        goal = Goal(goal)
    except ValueError:
        known = ", ".join(g.value for g in Goal)
        raise PlanError(f"unknown goal {goal!r}; known: {known}") from None
    config = config if config is not None else PlannerConfig()
    given = constraints is not None  # the caller's budget, exactly
    constraints = constraints if constraints is not None else config.constraints
    options = options if options is not None else config.options
    backlog = starved_groups(cluster, now, options) if goal.makes_room else []
    groups = backlog[: options.max_rooms]  # this plan's rooms; the rest wait for the next
    fixed = constraints.budget.total
    if config.demand is not None and not given and fixed:  # 0: no evictions, whatever waits
        wanted = config.demand.total(p for g in backlog for p in g)  # the backlog's budget
        total = max(fixed, min(wanted, config.demand.ceiling))
        constraints = replace(constraints, budget=replace(constraints.budget, total=total))
    profile = profile if profile is not None else ProfileConfig().for_cluster(cluster)
    policy_name, pol, mix = profile.name, profile.policy, profile.mix
    ws = Workspace.from_cluster(cluster)
    ledger = Ledger(cluster.pdbs, constraints, owners, spent)
    forecast = bool(groups) and options.room_value is RoomValue.FORECAST and options.room_worth > 0
    departures = departures_of(cluster, now, options.room_horizon_h) if forecast else None
    ctx = SearchContext(
        pol, ledger, constraints, options.cost, now, history=history, departures=departures
    )
    before = fragmentation_report(cluster, mix, options.sizes).to_dict(options.report_nodes)
    steps: list[Step] = []
    blocked: dict[tuple[str, str], Blocked] = {}
    targets: list[str] = []

    def note(found: tuple[Blocked, ...]) -> None:
        for b in found:
            blocked.setdefault((b.pod, b.constraint), b)

    unserved = 0
    rooms: tuple[RoomWorth, ...] = ()
    left: list[Sequence[Pod]] = []
    if goal.makes_room:
        made = make_rooms(ws, ctx, groups, options)
        rooms = made.worth
        steps.extend(made.steps)
        note(made.blocked)
        targets.extend(made.targets)
        unserved = made.unserved
        left = [*made.left, *backlog[len(groups) :]]
    if goal.repacks and (goal is Goal.REPACK or not options.repack_on_demand or unserved):
        # On demand, a drain is weighed by the starved pods it seats, as a room is.
        on_demand = goal is Goal.ALL and options.repack_on_demand and forecast
        want = waiting_for(ws, ctx, left, options) if on_demand else None
        packed = repack(
            ws, ctx, mix, min_gain_per_cost=options.min_gain_per_cost, want=want,
            margin=options.room_worth, candidates=options.candidates,
        )  # fmt: skip
        steps.extend(packed.steps)
        note(packed.blocked)
        targets.extend(f"repack {node}" for node in packed.drained)
        rooms = (*rooms, *packed.worth)
    ws.release_reservations()
    after = fragmentation_report(ws.arrays, mix, options.sizes).to_dict(options.report_nodes)
    return Plan(
        goal=goal.value,
        policy=policy_name,
        steps=tuple(steps),
        blocked=tuple(sorted(blocked.values(), key=lambda b: (b.pod, b.constraint))),
        before=before,
        after=after,
        targets=tuple(targets),
        rooms=rooms,
    )


def waiting_for(
    ws: Workspace, ctx: SearchContext, groups: Iterable[Sequence[Pod]], options: PlanOptions
) -> Beneficiaries:
    """The starved groups left without room, each with the forecast wait a room would save
    it (its largest pod's, :func:`~defrag.plan.makeroom.room_worth` over its candidate
    nodes): what a drain that seats one is worth."""
    waiting: list[Waiting] = []
    for group in groups:
        pod = max(group, key=lambda p: (p.gpu_demand_milli, p.key))
        weighed = room_worth(ws, ctx, pod, candidate_rows(ws, pod, options.candidates))
        if weighed is not None:
            waiting.append(Waiting(tuple(group), weighed[1]))
    return Beneficiaries(waiting)


OwnerLookup = Callable[[Mapping[str, tuple[str, OwnerRef]]], Mapping[str, OwnerFacts]]
"""Reads owners from the API server: owner key → (namespace, reference) in, the facts out (one
per key asked; a failed read is facts with a ``problem``, never an exception)."""

LOOKUP_ROUNDS = 3
"""Plans made with the owners known so far before every owner in the cluster is looked up."""


def plan_with_owners(
    cluster: Cluster, lookup: OwnerLookup, goal: Goal | str = Goal.ALL, **kwargs: object
) -> Plan:
    """:func:`make_plan` in which every victim's controlling owner was looked up and found to
    recreate it (:mod:`defrag.plan.owners`).

    Plan; look up the owners of its victims not looked up yet; plan again with what they
    said, until a plan's victims are all known (a refused owner blocks its pods, and the plan
    finds other victims). After :data:`LOOKUP_ROUNDS` plans every owner in the cluster is
    looked up at once, so the last plan is made on complete facts."""
    facts: dict[str, OwnerFacts] = {}
    for _ in range(LOOKUP_ROUNDS):
        plan = make_plan(cluster, goal, owners=facts, **kwargs)  # type: ignore[arg-type]
        wanted = _owners_of((cluster.pods.get(s.pod) for s in plan.steps), facts)
        if not wanted:
            return plan
        facts.update(lookup(wanted))
    facts.update(lookup(_owners_of(cluster.bound_pods(), facts)))
    return make_plan(cluster, goal, owners=facts, **kwargs)  # type: ignore[arg-type]


def _owners_of(
    pods: Iterable[Pod | None], known: Mapping[str, OwnerFacts]
) -> dict[str, tuple[str, OwnerRef]]:
    """The controlling owners of ``pods`` of the kinds defrag reads (opted-in kinds are trusted
    unread), not in ``known``."""
    wanted: dict[str, tuple[str, OwnerRef]] = {}
    for pod in pods:
        if pod is None or pod.owner is None or not read_kind(pod.owner):
            continue
        key = owner_key(pod)
        if key is not None and key not in known:
            wanted[key] = (pod.namespace, pod.owner)
    return wanted


@dataclass(frozen=True, slots=True)
class Rooms:
    """What make-room did for a list of starved groups."""

    steps: tuple[Step, ...]
    blocked: tuple[Blocked, ...]
    targets: tuple[str, ...]
    """``namespace/name (N GPU)`` of each pod given room by evictions."""
    unserved: int = 0
    """Groups left without room (those that fit already are served)."""
    worth: tuple[RoomWorth, ...] = ()
    """Each room made by evictions: what it is worth against its cost."""
    left: tuple[tuple[Pod, ...], ...] = ()
    """The groups left without room, in order."""


def make_rooms(
    ws: Workspace, ctx: SearchContext, groups: Iterable[Sequence[Pod]], options: PlanOptions
) -> Rooms:
    """Room for each group (a gang whole, or nothing of it), in order, on ``ws``.

    The steps evicting from a room's node carry ``for_pod`` (the executor reserves the node
    with ``defrag.io/reserved-for``). The daemon (through :func:`make_plan`) and the
    simulator's daemon hook both make room here.
    """
    steps: list[Step] = []
    blocked: dict[tuple[str, str], Blocked] = {}
    targets: list[str] = []
    worth: list[RoomWorth] = []
    left: list[tuple[Pod, ...]] = []
    unserved = 0

    def note(found: tuple[Blocked, ...]) -> None:
        for b in found:
            blocked.setdefault((b.pod, b.constraint), b)

    for group in groups:
        mark = ws.mark()
        n_steps, n_worth = len(steps), len(worth)
        ledger_state = ctx.ledger.snapshot()
        failed: tuple[Blocked, ...] = ()
        for pod in group:
            result = make_room(ws, ctx, pod, options, options.mode)
            note(result.blocked if result.ok else ())
            if result.row is None:
                failed = result.blocked
                break
            made = reserving(result.steps, pod.key, ws.node(result.row))
            if result.worth is not None:
                worth.append(result.worth)
                made = [replace(s, reason=f"{s.reason}; {weighed(result.worth)}") for s in made]
            steps.extend(made)
        if failed:
            unserved += 1
            left.append(tuple(group))
            ws.rollback(mark)
            del steps[n_steps:]
            del worth[n_worth:]
            ctx.ledger.restore(ledger_state)
            gang = gang_of(group[0]) if len(group) > 1 else None
            if gang:
                note(tuple(
                    Blocked(p.key, c.GANG, f"gang {gang} is placed whole or not at all")
                    for p in group
                ))  # fmt: skip
            note(failed)
        elif len(steps) > n_steps:  # pods that fit already need no target of their own
            targets.extend(f"{p.key} ({describe(p)})" for p in group)
    return Rooms(
        tuple(steps), tuple(blocked.values()), tuple(targets), unserved, tuple(worth), tuple(left)
    )


def weighed(worth: RoomWorth) -> str:
    """What a room is worth against its cost, as its steps' reason (and so the Event) says."""
    return (
        f"the room is worth {worth.value:.1f} GPU-hours ({worth.wait_h:.1f} h of waiting "
        f"saved) against {worth.cost:.1f} of lost work and restarts"
    )


def reserving(steps: tuple[Step, ...], pod: str, node: str) -> list[Step]:
    """The room's steps, those evicting from ``node`` marked as freeing it for ``pod``.

    Only the victims on the node the room is made on carry ``for_pod``: gang members evicted
    elsewhere and chained migrations free other nodes, for no one in particular.
    """
    return [replace(s, for_pod=pod) if s.source == node else s for s in steps]


def starved_groups(cluster: Cluster, now: datetime, options: PlanOptions) -> list[list[Pod]]:
    """Pending pods that qualify for make-room, a gang as one group, most urgent first.

    Never a gated pod (scheduling gates: not the scheduler's to place yet; reported nowhere) nor
    one no node could ever hold (reported by the starvation detector as ``unsatisfiable``,
    alert ``GPUJobUnsatisfiable``): no room places either, and trying would only evict. A gang
    with such a member gets no room at all (it is placed whole or not at all)."""
    groups: dict[str, list[Pod]] = defaultdict(list)
    never: set[str] = set()
    found = waiting(cluster)  # the pending pods and the nodes emptied, once per snapshot
    for pod in found.pods:
        if pod.priority < options.starved_priority or pod.is_gated:
            continue
        since = pod.pending_since or pod.created_at
        if options.starved_after > timedelta(0) and (
            since is None or utc(now) - utc(since) < options.starved_after
        ):
            continue
        key = gang_of(pod) or pod.key
        if not found.fits_ever(pod):
            never.add(key)
        groups[key].append(pod)
    groups = {k: g for k, g in groups.items() if k not in never}
    if options.only is not None:
        named = options.only
        groups = {k: g for k, g in groups.items() if any(p.key in named for p in g)}

    def urgency(group: list[Pod]) -> tuple[int, datetime, str]:
        first = min(group, key=lambda p: p.key)
        since = first.pending_since or first.created_at or now
        return (-max(p.priority for p in group), utc(since), first.key)

    ordered = sorted(groups.values(), key=urgency)
    return [sorted(g, key=lambda p: (-p.gpu_demand_milli, p.key)) for g in ordered]
