"""The planner's make-room in the fill protocol (``defrag simulate --defrag``, FGD's comparison).

The fill protocol has no daemon, no clock and no windows: pods arrive until the cluster is
full, and a pod that fits nowhere asks for room at once. This hook answers with the planner's
own make-room (:func:`~defrag.plan.makeroom.make_room`, mode
:attr:`~defrag.plan.config.MakeRoomMode.FILL`): victims of any priority moved where the
scheduler would put them, nothing preempted, nothing lost — so no worth check, no swaps, no
moves-per-room limit and no job spared. It measures what perfect, free migration adds to a
packing score; the daemon's decision in the timeline protocol is
:mod:`defrag.sim.daemon_driver`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from defrag.model.resources import Pod
from defrag.plan.config import (
    UNLIMITED,
    Constraints,
    EvictionBudget,
    MakeRoomMode,
    PlannerConfig,
    PlanOptions,
)
from defrag.plan.constraints import Ledger
from defrag.plan.makeroom import make_room
from defrag.plan.room import SearchContext
from defrag.plan.workspace import Workspace
from defrag.sim.moves import Move, plan_moves
from defrag.sim.state import SimState

FILL_PLANNER = PlannerConfig(
    Constraints(budget=EvictionBudget(total=None, per_node=None, per_namespace=None)),
    PlanOptions(depth=0, room_worth=0.0, swaps=False, max_moves_per_room=None, spare_jobs=False),
)
"""The fill protocol's planner: no budget (nothing is lost), no chains of migrations for
victims that fit nowhere (``depth=0``: 1 takes ~5x the time for +0.01 pt on openb)."""


class FillHook:
    """The :class:`~defrag.sim.hooks.DefragHook` of the fill protocol."""

    def __init__(self, planner: PlannerConfig = FILL_PLANNER) -> None:
        self.planner = planner

    def on_unschedulable(self, state: SimState, pod: Pod, now: float) -> Sequence[Move]:
        if pod.gpu_demand_milli > int(state.arrays.free_share().sum()):
            return ()  # not enough free GPU in the whole cluster: no move can help
        ws = Workspace(state.arrays.copy(), state.rows, where=state.placed)
        constraints = replace(self.planner.constraints, budget=UNLIMITED)
        # trace pods have no owners, PDBs or ages: only the eviction filters apply
        ctx = SearchContext(
            state.policy,
            Ledger((), constraints),
            constraints,
            self.planner.options.cost,
            None,
            enforce=False,
        )
        result = make_room(ws, ctx, pod, self.planner.options, MakeRoomMode.FILL)
        return plan_moves(ws.arrays.index, result.steps) if result.ok else ()

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        return ()


__all__ = ["FILL_PLANNER", "FillHook"]
