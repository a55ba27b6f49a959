"""The simulator's extension point for defragmentation: a hook that decides migrations.

The simulator calls the hook when a pod fits nowhere (``on_unschedulable``) and, in the
timeline protocol, at each idle window (``on_window``). The hook returns moves; the simulator
applies them in order (release on the source row, allocate on the target row), counts each as
a migration, and then retries the pod. A move that does not fit is a bug in the hook: the
simulator rolls back the whole batch and raises :class:`~defrag.sim.state.InvalidMove`.

The planner's implementation lives in :mod:`defrag.sim.defrag_hook` (``make_defrag_hook``);
it is imported lazily so the simulator works without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from defrag.model.resources import Pod

if TYPE_CHECKING:
    from defrag.sim.state import SimState


@dataclass(frozen=True, slots=True)
class Move:
    """A migration decided by a hook: pod ``pod_id`` leaves ``source_row`` for ``gpus`` of
    ``target_row`` (``gpus`` is empty for a pod that asks no GPU).

    ``target_row`` = :data:`REQUEUE` evicts the pod without a new node: it goes back to the
    waiting queue (a preemption, or a descheduler eviction the scheduler places later).
    ``for_pod`` names the pending pod the eviction frees ``source_row`` for: the timeline
    holds that node for it (``defrag.io/reserved-for``) until it starts or the hold times out.
    """

    pod_id: str
    source_row: int
    target_row: int
    gpus: tuple[int, ...]
    for_pod: str | None = None


REQUEUE = -1
"""``Move.target_row`` of an eviction without a new node."""


class DefragHook(Protocol):
    def on_unschedulable(self, state: SimState, pod: Pod, now: float) -> Sequence[Move]:
        """``pod`` fits nowhere; the moves that make room for it (none = give up)."""
        ...

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        """An idle window opened (timeline protocol); the repacking moves to make."""
        ...


class TickHook(Protocol):
    """A hook that also runs on a period (timeline protocol): a daemon cycle, a scheduling
    session, a descheduler interval. Optional: the timeline calls it when a hook has it."""

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]: ...


class NoDefrag:
    """The hook that never moves anything (the simulator's default)."""

    def on_unschedulable(self, state: SimState, pod: Pod, now: float) -> Sequence[Move]:
        return ()

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        return ()


class HookUnavailable(RuntimeError):
    """The planner's hook module is not installed or has no ``make_defrag_hook``."""


def load_defrag_hook(policy: str, protocol: str, **opts: Any) -> DefragHook:
    """The planner's hook, ``defrag.sim.defrag_hook.make_defrag_hook(policy, protocol, **opts)``."""
    try:
        module = importlib.import_module("defrag.sim.defrag_hook")
    except ImportError as exc:
        raise HookUnavailable(f"the planner's simulator hook is not available: {exc}") from exc
    factory = getattr(module, "make_defrag_hook", None)
    if factory is None:
        raise HookUnavailable("defrag.sim.defrag_hook has no make_defrag_hook")
    hook: DefragHook = factory(policy, protocol, **opts)
    return hook
