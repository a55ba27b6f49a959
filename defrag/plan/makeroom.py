"""Make room: give a pending pod a node by moving (or, last, preempting) the cheapest pods.

Candidate nodes are those that could hold the pod once emptied (model, taints, capacity),
ranked by how little must be freed on them; on the best few the victim search of
:mod:`defrag.plan.room` prices the cheapest victim set, and the cheapest set whose victims all
find a new node (or may be preempted) wins. Passes, in order:

1. **migrations alone**: victims of any priority, each re-placed where the scheduler's own
   filter + score puts it on the rest of the cluster, at once — no pod loses its place (it
   restarts elsewhere: its lost work and restart are the move's price);
2. **preemption as the last resort**: victims ranking strictly below the pod may be preempted
   when they fit nowhere; pods of the same or a higher priority may still be in the set, but
   only as migrations that re-fit.

A preemption that only swaps one job for another of the same size is refused unless asked for
(``swaps``): it frees nothing for the cluster, the scheduler's own priority preemption does it,
and it throws away the victim's work since its checkpoint (docs/planning.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays
from defrag.model.resources import DRAIN_TAINT_KEY, Pod, Toleration
from defrag.model.status import Status
from defrag.model.units import GPU_MILLI
from defrag.model.utc import utc
from defrag.model.workload import Shape
from defrag.plan import constraints as c
from defrag.plan.config import MakeRoomMode, PlanOptions
from defrag.plan.cost import workload_kind
from defrag.plan.departures import Departures
from defrag.plan.model import Blocked, RoomWorth, Step
from defrag.plan.room import (
    Nest,
    Preemptable,
    Relocation,
    Room,
    SearchContext,
    VictimFilter,
    relocate,
)
from defrag.plan.spare import sparing
from defrag.plan.workspace import Workspace
from defrag.scoring.filters import feasible_mask, node_mask
from defrag.scoring.framework import Placement
from defrag.scoring.scheduler import schedule


@dataclass(frozen=True, slots=True)
class RoomResult:
    """Steps that make room for a pod (empty when it fits already), or what blocked it."""

    pod: str
    steps: tuple[Step, ...]
    blocked: tuple[Blocked, ...]
    row: int | None
    gpus: tuple[int, ...] = ()
    worth: RoomWorth | None = None
    """What the room made by evictions is worth against its cost (None: not weighed)."""

    @property
    def ok(self) -> bool:
        return self.row is not None


@dataclass(frozen=True, slots=True)
class _Pass:
    allowed: VictimFilter
    movable: Callable[[Pod], bool] | None
    nest: Nest | None
    preempt: Preemptable
    rules: tuple[object, ...] | None
    """What ``allowed`` and ``movable`` decide by besides the workspace (the room searches'
    key, :meth:`~defrag.plan.room.SearchContext.room`); None: a chained victim's, not kept."""


def make_room(
    ws: Workspace, ctx: SearchContext, pod: Pod, options: PlanOptions, mode: MakeRoomMode
) -> RoomResult:
    """Room for ``pod`` on the cheapest node; the workspace keeps the pod reserved there.

    ``mode`` says which victims may be touched (:class:`~defrag.plan.config.MakeRoomMode`):
    by default victims of any priority *move* — never are preempted — when each re-fits
    elsewhere at once, and only then strictly lower ones are preempted; the ``lower-priority``
    modes touch strictly lower victims only (the planner before issue 17); ``fill`` lifts the
    priority rule altogether (the simulator's fill protocol, where pods only migrate and
    nothing is lost). From ``options``: a victim that fits nowhere may get room made for it in
    turn, ``depth`` levels deep (a chain of migrations); ``max_moves_per_room`` skips rooms
    with more victims; ``swaps`` allows a preemption that frees no more GPU share than it
    preempts (see the module's docstring); ``room_worth`` > 0 makes a room only when what it
    is worth (:func:`room_worth`) reaches ``room_worth`` × the room's cost;
    ``spare_jobs`` keeps a multi-GPU job that cannot checkpoint on request in place for a
    multi-GPU pod of equal or lower priority (:mod:`defrag.plan.spare`);
    ``candidates`` and ``tries`` bound the search.
    """
    return _make_room(
        ws, ctx, pod,
        preempt=mode.preempts, candidates=options.candidates, tries=options.tries,
        any_priority=mode is MakeRoomMode.FILL, depth=options.depth,
        migrate_any=mode.migrates_any_priority, max_moves=options.max_moves_per_room,
        swaps=options.swaps, worth=options.room_worth, spare=options.spare_jobs,
    )  # fmt: skip


