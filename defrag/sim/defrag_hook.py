"""The planner in the simulator's loop (``defrag simulate --defrag``).

* Fill protocol: a pod that fits nowhere triggers make-room with migrations only — victims of
  any priority move to where the scheduler would put them, nothing is lost, nothing waits.
* Timeline protocol: the same for a multi-GPU pod that fits nowhere on arrival (the pods that
  starve; a small pod waits for the next departure); at each idle window, make-room for the
  pods still waiting (most urgent first: priority, then size), then a repack within a budget.

Every call plans on a private :class:`~defrag.plan.workspace.Workspace` copied from the
simulator's state and answers with :class:`~defrag.sim.hooks.Move` s in the order the plan
made them, so the simulator can apply them one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from defrag.model.resources import Pod
from defrag.plan.constraints import Constraints, Ledger
from defrag.plan.cost import CostModel
from defrag.plan.makeroom import make_room
from defrag.plan.model import Step
from defrag.plan.repack import repack
from defrag.plan.room import Context
from defrag.plan.workspace import Workspace
from defrag.sim.hooks import DefragHook, Move
from defrag.sim.state import SimState

PROTOCOLS = ("fill", "timeline")


@dataclass(frozen=True, slots=True)
class HookOptions:
    candidates: int = 32
    """Nodes priced per unschedulable pod."""
    tries: int = 8
    """Victim sets tried per unschedulable pod, cheapest first."""
    window_evictions: int = 64
    """Migrations per idle window (timeline)."""
    window_pending: int = 32
    """Waiting pods given room per idle window (timeline), most urgent first."""
    min_gain_per_cost: float = 0.5
    """Repack keeps a drain only if it frees this many fragmented GPUs per migration."""
    repack: bool = True
    depth: int = 0
    """Chains of migrations for victims that fit nowhere (1: ~5x the time, +0.01 pt on openb)."""


class PlannerHook:
    """The :class:`~defrag.sim.hooks.DefragHook` backed by the planner."""

    def __init__(self, protocol: str, options: HookOptions) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
        self.protocol = protocol
        self.options = options

    def on_unschedulable(self, state: SimState, pod: Pod, now: float) -> Sequence[Move]:
        if self.protocol == "timeline" and pod.num_gpu < 2:
            return ()  # in the timeline small pods wait for departures; windows handle the rest
        if pod.gpu_demand_milli > int(state.arrays.free_share().sum()):
            return ()  # not enough free GPU in the whole cluster: no move can help
        ws, ctx = self._workspace(state, max_evictions=None)
        result = make_room(
            ws, ctx, pod, preempt=False, any_priority=True, depth=self.options.depth,
            candidates=self.options.candidates, tries=self.options.tries,
        )  # fmt: skip
        return _moves(ws, result.steps) if result.ok else ()

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        if self.protocol != "timeline":
            return ()
        opts = self.options
        ws, ctx = self._workspace(state, max_evictions=opts.window_evictions)
        steps: list[Step] = []
        waiting = sorted(state.pending.values(), key=lambda p: (-p.priority, -p.gpu_demand_milli))[
            : opts.window_pending
        ]
        for pod in waiting:
            mark = ws.mark()
            result = make_room(
                ws, ctx, pod, preempt=False, any_priority=True, depth=opts.depth,
                candidates=opts.candidates, tries=opts.tries,
            )  # fmt: skip
            if result.ok:
                steps.extend(result.steps)
            else:
                ws.rollback(mark)
        if opts.repack:
            packed = repack(ws, ctx, state.mix, min_gain_per_cost=opts.min_gain_per_cost)
            steps.extend(packed.steps)
        return _moves(ws, steps)

    def _workspace(
        self, state: SimState, *, max_evictions: int | None
    ) -> tuple[Workspace, Context]:
        ws = Workspace(state.arrays.copy(), state.rows, where=state.placed)
        constraints = Constraints(max_evictions=max_evictions)
        ctx = Context(
            state.policy, Ledger((), constraints), constraints, CostModel(), None, enforce=False
        )
        return ws, ctx


def make_defrag_hook(policy: str, protocol: str, **opts: Any) -> DefragHook:
    """The simulator's factory. ``policy`` is the run's policy name (the hook scores with the
    run's own policy object, from the state); ``opts`` are :class:`HookOptions` fields."""
    del policy  # the state carries the policy object the run uses
    known = set(HookOptions.__dataclass_fields__)
    unknown = sorted(set(opts) - known)
    if unknown:
        raise ValueError(f"unknown defrag hook option(s): {', '.join(unknown)}")
    return PlannerHook(protocol, HookOptions(**opts))


def _moves(ws: Workspace, steps: Sequence[Step]) -> tuple[Move, ...]:
    index = ws.arrays.index
    return tuple(
        Move(s.pod, index[s.source], index[s.target], s.gpus)
        for s in steps
        if s.kind == "migrate" and s.target is not None
    )


__all__ = ["HookOptions", "PlannerHook", "make_defrag_hook"]
