"""Making room on one node: the cheapest victim set, then re-placing the victims.

:func:`find_room` picks, on one node, the cheapest set of evictable pods whose removal lets a
pod fit (whole GPUs inside one NVLink domain, or enough entirely free domains; a GPU with
enough free share for a GPU-sharing pod; CPU and memory). It clears GPUs greedily by cost per
GPU freed, then drops victims that turn out unneeded.

:func:`relocate` evicts a room's victims (whole gangs), gives the room to the pod it was made
for, and re-places every victim with the scheduler's own filter + score on the rest of the
cluster (the node and every node the plan keeps free are out of reach). A victim that fits
nowhere is preempted when the caller allows it (for that victim: only pods ranking strictly below
the pod the room is made for may be preempted); otherwise the attempt is rolled back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from defrag.model.resources import Pod
from defrag.model.status import Status
from defrag.model.units import GPU_MILLI
from defrag.plan import constraints as c
from defrag.plan.config import Constraints
from defrag.plan.constraints import Ledger, blocked_from, check_filters, check_pod, gang_of
from defrag.plan.cost import CostModel, gpus_held
from defrag.plan.departures import Departures
from defrag.plan.history import NO_HISTORY, History
from defrag.plan.model import Blocked, Step
from defrag.plan.workspace import Occupant, Workspace
from defrag.scoring.framework import Placement, Policy
from defrag.scoring.scheduler import schedule

_KEPT_ROOMS = 100_000
"""Room searches a context keeps at most (then it forgets them all and starts again)."""

VictimFilter = Callable[[Pod], Status]
Preemptable = bool | Callable[[Pod], bool]
"""Whether a victim that fits nowhere may be preempted: for all victims, or per victim."""


@dataclass(slots=True)
class SearchContext:
    """What every room search of one plan shares: policy, budgets, costs and their caches."""

    policy: Policy
    ledger: Ledger
    constraints: Constraints
    cost_model: CostModel
    now: datetime | None
    enforce: bool = True
    """False in the simulator: trace pods have no owners, ages or PDBs, so only the operator's
    eviction filters (:func:`~defrag.plan.constraints.check_filters`) apply."""
    history: History = NO_HISTORY
    """The daemon's recent evictions (a victim evicted within the guard is refused) and the
    packing verdict (:mod:`defrag.plan.history`)."""
    departures: Departures | None = None
    """The running pods' expected departures (make-room's forecast); None: not forecast."""
    _checks: dict[str, Status] = field(default_factory=dict)
    _costs: dict[int, tuple[Pod, float]] = field(default_factory=dict)
    """By the pod object's id (the pod is kept, so the id is not reused while cached)."""
    _rooms: dict[tuple[object, ...], Room | tuple[Blocked, ...]] = field(default_factory=dict)
    """Room searches by workspace version, row, victim rules and pod shape (:meth:`room`)."""

    def room(
        self,
        ws: Workspace,
        row: int,
        pod: Pod,
        rules: tuple[object, ...] | None,
        allowed: VictimFilter,
        movable: Callable[[Pod], bool] | None = None,
    ) -> Room | tuple[Blocked, ...]:
        """:func:`find_room` with this context's costs, its answer kept under the workspace's
        version: a search on a state seen before (the same again after a room that failed
        was rolled back) is not redone. ``rules`` names all that ``allowed`` and ``movable``
        decide by besides the workspace and this context (None: the answer is not kept). The
        search reads of ``pod`` only its GPUs, GPU share, CPU and memory."""
        if rules is None:
            return find_room(ws, row, pod, allowed, self.cost, movable)
        key = (ws.version, row, rules, pod.num_gpu, pod.gpu_milli, pod.cpu_milli, pod.memory_mib)
        found = self._rooms.get(key)
        if found is None:
            if len(self._rooms) >= _KEPT_ROOMS:
                self._rooms.clear()
            found = find_room(ws, row, pod, allowed, self.cost, movable)
            self._rooms[key] = found
        return found

    def check(self, pod: Pod) -> Status:
        status = self._checks.get(pod.key)
        if status is None:
            status = (
                check_pod(pod, self.constraints, self.now, self.ledger.owners)
                if self.enforce
                else check_filters(pod, self.constraints)
            )
            if status.ok:
                status = self.history.evicted.check(
                    pod, self.now, self.constraints.evict_again_after
                )
            self._checks[pod.key] = status
        return status

    def cost(self, pod: Pod) -> float:
        hit = self._costs.get(id(pod))
        if hit is not None and hit[0] is pod:
            return hit[1]
        value = self.cost_model.eviction(pod, self.now)
        self._costs[id(pod)] = (pod, value)
        return value

    def victim_filter(self, below_priority: int | None) -> VictimFilter:
        """Pods that pass every per-pod constraint (and rank strictly below a priority)."""

        def allowed(pod: Pod) -> Status:
            status = self.check(pod)
            if status.ok and below_priority is not None and pod.priority >= below_priority:
                return Status.fail(
                    f"{c.PRIORITY}: priority {pod.priority} not below the pending pod's "
                    f"{below_priority}"
                )
            return status

        return allowed