def room_being_emptied(ws: Workspace, ctx: SearchContext, pod: Pod) -> RoomResult | None:
    """A node whose only obstacles to ``pod`` are Terminating pods, and that is not kept for
    another pod: a room already made (by an earlier cycle, or a leader before a restart) that
    the pod takes once they are gone. Making a second room for it would only evict more.

    The node reserved for the pod comes first. The pod is reserved there in the workspace,
    with the Terminating pods taken off (they are leaving either way). The drain taint is
    defrag's own and comes off when the drain ends (a restart's reconcile takes it off a drain
    whose evictions all went out), so it does not count as an obstacle here."""
    draining = replace(pod, tolerations=(*pod.tolerations, Toleration(DRAIN_TAINT_KEY, "Exists")))
    rows = [r for r in ws.leaving() if not ws.no_target[r] and not ws.kept_for_another(r, pod)]
    rows.sort(key=lambda r: (r not in ws.reserved_for, ws.node(r)))
    for row in rows:
        mark = ws.mark()
        for seat in [s for s in ws.occupants(row) if s.pod.terminating]:
            ws.remove(seat.pod.key)
        elsewhere = np.ones(len(ws.arrays), dtype=bool)
        elsewhere[row] = False
        placed = schedule(draining, ws.arrays, ctx.policy, exclude=elsewhere, why=False)
        if isinstance(placed, Placement):
            ws.reserve(pod, placed.row, placed.gpus)
            return RoomResult(pod.key, (), (), placed.row, placed.gpus)
        ws.rollback(mark)
    return None


