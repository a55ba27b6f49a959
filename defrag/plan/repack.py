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

from dataclasses import dataclass, replace

import numpy as np

from defrag.model.arrays import FloatArray, IntArray
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.plan import constraints as c
from defrag.plan.drains import Drains
from defrag.plan.drainworth import Beneficiaries, describe_seated
from defrag.plan.makeroom import known_cost, victims_wait
from defrag.plan.model import Blocked, RoomWorth, Step
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
    worth: tuple[RoomWorth, ...] = ()
    """Each drain weighed by the starved pods it seats (``want``): its worth and cost."""
    not_worth: int = 0
    """Drains refused as worth less than the margin × their cost."""


def repack(
    ws: Workspace,
    ctx: SearchContext,
    mix: WorkloadMix,
    *,
    min_gain_per_cost: float = 0.25,
    max_drains: int | None = None,
    max_tries: int = 200,
    exhaustive: bool = False,
    want: Beneficiaries | None = None,
    margin: float = 1.0,
    candidates: int = 32,
) -> RepackResult:
    """Drains kept by gain per cost; ``max_tries`` bounds the drains simulated in full.

    Candidates come from :class:`~defrag.plan.drains.Drains` in the order of their optimistic
    ratio, their rooms searched only when their bound could reach the best one left
    (``exhaustive``: every room searched first; the plan is the same).

    ``want``: the starved pods make-room left without room. Each drain is then also weighed
    (:mod:`defrag.plan.drainworth`): kept only when the pods it seats are worth ``margin`` ×
    its cost, and the repack stops once none is left to seat; ``candidates`` bounds the nodes
    a victim's wait is forecast on."""
    empty = RepackResult((), (), (), 0.0)
    left = ctx.ledger.remaining()
    if max_tries <= 0 or max_drains == 0 or (left is not None and left <= 0):
        return empty  # the loop below would stop before its first try
    if want is not None and not want:
        return empty  # no one left waiting: a drain would be worth nothing
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
    worth: list[RoomWorth] = []
    refused = 0
    tries = 0
    while tries < max_tries:
        if want is not None and not want:
            break
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
        kept = done.steps
        if want is not None:
            weighed = _weigh(ws, ctx, want, done, row, margin, candidates)
            if weighed is None:
                ws.rollback(mark)
                ctx.ledger.restore(ledger_state)
                refused += 1
                continue
            kept, room_worth = weighed
            worth.append(room_worth)
        frag_now[touched] = after
        received[list(done.receivers)] = True
        steps.extend(kept)
        drained.append(ws.node(row))
        total_gain += gain
    return RepackResult(
        tuple(steps), tuple(blocked.values()), tuple(drained), total_gain, drains.searched,
        tuple(worth), refused,
    )  # fmt: skip


def _weigh(
    ws: Workspace,
    ctx: SearchContext,
    want: Beneficiaries,
    done: Relocation,
    row: int,
    margin: float,
    candidates: int,
) -> tuple[tuple[Step, ...], RoomWorth] | None:
    """The drain's steps (marked as freeing the node for the first pod it seats) and its
    worth, the pods it seats reserved; None when it is worth less than ``margin`` × its cost
    (the caller rolls back)."""
    seated = want.seat(ws, ctx.policy, row)
    if not seated:
        return None
    waits = victims_wait(ws, ctx, done, candidates)
    cost = round(known_cost(ctx, done, ws) + waits, 6)
    value = sum(w.value for w in seated)
    if value < margin * cost:
        return None
    want.take(seated)
    node, first = ws.node(row), seated[0].pods[0].key
    wait = max(w.wait_h for w in seated)
    worth = RoomWorth(first, node, value, cost, wait, "drain", waits)
    note = (
        f"; the drain seats {describe_seated(seated)}, worth {value:.1f} GPU-hours "
        f"({wait:.1f} h of waiting saved) against {cost:.1f} of lost work and restarts"
    )
    steps = tuple(
        replace(s, reason=s.reason + note, for_pod=first if s.source == node else s.for_pod)
        for s in done.steps
    )
    return steps, worth