@dataclass(frozen=True, slots=True)
class Room:
    row: int
    victims: tuple[str, ...]
    cost: float
    blocked: tuple[Blocked, ...] = ()


@dataclass(frozen=True, slots=True)
class Relocation:
    steps: tuple[Step, ...]
    evictions: tuple[tuple[Pod, str], ...]
    receivers: tuple[int, ...]
    gpus: tuple[int, ...] = ()
    """The GPU slots the pod the room was made for takes."""


Nest = Callable[[Pod], "tuple[tuple[Step, ...], int, tuple[int, ...]] | None"]
"""Makes room for a victim that fits nowhere (one level deeper): the steps that did it (already
applied to the workspace, the victim placed), its row and GPU slots; None when impossible."""


def find_room(
    ws: Workspace,
    row: int,
    pod: Pod,
    allowed: VictimFilter,
    cost: Callable[[Pod], float],
    movable: Callable[[Pod], bool] | None = None,
) -> Room | tuple[Blocked, ...]:
    """The cheapest victims on ``row`` that let ``pod`` fit, or what blocked every option.

    ``movable`` (when given) rules out victims that could fit on no other node right now.
    """
    search = _Search(ws, row, pod, allowed, cost, movable)
    victims = search.gpu_victims()
    if victims is None:
        return tuple(search.blocked.values())
    victims = search.top_up(victims)
    if victims is None:
        return tuple(search.blocked.values())
    total = sum(cost(o.pod) for o in victims.values())
    return Room(row, tuple(sorted(victims)), round(total, 6), tuple(search.blocked.values()))


def moved(ws: Workspace, key: str) -> Status | None:
    """The refusal of a victim this plan has already moved (None when it has not)."""
    if not ws.moved(key):
        return None
    return Status.fail(f"{c.MOVED}: this plan already moves it (its replacement is a new pod)")