def _make_room(
    ws: Workspace,
    ctx: SearchContext,
    pod: Pod,
    *,
    preempt: bool,
    candidates: int,
    tries: int,
    any_priority: bool = False,
    depth: int,
    place: bool = False,
    allowed: VictimFilter | None = None,
    migrate_any: bool = True,
    max_moves: int | None = None,
    swaps: bool = False,
    worth: float = 0.0,
    spare: bool = False,
) -> RoomResult:
    """:func:`make_room` with the mode spelled out; ``place`` and ``allowed`` are for a chained
    victim (:func:`_nest`): it is put on its node as a running pod instead of reserving the
    room, with the victims the outer room allows."""
    placed = schedule(pod, ws.arrays, ctx.policy, exclude=ws.no_target)
    if isinstance(placed, Placement):
        (ws.place if place else ws.reserve)(pod, placed.row, placed.gpus)
        return RoomResult(pod.key, (), (), placed.row, placed.gpus)
    chained = allowed is not None
    if not chained and not place:
        emptying = room_being_emptied(ws, ctx, pod)
        if emptying is not None:
            return emptying
    if allowed is None:
        allowed = ctx.victim_filter(None if any_priority else pod.priority)
    guard = (lambda f: sparing(f, pod)) if spare and not chained else (lambda f: f)
    allowed = guard(allowed)
    rows = candidate_rows(ws, pod, candidates)
    blocked: dict[str, Blocked] = {}
    reason = f"make room for {pod.key} ({describe(pod)})"
    nest = _nest(ws, ctx, allowed, depth - 1, candidates, tries) if depth > 0 else None
    weighed = room_worth(ws, ctx, pod, rows) if worth > 0 and not chained else None
    value = None if weighed is None else weighed[0]
    budget = None if value is None else value / worth
    passes: list[_Pass] = []
    if migrate_any and not any_priority and not chained:
        everyone = guard(ctx.victim_filter(None))
        placeable = placeable_elsewhere(ws)
        passes.append(_Pass(everyone, placeable, None, False, ("below", None, True)))
        if preempt or depth > 0:
            mixed = _lower_or_movable(everyone, pod.priority, placeable)
            lower = _below(pod.priority) if preempt else False
            passes.append(_Pass(mixed, None, nest, lower, ("mixed", pod.priority, False)))
    else:
        # First victims that fit elsewhere as they are; then, if that fails, any victim, with
        # chains of migrations (depth) or preemption making room for the ones that fit nowhere.
        below = None if chained else ("below", None if any_priority else pod.priority)
        if not preempt:
            moves = None if below is None else (*below, True)
            passes.append(_Pass(allowed, placeable_elsewhere(ws), None, False, moves))
        if preempt or depth > 0:
            passes.append(_Pass(allowed, None, nest, preempt, below and (*below, False)))
    if spare and not chained:  # the guard reads the pod's kind and priority: part of the key
        spare_key = ("spare", workload_kind(pod), pod.priority)
        passes = [p if p.rules is None else replace(p, rules=(*p.rules, spare_key)) for p in passes]
    dear: tuple[int, float] | None = None  # the cheapest room refused as not worth it
    for p in passes:
        rooms: list[Room] = []
        for row in rows:
            found = ctx.room(ws, int(row), pod, p.rules, p.allowed, p.movable)
            if isinstance(found, Room):
                if max_moves is not None and len(found.victims) > max_moves:
                    continue
                rooms.append(found)
            elif len(blocked) < 20:
                for b in found:
                    blocked.setdefault(b.pod, b)
        rooms.sort(key=lambda r: (r.cost, len(r.victims), r.row))
        for room in rooms[:tries]:
            mark, ledger_state = ws.mark(), ctx.ledger.snapshot()
            done = relocate(
                ws, ctx, room, pod,
                reason=f"{reason} on {ws.node(room.row)}",
                allowed=p.allowed, preempt=p.preempt, place=place, nest=p.nest,
            )  # fmt: skip
            price = waits = None
            if isinstance(done, Relocation) and budget is not None:
                waits = victims_wait(ws, ctx, done, candidates)
                price = round(known_cost(ctx, done, ws) + waits, 6)
                if price > budget:
                    ws.rollback(mark)
                    ctx.ledger.restore(ledger_state)
                    if dear is None or price < dear[1]:
                        dear = (room.row, price)
                    continue
            if isinstance(done, Relocation) and not swaps and is_swap(pod, done.steps, ws):
                ws.rollback(mark)
                ctx.ledger.restore(ledger_state)
                blocked.setdefault(
                    pod.key,
                    Blocked(pod.key, c.NO_ROOM, f"{ws.node(room.row)}: only by preempting as "
                            "much GPU as it frees (a swap; the scheduler's preemption does that)"),
                )  # fmt: skip
                continue
            if isinstance(done, Relocation):
                for b in room.blocked:
                    blocked.setdefault(b.pod, b)
                weight = None
                if weighed is not None and price is not None and done.steps:
                    weight = RoomWorth(
                        pod.key, ws.node(room.row), weighed[0], price, weighed[1],
                        victims_wait=waits or 0.0,
                    )  # fmt: skip
                return RoomResult(
                    pod.key, done.steps, tuple(blocked.values()), room.row, done.gpus, weight
                )
            for b in done:
                blocked.setdefault(b.pod, b)
    if dear is not None and weighed is not None:
        value, wait = weighed
        basis = (
            f"the wait it would save is worth {value:.2f} ({describe(pod)} × {wait:.2f} h "
            "until the cluster frees such a room by itself)"
            if ctx.departures is not None
            else f"the pod's wait so far is worth {value:.2f} ({describe(pod)} × hours pending)"
        )
        blocked[pod.key] = Blocked(
            pod.key, c.NOT_WORTH,
            f"the cheapest room ({ws.node(dear[0])}) costs {dear[1]:.2f} GPU-hours of lost "
            f"work, restarts and its victims' wait; {basis}",
        )  # fmt: skip
    if not blocked:
        blocked[pod.key] = Blocked(pod.key, c.NO_ROOM, placed.summary)
    return RoomResult(pod.key, (), tuple(blocked.values()), None)


def known_cost(ctx: SearchContext, done: Relocation, ws: Workspace) -> float:
    """The room's evictions (chained migrations included) priced by
    :meth:`~defrag.plan.cost.CostModel.known`; a preemption ``preempt_factor`` times a move."""
    pods = {pod.key: pod for pod, _ in done.evictions}
    total = 0.0
    for step in done.steps:
        pod = pods.get(step.pod)
        if pod is None:  # a chained migration: the pod sits at its new seat
            seat = ws.where.get(step.pod)
            if seat is None:
                continue
            pod = seat.pod
        price = ctx.cost_model.known(pod, ctx.now)
        total += price * (ctx.cost_model.preempt_factor if step.kind == "preempt" else 1.0)
    return round(total, 6)


