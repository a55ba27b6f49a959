"""Repack's drain candidates, ranked lazily: a vectorised bound first, the room search on demand.

A candidate is (node, k): free k whole GPUs on a partly used node. Its rank is its optimistic
gain per cost — the drop in the node's own FGD fragmentation once the cheapest victims that
free k GPUs (:func:`~defrag.plan.room.find_room`) are gone, over their eviction cost. The room
search is Python over the node's pods, so instead of running it for every candidate up front,
each candidate first gets an upper bound on that ratio from arrays alone:

- gain ≤ the node's fragmentation now (fragmentation is never negative);
- cost ≥ the cheapest fractional cover: the k GPUs need ``need`` more entirely free GPUs than
  the best NVLink domain has, every GPU that becomes free loses all its pods, and a pod frees
  at most the GPU slots it holds — so the victims cost at least the cheapest pods per GPU slot
  taken until ``need`` slots are covered (and at least the cheapest pod: a room has victims).

:class:`Drains` hands out candidates in exactly the order of a heap holding every candidate's
exact key: before the heap's top is read it runs the room search for every candidate whose
bound could reach that top (ties included). Rooms are searched on a copy of the workspace taken
when the candidates are made, so a candidate's key does not depend on when it was searched.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from defrag.model.arrays import FloatArray, IntArray
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.plan.room import Room, SearchContext, VictimFilter, find_room
from defrag.plan.workspace import Workspace
from defrag.scoring.fgd_model import FragModel

Key = tuple[float, int, int, bool]
"""(-ratio, row, k, evaluated): the heap order (best ratio first, then row, then k)."""

BATCH = 64
"""Candidates searched together (their gains are computed in one vectorised call)."""

_SLACK = 1e-6
"""Absolute slack on the bound (costs are rounded to 6 decimals; float sums differ by ulps)."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """Every candidate with its upper bound on gain per cost, best bound first."""

    rows: IntArray
    ks: IntArray
    bound: FloatArray


def virtual_job(k: int) -> Pod:
    return Pod(name=f"repack-{k}-gpu", namespace="defrag", num_gpu=k, gpu_milli=GPU_MILLI)


def candidate_rows(ws: Workspace) -> IntArray:
    """Partly used, schedulable GPU nodes the plan has not reserved."""
    a = ws.arrays
    share = a.free_share()
    capacity = a.gpu_total * GPU_MILLI
    ok = (a.gpu_total > 0) & (share > 0) & (share < capacity) & a.schedulable & ~ws.no_target
    return np.flatnonzero(ok)


def mix_sizes(mix: WorkloadMix) -> list[int]:
    """Whole-GPU job sizes of the mix (a GPU-sharing shape needs one whole GPU's worth)."""
    return sorted({s.num_gpu if s.gpu_milli >= GPU_MILLI else 1 for s in mix.shapes if s.num_gpu})


def candidates(ws: Workspace, mix: WorkloadMix) -> tuple[IntArray, IntArray]:
    """(rows, ks): on each candidate row its full size and the mix's sizes that do not fit
    yet (larger than the largest job the row takes now, at most its size), ordered."""
    a = ws.arrays
    rows = candidate_rows(ws)
    total = a.gpu_total[rows]
    largest = a.largest_job()[rows]
    out_rows: list[IntArray] = [rows]
    out_ks: list[IntArray] = [total]
    for size in mix_sizes(mix):
        take = (largest < size) & (size <= total) & (size != total)
        out_rows.append(rows[take])
        out_ks.append(np.full(int(take.sum()), size, dtype=np.int64))
    all_rows, all_ks = np.concatenate(out_rows), np.concatenate(out_ks)
    order = np.lexsort((all_ks, all_rows))
    return all_rows[order].astype(np.int64), all_ks[order].astype(np.int64)


def bounds(
    ws: Workspace,
    rows: IntArray,
    ks: IntArray,
    frag_now: FloatArray,
    floors: Callable[[Sequence[Pod]], FloatArray],
) -> Bounds:
    """The upper bound on gain per cost of each candidate (module docstring)."""
    a = ws.arrays
    n = len(a)
    unique = np.unique(rows).tolist()
    pods: list[Pod] = []
    owner: list[int] = []
    slots: list[int] = []
    for row in unique:
        for o in ws.rows[row].values():
            pods.append(o.pod)
            owner.append(row)
            slots.append(len(o.gpus) if o.pod.num_gpu else 0)
    prices = floors(pods)
    owner_a = np.array(owner, dtype=np.int64)
    cheapest = np.full(n, np.inf)
    np.minimum.at(cheapest, owner_a, prices)
    slots_a = np.array(slots, dtype=np.int64)
    gpu = slots_a > 0
    prow_a, pcost_a, pslots_a = owner_a[gpu], prices[gpu], slots_a[gpu]
    per_slot = pcost_a / pslots_a
    order = np.lexsort((per_slot, prow_a))
    prow_a, pcost_a, pslots_a, per_slot = (
        prow_a[order], pcost_a[order], pslots_a[order], per_slot[order]
    )  # fmt: skip
    slots_upto = np.concatenate(([0], np.cumsum(pslots_a)))  # slots of the pods before i
    cost_upto = np.concatenate(([0.0], np.cumsum(pcost_a)))
    start = np.searchsorted(prow_a, rows, side="left")
    end = np.searchsorted(prow_a, rows, side="right")

    dom_free = a.domain_free()[rows]  # [C, D]
    sizes = a.domain_size[rows]
    in_domain = (sizes >= ks[:, None]) & (sizes > 0)
    best_domain = np.where(in_domain, dom_free, -1).max(axis=1, initial=-1)
    spanning = best_domain < 0  # no domain holds k: the job spans whole domains
    have = np.where(spanning, a.free_whole_count()[rows], best_domain)
    need = ks - have

    # The first pod (in cheapest-per-slot order) at which the cover reaches `need` slots.
    target = slots_upto[start] + np.maximum(need, 0)
    at = np.searchsorted(slots_upto[1:], target, side="left")
    reachable = (need <= 0) | (at < end)
    at = np.minimum(at, max(len(pcost_a) - 1, 0))
    if len(pcost_a):
        part = (target - slots_upto[at]) * per_slot[at]
        cover = cost_upto[at] - cost_upto[start] + part
    else:
        cover = np.zeros(len(rows))
    floor = np.maximum(np.where(need > 0, cover, 0.0), cheapest[rows])
    gain = frag_now[rows] + _SLACK  # the floors are already below each cost by the rounding
    ratio = gain / np.maximum(floor - _SLACK, 1e-9) * (1 + 1e-9)
    ratio = np.where(reachable & np.isfinite(floor), ratio, -np.inf)
    best = np.argsort(-ratio, kind="stable")
    return Bounds(rows[best], ks[best], ratio[best])


class Drains:
    """The candidates of one repack, popped best key first (the exhaustive heap's order).

    ``exhaustive`` searches every candidate's room up front (the reference the bound is
    checked against)."""

    def __init__(
        self,
        ws: Workspace,
        ctx: SearchContext,
        mix: WorkloadMix,
        fm: FragModel,
        frag_now: FloatArray,
        allowed: VictimFilter,
        *,
        bar: float,
        exhaustive: bool = False,
    ) -> None:
        self.base = Workspace(ws.arrays.copy(), ws.rows, where={}, moved=ws.moved_keys())
        self.ctx, self.fm, self.allowed, self.bar = ctx, fm, allowed, bar
        rows, ks = candidates(ws, mix)
        if exhaustive:
            self.pending = Bounds(rows, ks, np.full(len(rows), np.inf))
        else:
            floors = partial(ctx.cost_model.floors, now=ctx.now)
            self.pending = bounds(self.base, rows, ks, frag_now, floors)
        self.next = 0
        self.heap: list[Key] = []
        self.rooms: dict[tuple[int, int], Room] = {}
        self.searched = 0

    # --- the heap ------------------------------------------------------------------------------

    def pop(self) -> Key | None:
        self._settle()
        return heapq.heappop(self.heap) if self.heap else None

    def best_ratio(self) -> float | None:
        """The best key's ratio among the candidates left (None when none is left)."""
        self._settle()
        return -self.heap[0][0] if self.heap else None

    def push_evaluated(self, ratio: float, row: int, k: int) -> None:
        heapq.heappush(self.heap, (-ratio, row, k, True))

    def room(self, row: int, k: int) -> Room:
        return self.rooms[(row, k)]

    # --- lazy search ---------------------------------------------------------------------------

    def _settle(self) -> None:
        """Search every candidate whose bound reaches the heap's best ratio (or the bar)."""
        p = self.pending
        while self.next < len(p.rows):
            floor = max(-self.heap[0][0], self.bar) if self.heap else self.bar
            if not p.bound[self.next] >= floor:
                return
            stop = self.next
            while stop < len(p.rows) and stop - self.next < BATCH and p.bound[stop] >= floor:
                stop += 1
            self._search(p.rows[self.next : stop], p.ks[self.next : stop])
            self.next = stop

    def _search(self, rows: IntArray, ks: IntArray) -> None:
        base = self.base
        found: list[tuple[int, int, Room]] = []
        for row, k in zip(rows.tolist(), ks.tolist(), strict=True):
            room = find_room(base, row, virtual_job(k), self.allowed, self.ctx.cost)
            if isinstance(room, Room) and room.victims:
                found.append((row, k, room))
        self.searched += len(rows)
        if not found:
            return
        gains = self._gains([(row, room) for row, _, room in found])
        for (row, k, room), gain in zip(found, gains.tolist(), strict=True):
            # Receivers may lose (or gain) a little too: keep candidates within 2× of the bar.
            ratio = gain / max(room.cost, 1e-9)
            if gain <= 0 or ratio < self.bar:
                continue
            self.rooms[(row, k)] = room
            heapq.heappush(self.heap, (-ratio, row, k, False))

    def _gains(self, found: list[tuple[int, Room]]) -> FloatArray:
        """Fragmentation drop on each row alone once its room's victims are gone."""
        a = self.base.arrays
        rows = np.array([row for row, _ in found], dtype=np.int64)
        free = np.concatenate([a.gpu_free[rows], a.gpu_free[rows]])
        cpu = np.concatenate([a.cpu_free[rows], a.cpu_free[rows]])
        b = len(found)
        for i, (row, room) in enumerate(found):
            for key in room.victims:
                seat = self.base.rows[row][key]
                pod = seat.pod
                cpu[b + i] += pod.cpu_milli
                if pod.num_gpu and a.pool_use(pod, row) is None:
                    free[b + i, list(seat.gpus)] += pod.gpu_milli
        model = np.concatenate([a.model_code[rows], a.model_code[rows]])
        frag = self.fm.node_frag(free, cpu, model) / GPU_MILLI
        return np.asarray(frag[:b] - frag[b:], dtype=np.float64)