class _Search:
    """One node's victim search. Per-GPU state is kept in plain lists (≤ 8 GPUs: faster
    than numpy at this size)."""

    def __init__(
        self,
        ws: Workspace,
        row: int,
        pod: Pod,
        allowed: VictimFilter,
        cost: Callable[[Pod], float],
        movable: Callable[[Pod], bool] | None,
    ) -> None:
        a = ws.arrays
        self.ws, self.row, self.pod, self.allowed, self.cost = ws, row, pod, allowed, cost
        self.movable = movable
        self.total = int(a.gpu_total[row])
        self.free: list[int] = a.gpu_free[row, : self.total].tolist()
        self.domain: list[int] = a.gpu_domain[row, : self.total].tolist()
        self.sizes: list[int] = [int(x) for x in a.domain_size[row] if x > 0]
        self.occ: list[list[Occupant]] = [[] for _ in range(self.total)]
        for o in ws.occupants(row):
            for g in o.gpus if o.pod.num_gpu else ():
                self.occ[g].append(o)
        self.blocked: dict[str, Blocked] = {}
        self._ok: dict[str, bool] = {}

    def _usable(self, occupants: Iterable[Occupant]) -> bool:
        ok = True
        for o in occupants:
            key = o.pod.key
            known = self._ok.get(key)
            if known is None:
                status = moved(self.ws, key) or self.allowed(o.pod)
                if not status.ok:
                    self.blocked.setdefault(key, blocked_from(key, status))
                known = status.ok and (self.movable is None or self.movable(o.pod))
                self._ok[key] = known
            ok = ok and known
        return ok

    def _freed(self, victims: dict[str, Occupant]) -> list[int]:
        free = self.free[:]
        for o in victims.values():
            for g in o.gpus if o.pod.num_gpu else ():
                free[g] += o.pod.gpu_milli
        return free

    # --- GPUs -----------------------------------------------------------------------------

    def gpu_victims(self) -> dict[str, Occupant] | None:
        pod = self.pod
        if pod.num_gpu == 0:
            return {}
        if pod.gpu_milli < GPU_MILLI:
            return self._share_victims(pod.gpu_milli)
        r = pod.num_gpu
        max_dom = max(self.sizes, default=0)
        if r > self.total:
            return None
        if r <= max_dom:
            best: tuple[float, dict[str, Occupant]] | None = None
            for d, size in enumerate(self.sizes):
                if size < r:
                    continue
                gpus = [g for g in range(self.total) if self.domain[g] == d]
                found = self._clear(gpus, r)
                if found is not None:
                    price = sum(self.cost(o.pod) for o in found.values())
                    if best is None or price < best[0]:
                        best = (price, found)
            return None if best is None else best[1]
        return self._clear_domains(r)

    def _clear(self, gpus: list[int], r: int) -> dict[str, Occupant] | None:
        """Victims that leave ``r`` entirely free GPUs among ``gpus`` (greedy, then pruned)."""

        def whole(free: list[int]) -> int:
            return sum(1 for g in gpus if free[g] >= GPU_MILLI)

        victims: dict[str, Occupant] = {}
        free = self.free[:]
        have = whole(free)
        if have < r and self._hopeless(gpus, r, have):
            return None
        while have < r:
            best: tuple[float, int, list[Occupant]] | None = None
            for g in gpus:
                if free[g] >= GPU_MILLI:
                    continue
                pods = [o for o in self.occ[g] if o.pod.key not in victims]
                if not self._usable(pods):
                    continue
                trial = free[:]
                for o in pods:
                    for gi in o.gpus:
                        trial[gi] += o.pod.gpu_milli
                gain = whole(trial) - have
                if gain <= 0:
                    continue
                price = sum(self.cost(o.pod) for o in pods) / gain
                if best is None or price < best[0]:
                    best = (price, g, pods)
            if best is None:
                return None
            for o in best[2]:
                victims[o.pod.key] = o
                for gi in o.gpus:
                    free[gi] += o.pod.gpu_milli
            have = whole(free)
        return self._prune(victims, lambda f: whole(f) >= r)

    def _hopeless(self, gpus: list[int], r: int, have: int) -> bool:
        """Whether :meth:`_clear` cannot reach ``r`` whole GPUs among ``gpus``: a GPU turns
        whole only once every pod on it goes, so at most the ``have`` whole ones and those
        whose pods are all usable can be. Checks the pods in the order of the greedy's first
        round (which checks them all), so what ``blocked`` records is the same."""
        usable = sum(1 for g in gpus if self.free[g] < GPU_MILLI and self._usable(self.occ[g]))
        return have + usable < r

    def _clear_domains(self, r: int) -> dict[str, Occupant] | None:
        """Victims that leave whole NVLink domains free, holding at least ``r`` GPUs together."""
        members = [
            [g for g in range(self.total) if self.domain[g] == d] for d in range(len(self.sizes))
        ]
        options: list[tuple[float, int, list[Occupant]]] = []
        for d, size in enumerate(self.sizes):
            held = {o.pod.key: o for g in members[d] for o in self.occ[g]}
            if not self._usable(held.values()):
                continue
            price = sum(self.cost(o.pod) for o in held.values())
            options.append((price / size, d, list(held.values())))
        victims: dict[str, Occupant] = {}
        gained = 0
        for _, d, pods in sorted(options, key=lambda t: (t[0], t[1])):
            if gained >= r:
                break
            for o in pods:
                victims[o.pod.key] = o
            gained += self.sizes[d]
        if gained < r:
            return None

        def spans(free: list[int]) -> bool:
            full = sum(
                size
                for d, size in enumerate(self.sizes)
                if all(free[g] >= GPU_MILLI for g in members[d])
            )
            return full >= r

        return self._prune(victims, spans)

    def _share_victims(self, milli: int) -> dict[str, Occupant] | None:
        best: tuple[float, int, dict[str, Occupant]] | None = None
        for g in range(self.total):
            victims: dict[str, Occupant] = {}
            free = self.free[g]
            ordered = sorted(self.occ[g], key=lambda o: (self.cost(o.pod), o.pod.key))
            for o in ordered:
                if free >= milli:
                    break
                if not self._usable([o]):
                    continue
                victims[o.pod.key] = o
                free += o.pod.gpu_milli
            if free < milli:
                continue
            price = sum(self.cost(o.pod) for o in victims.values())
            if best is None or price < best[0]:
                best = (price, g, victims)
        return None if best is None else best[2]

    def _prune(
        self, victims: dict[str, Occupant], enough: Callable[[list[int]], bool]
    ) -> dict[str, Occupant]:
        for key in sorted(victims, key=lambda k: (-self.cost(victims[k].pod), k)):
            trial = {k: o for k, o in victims.items() if k != key}
            if enough(self._freed(trial)):
                victims = trial
        return victims

    # --- CPU and memory ---------------------------------------------------------------------

    def top_up(self, victims: dict[str, Occupant]) -> dict[str, Occupant] | None:
        a, row, pod = self.ws.arrays, self.row, self.pod

        def short() -> bool:
            cpu = int(a.cpu_free[row]) + sum(o.pod.cpu_milli for o in victims.values())
            mem = int(a.mem_free[row]) + sum(o.pod.memory_mib for o in victims.values())
            return cpu < pod.cpu_milli or mem < pod.memory_mib

        if not short():
            return victims
        rest = [
            o
            for o in self.ws.occupants(row)
            if o.pod.key not in victims and (o.pod.cpu_milli or o.pod.memory_mib)
        ]
        # CPU-only pods first (they fit almost anywhere), then the cheapest per CPU freed.
        rest.sort(
            key=lambda o: (
                o.pod.num_gpu > 0,
                self.cost(o.pod) / max(o.pod.cpu_milli, 1),
                o.pod.key,
            )
        )
        for o in rest:
            if not self._usable([o]):
                continue
            victims[o.pod.key] = o
            if not short():
                return victims
        return None