def victims_wait(ws: Workspace, ctx: SearchContext, done: Relocation, candidates: int) -> float:
    """GPUs × hours the room's victims will wait to be placed again, summed: a victim the
    plan re-places at once (a move) waits for nothing; a preempted one waits until some node
    frees a seat for it as its pods leave, the soonest of its ``candidates`` nodes (the
    forecast, :meth:`~defrag.plan.departures.Departures.room_wait`; the horizon when none
    does). 0 without a forecast (``ctx.departures``)."""
    deps = ctx.departures
    if deps is None or ctx.now is None:
        return 0.0
    pods = {pod.key: pod for pod, _ in done.evictions}
    total = 0.0
    for step in done.steps:
        pod = pods.get(step.pod)
        if step.kind != "preempt" or pod is None or pod.gpu_demand_milli == 0:
            continue
        wait = soonest_room(ws, deps, pod, candidate_rows(ws, pod, candidates), ctx.now)
        total += pod.gpu_demand_milli / GPU_MILLI * wait
    return round(total, 6)


def room_worth(
    ws: Workspace, ctx: SearchContext, pod: Pod, rows: np.ndarray
) -> tuple[float, float] | None:
    """(what making room for ``pod`` now is worth in GPU-hours, the hours of waiting it
    counts), or None when unknown (no limit).

    With a forecast (``ctx.departures``): the pod's GPUs × the hours until the cluster would
    free such a room by itself — under a packing scheduler the soonest any candidate node
    (``rows``) frees enough as its pods leave in the order they are expected to
    (:meth:`~defrag.plan.departures.Departures.room_wait`); under any other scheduler the
    horizon, as the scheduler puts pending and arriving pods on what departures free. Without
    one: the pod's GPUs × :func:`hours_pending`, its wait so far."""
    deps = ctx.departures
    if ctx.now is None or pod.gpu_demand_milli == 0:
        return None
    if deps is None:
        wait = hours_pending(pod, ctx.now)
        if wait is None:
            return None
    else:
        wait = deps.horizon_h
        if ctx.history.packing:
            wait = soonest_room(ws, deps, pod, rows, ctx.now)
    return pod.gpu_demand_milli / GPU_MILLI * wait, wait


def soonest_room(
    ws: Workspace, deps: Departures, pod: Pod, rows: Iterable[int] | np.ndarray, now: datetime
) -> float:
    """Hours until the first of ``rows`` frees a seat for ``pod`` as its pods leave in the
    order they are expected to (:meth:`~defrag.plan.departures.Departures.room_wait`); the
    horizon when none does within it."""
    a = ws.arrays
    wait = deps.horizon_h
    for row in rows:
        r = int(row)
        free = a.gpu_free[r][: int(a.gpu_total[r])]
        seats = [(o.pod, o.gpus) for o in ws.occupants(r) if not o.pod.terminating]
        wait = min(wait, deps.room_wait(pod, free, seats, now))
        if wait == 0:
            break
    return wait


def hours_pending(pod: Pod, now: datetime) -> float | None:
    """Hours ``pod`` has been pending (since ``pending_since``, else its creation): its wait so
    far, which ``make_room_value: waited`` takes as the wait a room would spare it. None when
    unknown (no limit)."""
    since = pod.pending_since or pod.created_at
    if since is None:
        return None
    return max((utc(now) - utc(since)).total_seconds() / 3600.0, 0.0)


def is_swap(pod: Pod, steps: tuple[Step, ...], ws: Workspace) -> bool:
    """Whether a room preempts at least as much GPU share as ``pod`` asks (a pod holding no
    GPU counts its CPU instead): one job run in place of another, nothing freed."""
    preempted = [s for s in steps if s.kind == "preempt"]
    if not preempted:
        return False
    if pod.gpu_demand_milli > 0:
        return sum(s.gpus_held for s in preempted) * GPU_MILLI >= pod.gpu_demand_milli
    return False


def _below(priority: int) -> Callable[[Pod], bool]:
    def lower(victim: Pod) -> bool:
        return victim.priority < priority

    return lower


