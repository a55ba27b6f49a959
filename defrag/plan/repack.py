"""Repack: drain partly used nodes (or NVLink domains) so that job sizes of the mix fit.

The gain of a drain is the drop in FGD fragmentation against the workload mix (docs/concepts.md):
the free GPU capacity that a pod drawn from the mix could not use, summed over the drained
node and every node that receives its pods. Candidates are (node, k): free k whole GPUs on a
partly used node (k = its size frees the whole node), priced by the victim search of
:mod:`defrag.plan.room`. A lazy greedy keeps the drain with the most gain per unit of cost:
candidates are ranked by an optimistic gain (the drained node alone), the best one is tried
for real (its pods re-placed by the scheduler), and kept if its true ratio still beats the
next optimistic one. It stops when the budget or the gain runs out.

The optimistic ranking is lazy (:mod:`defrag.plan.drains`): a vectorised bound orders the
candidates, and a room is searched only when its bound could beat the best candidate found so
far, so the drains tried are those of the exhaustive search, in the same order. A plan whose
budget is spent before repack starts searches nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from defrag.model.arrays import FloatArray, IntArray
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.plan import constraints as c
from defrag.plan.drains import Drains
from defrag.plan.model import Blocked, Step
from defrag.plan.room import Relocation, SearchContext, relocate
from defrag.plan.workspace import Workspace
from defrag.scoring.fgd_model import FragModel


@dataclass(frozen=True, slots=True)
class RepackResult:
    steps: tuple[Step, ...]
    blocked: tuple[Blocked, ...]
    drained: tuple[str, ...]
    gain: float
    """Drop in FGD-fragmented GPUs over the whole plan."""
    searched: int = 0
    """Candidates whose room was searched (the rest were ruled out by their bound)."""


def repack(
    ws: Workspace,
    ctx: SearchContext,
    mix: WorkloadMix,
    *,
    min_gain_per_cost: float = 0.25,
    max_drains: int | None = None,
    max_tries: int = 200,
    exhaustive: bool = False,
) -> RepackResult:
    """Drains kept by gain per cost; ``max_tries`` bounds the drains simulated in full.

    Candidates come from :class:`~defrag.plan.drains.Drains` in the order of their optimistic
    ratio, their rooms searched only when their bound could reach the best one left
    (``exhaustive``: every room searched first; the plan is the same)."""
    empty = RepackResult((), (), (), 0.0)
    left = ctx.ledger.remaining()
    if max_tries <= 0 or max_drains == 0 or (left is not None and left <= 0):
        return empty  # the loop below would stop before its first try
    a = ws.arrays
    fm = FragModel.build(mix, a.models)

    def frag(rows: IntArray) -> FloatArray:
        return fm.node_frag(a.gpu_free[rows], a.cpu_free[rows], a.model_code[rows]) / GPU_MILLI

    frag_now = frag(np.arange(len(a)))
    allowed = ctx.victim_filter(None)
    drains = Drains(
        ws, ctx, mix, fm, frag_now, allowed, bar=min_gain_per_cost / 2, exhaustive=exhaustive
    )

    steps: list[Step] = []
    blocked: dict[str, Blocked] = {}
    drained: list[str] = []
    received = np.zeros(len(a), dtype=bool)
    total_gain = 0.0
    tries = 0
    while tries < max_tries:
        if max_drains is not None and len(drained) >= max_drains:
            break
        left = ctx.ledger.remaining()
        if left is not None and left <= 0:
            break
        top = drains.pop()
        if top is None:
            break
        _, row, k, evaluated = top
        if ws.no_target[row] or received[row]:
            continue
        room = drains.room(row, k)
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
        best = None if evaluated else drains.best_ratio()
        if best is not None and ratio < best:
            ws.rollback(mark)
            ctx.ledger.restore(ledger_state)
            drains.push_evaluated(ratio, row, k)
            continue
        frag_now[touched] = after
        received[list(done.receivers)] = True
        steps.extend(done.steps)
        drained.append(ws.node(row))
        total_gain += gain
    return RepackResult(
        tuple(steps), tuple(blocked.values()), tuple(drained), total_gain, drains.searched
    )