def relocate(
    ws: Workspace,
    ctx: SearchContext,
    room: Room,
    pod: Pod | None,
    *,
    reason: str,
    allowed: VictimFilter,
    preempt: Preemptable,
    place: bool = False,
    nest: Nest | None = None,
) -> Relocation | tuple[Blocked, ...]:
    """Evict the room's victims (with their gangs), give the room to ``pod``, re-place them.

    ``pod`` is reserved there (a pending pod), or placed (``place``: a victim one level up).
    A victim that fits nowhere gets room made for it by ``nest``, else is preempted when
    ``preempt`` (a predicate: when it says so for every pod of the victim's gang), else the
    attempt fails. On success the workspace holds the new state and the
    ledger has the evictions committed (a caller that undoes it rolls back the workspace to a
    ``ws.mark()`` and the ledger to a ``snapshot()`` taken before); on failure both are as
    they were and the answer says what blocked.
    """
    node = ws.node(room.row)
    groups = _with_gangs(ws, room.victims, allowed)
    if isinstance(groups, Blocked):
        return (groups,)
    evictions = tuple(
        (ws.where[k].pod, ws.node(ws.where[k].row)) for group in groups for k in group
    )
    status, culprit = ctx.ledger.check(evictions)
    if not status.ok:
        return (blocked_from(culprit or "", status),)
    mark = ws.mark()
    ledger_state = ctx.ledger.snapshot()
    ctx.ledger.commit(evictions)
    seats = {k: ws.remove(k) for group in groups for k in group}
    pod_gpus: tuple[int, ...] = ()
    if pod is not None:
        only = np.ones(len(ws.arrays), dtype=bool)
        only[room.row] = False
        placed = schedule(pod, ws.arrays, ctx.policy, exclude=only)
        if not isinstance(placed, Placement):
            ws.rollback(mark)
            ctx.ledger.restore(ledger_state)
            return (Blocked(pod.key, c.NO_ROOM, f"{node}: {placed.summary}"),)
        pod_gpus = placed.gpus
        if place:
            ws.place(pod, room.row, pod_gpus)
        else:
            ws.reserve(pod, room.row, pod_gpus)
    ws.forbid(room.row)
    steps: list[Step] = []
    receivers: list[int] = []
    # Victims that may not be preempted take the free seats first; then the largest first.
    ordered = sorted(
        groups,
        key=lambda g: (
            _may_preempt(preempt, [seats[k].pod for k in g]) and not isinstance(preempt, bool),
            -sum(seats[k].pod.gpu_demand_milli for k in g),
        ),
    )
    for group in ordered:
        gang = gang_of(seats[group[0]].pod)
        group_mark = ws.mark()
        group_ledger = ctx.ledger.snapshot()
        moved: list[Step] = []
        failed: tuple[str, str] | None = None
        for key in sorted(group, key=lambda k: (-seats[k].pod.gpu_demand_milli, k)):
            seat = seats[key]
            placed = schedule(seat.pod, ws.arrays, ctx.policy, exclude=ws.no_target)
            if isinstance(placed, Placement):
                ws.place(seat.pod, placed.row, placed.gpus)
                target, gpus = placed.row, placed.gpus
            else:
                chained = nest(seat.pod) if nest is not None else None
                if chained is None:
                    failed = (key, placed.summary)
                    break
                moved.extend(chained[0])
                target, gpus = chained[1], chained[2]
            moved.append(_step("migrate", seat, ws, ws.node(target), gpus, reason, gang, ctx))
        if failed is None:
            steps.extend(moved)
            receivers.extend(ws.arrays.index[s.target] for s in moved if s.target)
            continue
        ws.rollback(group_mark)
        ctx.ledger.restore(group_ledger)
        if not _may_preempt(preempt, [seats[k].pod for k in group]):
            ws.rollback(mark)
            ctx.ledger.restore(ledger_state)
            return (Blocked(failed[0], c.NO_ROOM, f"nowhere to move it: {failed[1]}"),)
        for key in sorted(group):
            steps.append(_step("preempt", seats[key], ws, None, (), reason, gang, ctx))
    return Relocation(tuple(steps), evictions, tuple(sorted(set(receivers))), pod_gpus)