def _lower_or_movable(
    allowed: VictimFilter, priority: int, movable: Callable[[Pod], bool]
) -> VictimFilter:
    """Victims ranking strictly below ``priority`` (they may be preempted), or that fit on
    another node (a pod of the same or higher priority only ever moves)."""

    def check(victim: Pod) -> Status:
        status = allowed(victim)
        if not status.ok or victim.priority < priority or movable(victim):
            return status
        return Status.fail(
            f"{c.PRIORITY}: priority {victim.priority} not below the pending pod's {priority} "
            "and it fits on no other node (it could only be preempted)"
        )

    return check


def _nest(
    ws: Workspace,
    ctx: SearchContext,
    allowed: VictimFilter,
    depth: int,
    candidates: int,
    tries: int,
) -> Nest:
    def chain(victim: Pod) -> tuple[tuple[Step, ...], int, tuple[int, ...]] | None:
        result = _make_room(
            ws, ctx, victim, preempt=False, candidates=candidates, tries=tries,
            depth=depth, place=True, allowed=allowed,
        )  # fmt: skip
        if result.row is None:
            return None
        return result.steps, result.row, result.gpus

    return chain


def candidate_rows(ws: Workspace, pod: Pod, limit: int) -> np.ndarray:
    """Rows that could hold ``pod`` once emptied, fewest GPUs (then CPU) to free first.

    CPU held by CPU-only pods counts as nearly free (they fit almost anywhere); a row whose
    CPU could only come from GPU pods ranks after every row where it need not.
    """
    a = ws.arrays
    ok = static_mask(pod, a) & ~ws.no_target
    rows = np.flatnonzero(ok)
    if len(rows) == 0:
        return rows
    deficit = gpu_deficit(pod, a)[rows]
    short = np.maximum(pod.cpu_milli - a.cpu_free[rows], 0)
    rank = deficit + short / np.maximum(a.cpu_total[rows], 1)
    if short.any():
        rank = rank + 10.0 * (short > ws.gpuless_cpu[rows])
    if len(rows) > limit:
        keep = np.argpartition(rank, limit - 1)[:limit]
        rows, rank = rows[keep], rank[keep]
    order = np.lexsort((rows, rank))
    return np.asarray(rows[order])


def placeable_elsewhere(ws: Workspace) -> Callable[[Pod], bool]:
    """Whether a pod of this shape fits on some node the plan may use (cached per shape)."""
    seen: dict[tuple[object, ...], bool] = {}

    def movable(pod: Pod) -> bool:
        shape = (Shape.of(pod), pod.memory_mib, pod.gpu_memory_mib, pod.tolerations)
        ok = seen.get(shape)
        if ok is None:
            ok = bool(feasible_mask(pod, ws.arrays, ws.no_target).any())
            seen[shape] = ok
        return ok

    return movable


def static_mask(pod: Pod, a: NodeArrays) -> BoolArray:
    """Nodes whose capacity (not their free resources) can hold the pod, and that its
    nodeSelector, node affinity, tolerations and the cordon admit. A pod asking pool units
    (MIG profiles, time-sliced replicas) gets no room made: pools have no exclusive GPUs to
    free (docs/planning.md)."""
    if pod.pool:
        return np.zeros(len(a), dtype=bool)
    ok = node_mask(pod, a) & (a.cpu_total >= pod.cpu_milli) & (a.mem_total >= pod.memory_mib)
    if pod.num_gpu:
        ok &= (a.gpu_total >= pod.num_gpu) & a.model_allowed(pod)
        if pod.gpu_memory_mib:
            ok &= a.gpu_mem >= pod.gpu_memory_mib
    return np.asarray(ok)


def gpu_deficit(pod: Pod, a: NodeArrays) -> FloatArray:
    """[N] GPUs that would have to be freed for the pod, ignoring which pods hold them."""
    if pod.num_gpu == 0:
        return np.zeros(len(a))
    if pod.gpu_milli < GPU_MILLI:
        best = a.gpu_free.max(axis=1)
        return np.asarray(np.maximum(pod.gpu_milli - best, 0) / GPU_MILLI, dtype=np.float64)
    return np.asarray(np.maximum(pod.num_gpu - a.largest_job(), 0), dtype=np.float64)


def describe(pod: Pod) -> str:
    if pod.num_gpu == 0:
        return "no GPU"
    if pod.gpu_milli < GPU_MILLI:
        return f"{pod.gpu_milli / GPU_MILLI:.2f} GPU"
    return f"{pod.num_gpu} GPU"
