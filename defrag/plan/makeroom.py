"""Make room: give a pending pod a node by evicting the cheapest set of lower-priority pods.

Candidate nodes are those that could hold the pod once emptied (model, taints, capacity),
ranked by how little must be freed on them; on the best few the victim search of
:mod:`defrag.plan.room` prices the cheapest victim set, and the cheapest set whose victims all
find a new node (or may be preempted) wins. Victims always rank strictly below the pod.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.model.workload import Shape
from defrag.plan import constraints as c
from defrag.plan.model import Blocked, Step
from defrag.plan.room import Context, Nest, Relocation, Room, VictimFilter, find_room, relocate
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

    @property
    def ok(self) -> bool:
        return self.row is not None


def make_room(
    ws: Workspace,
    ctx: Context,
    pod: Pod,
    *,
    preempt: bool,
    candidates: int = 32,
    tries: int = 8,
    any_priority: bool = False,
    depth: int = 1,
    place: bool = False,
    allowed: VictimFilter | None = None,
) -> RoomResult:
    """Room for ``pod`` on the cheapest node; the workspace keeps the pod reserved there.

    ``any_priority`` lifts the strictly-lower-priority rule (the simulator's fill protocol,
    where pods only migrate and nothing is lost). A victim that fits nowhere else may get room
    made for it in turn, ``depth`` levels deep (a chain of migrations). ``place`` puts the pod
    on its node as a running pod (a victim being chained) instead of reserving the room.
    """
    placed = schedule(pod, ws.arrays, ctx.policy, exclude=ws.no_target)
    if isinstance(placed, Placement):
        (ws.place if place else ws.reserve)(pod, placed.row, placed.gpus)
        return RoomResult(pod.key, (), (), placed.row, placed.gpus)
    if allowed is None:
        allowed = ctx.victim_filter(None if any_priority else pod.priority)
    rows = candidate_rows(ws, pod, candidates)
    blocked: dict[str, Blocked] = {}
    reason = f"make room for {pod.key} ({describe(pod)})"
    # First victims that fit elsewhere as they are; then, if that fails, any victim, with
    # chains of migrations (depth) or preemption making room for the ones that fit nowhere.
    passes: list[tuple[Callable[[Pod], bool] | None, Nest | None]] = []
    if not preempt:
        passes.append((placeable_elsewhere(ws), None))
    if preempt or depth > 0:
        nest = _nest(ws, ctx, allowed, depth - 1, candidates, tries) if depth > 0 else None
        passes.append((None, nest))
    for movable, nest in passes:
        rooms: list[Room] = []
        for row in rows:
            found = find_room(ws, int(row), pod, allowed, ctx.cost, movable)
            if isinstance(found, Room):
                rooms.append(found)
            elif len(blocked) < 20:
                for b in found:
                    blocked.setdefault(b.pod, b)
        rooms.sort(key=lambda r: (r.cost, len(r.victims), r.row))
        for room in rooms[:tries]:
            done = relocate(
                ws, ctx, room, pod,
                reason=f"{reason} on {ws.node(room.row)}",
                allowed=allowed, preempt=preempt, place=place, nest=nest,
            )  # fmt: skip
            if isinstance(done, Relocation):
                for b in room.blocked:
                    blocked.setdefault(b.pod, b)
                return RoomResult(pod.key, done.steps, tuple(blocked.values()), room.row, done.gpus)
            for b in done:
                blocked.setdefault(b.pod, b)
    if not blocked:
        blocked[pod.key] = Blocked(pod.key, c.NO_ROOM, placed.summary)
    return RoomResult(pod.key, (), tuple(blocked.values()), None)


def _nest(
    ws: Workspace, ctx: Context, allowed: VictimFilter, depth: int, candidates: int, tries: int
) -> Nest:
    def chain(victim: Pod) -> tuple[tuple[Step, ...], int, tuple[int, ...]] | None:
        result = make_room(
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
        movable = np.zeros(len(a), dtype=np.int64)
        for o in ws.where.values():
            if o.pod.num_gpu == 0:
                movable[o.row] += o.pod.cpu_milli
        rank = rank + 10.0 * (short > movable[rows])
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