def _may_preempt(preempt: Preemptable, pods: Iterable[Pod]) -> bool:
    if isinstance(preempt, bool):
        return preempt
    return all(preempt(p) for p in pods)


def _with_gangs(
    ws: Workspace, victims: Iterable[str], allowed: VictimFilter
) -> list[tuple[str, ...]] | Blocked:
    """Victims grouped so that every gang is evicted whole; a Blocked if a member may not go."""
    groups: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for key in victims:
        if key in seen:
            continue
        gang = gang_of(ws.where[key].pod)
        members = ws.gang_members(gang) if gang else ()
        if not members:
            groups.append((key,))
            seen.add(key)
            continue
        running = tuple(m for m in members if m in ws.where)
        for m in running:
            status = moved(ws, m) or allowed(ws.where[m].pod)
            if not status.ok:
                return Blocked(key, c.GANG, f"gang {gang} moves whole; member {m}: {status}")
        groups.append(running)
        seen.update(running)
    return groups


def _step(
    kind: str,
    seat: Occupant,
    ws: Workspace,
    target: str | None,
    gpus: tuple[int, ...],
    reason: str,
    gang: str | None,
    ctx: SearchContext,
) -> Step:
    pod = seat.pod
    price = ctx.cost(pod) if kind == "migrate" else ctx.cost_model.preemption(pod, ctx.now)
    return Step(
        kind=kind,  # type: ignore[arg-type]
        pod=pod.key,
        source=ws.node(seat.row),
        target=target,
        reason=reason,
        gpus=tuple(gpus),
        gpus_held=round(gpus_held(pod), 3),
        cost=price,
        gang=gang,
    )
