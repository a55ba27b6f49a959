"""Repack: drain partly used nodes (or NVLink domains) so that job sizes of the mix fit.

The gain of a drain is the drop in FGD fragmentation against the workload mix (docs/concepts.md):
the free GPU capacity that a pod drawn from the mix could not use, summed over the drained
node and every node that receives its pods. Candidates are (node, k): free k whole GPUs on a
partly used node (k = its size frees the whole node), priced by the victim search of
:mod:`defrag.plan.room`. A lazy greedy keeps the drain with the most gain per unit of cost:
candidates are ranked by an optimistic gain (the drained node alone), the best one is tried
for real (its pods re-placed by the scheduler), and kept if its true ratio still beats the
next optimistic one. It stops when the budget or the gain runs out.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from defrag.model.arrays import FloatArray, IntArray
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.plan import constraints as c
from defrag.plan.model import Blocked, Step
from defrag.plan.room import Relocation, Room, SearchContext, find_room, relocate
from defrag.plan.workspace import Workspace
from defrag.scoring.fgd_model import FragModel


@dataclass(frozen=True, slots=True)
class RepackResult:
    steps: tuple[Step, ...]
    blocked: tuple[Blocked, ...]
    drained: tuple[str, ...]
    gain: float
    """Drop in FGD-fragmented GPUs over the whole plan."""


def repack(
    ws: Workspace,
    ctx: SearchContext,
    mix: WorkloadMix,
    *,
    min_gain_per_cost: float = 0.25,
    max_drains: int | None = None,
    max_tries: int = 200,
) -> RepackResult:
    """Drains kept by gain per cost; ``max_tries`` bounds the drains simulated in full."""
    a = ws.arrays
    fm = FragModel.build(mix, a.models)

    def frag(rows: IntArray) -> FloatArray:
        return fm.node_frag(a.gpu_free[rows], a.cpu_free[rows], a.model_code[rows]) / GPU_MILLI

    frag_now = frag(np.arange(len(a)))
    allowed = ctx.victim_filter(None)
    heap: list[tuple[float, int, int, bool]] = []
    rooms: dict[tuple[int, int], Room] = {}
    for row in candidate_rows(ws):
        for k in sizes_for(ws, int(row), mix):
            found = find_room(ws, int(row), virtual_job(k), allowed, ctx.cost)
            if not isinstance(found, Room) or not found.victims:
                continue
            gain = _gain_if_removed(ws, frag, int(row), found)
            # Receivers may lose (or gain) a little too: keep candidates within 2× of the bar.
            if gain <= 0 or gain / max(found.cost, 1e-9) < min_gain_per_cost / 2:
                continue
            rooms[(int(row), k)] = found
            heapq.heappush(heap, (-gain / max(found.cost, 1e-9), int(row), k, False))

    steps: list[Step] = []
    blocked: dict[str, Blocked] = {}
    drained: list[str] = []
    received = np.zeros(len(a), dtype=bool)
    total_gain = 0.0
    tries = 0
    while heap and tries < max_tries:
        if max_drains is not None and len(drained) >= max_drains:
            break
        left = ctx.ledger.remaining()
        if left is not None and left <= 0:
            break
        _, row, k, evaluated = heapq.heappop(heap)
        if ws.no_target[row] or received[row]:
            continue
        room = rooms[(row, k)]
        tries += 1
        mark, ledger_state = ws.mark(), ctx.ledger.snapshot()
        done = relocate(
            ws,
            ctx,
            room,
            None,
            reason=f"repack: free {k} GPU(s) on {ws.node(row)} for the workload mix",
            allowed=allowed,
            preempt=False,
        )
        if not isinstance(done, Relocation):
            for b in done:
                if b.constraint != c.PLAN_BUDGET or not blocked:
                    blocked.setdefault(b.pod, b)
            continue
        touched = np.array(sorted({row, *done.receivers}), dtype=np.int64)
        after = frag(touched)
        gain = float(frag_now[touched].sum() - after.sum())
        price = sum(s.cost for s in done.steps)
        ratio = gain / max(price, 1e-9)
        if ratio < min_gain_per_cost:
            ws.rollback(mark)
            ctx.ledger.restore(ledger_state)
            continue
        if not evaluated and heap and ratio < -heap[0][0]:
            ws.rollback(mark)
            ctx.ledger.restore(ledger_state)
            heapq.heappush(heap, (-ratio, row, k, True))
            continue
        frag_now[touched] = after
        received[list(done.receivers)] = True
        steps.extend(done.steps)
        drained.append(ws.node(row))
        total_gain += gain
    return RepackResult(tuple(steps), tuple(blocked.values()), tuple(drained), total_gain)


def candidate_rows(ws: Workspace) -> IntArray:
    """Partly used, schedulable GPU nodes the plan has not reserved."""
    a = ws.arrays
    share = a.free_share()
    capacity = a.gpu_total * GPU_MILLI
    ok = (a.gpu_total > 0) & (share > 0) & (share < capacity) & a.schedulable & ~ws.no_target
    return np.flatnonzero(ok)


def sizes_for(ws: Workspace, row: int, mix: WorkloadMix) -> list[int]:
    """Whole-GPU job sizes worth freeing on ``row``: its full size and the mix's sizes."""
    a = ws.arrays
    total = int(a.gpu_total[row])
    largest = _largest(ws, row)
    wanted = {total}
    for shape in mix.shapes:
        if shape.num_gpu:
            k = shape.num_gpu if shape.gpu_milli >= GPU_MILLI else 1
            if largest < k <= total:
                wanted.add(k)
    return sorted(wanted)


def virtual_job(k: int) -> Pod:
    return Pod(name=f"repack-{k}-gpu", namespace="defrag", num_gpu=k, gpu_milli=GPU_MILLI)


def _largest(ws: Workspace, row: int) -> int:
    a = ws.arrays
    total = int(a.gpu_total[row])
    whole = a.gpu_free[row, :total] >= GPU_MILLI
    dom = a.gpu_domain[row, :total]
    sizes = a.domain_size[row]
    per = [int((whole & (dom == d)).sum()) for d in range(len(sizes)) if sizes[d]]
    spanning = sum(int(sizes[d]) for d in range(len(sizes)) if sizes[d] and per[d] == sizes[d])
    return max(max(per, default=0), spanning)


def _gain_if_removed(
    ws: Workspace, frag: Callable[[IntArray], FloatArray], row: int, room: Room
) -> float:
    """Fragmentation drop on ``row`` alone once the room's victims are gone (optimistic)."""
    rows = np.array([row], dtype=np.int64)
    before = float(frag(rows)[0])
    mark = ws.mark()
    for key in room.victims:
        ws.remove(key)
    after = float(frag(rows)[0])
    ws.rollback(mark)
    return before - after
