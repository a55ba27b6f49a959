"""The simulator's extension point for defragmentation: a hook that decides migrations.

The simulator calls the hook when a pod fits nowhere (``on_unschedulable``) and, in the
timeline protocol, at each idle window (``on_window``). The hook returns moves; the simulator
applies them in order (release on the source row, allocate on the target row), counts each as
a migration, and then retries the pod. A move that does not fit is a bug in the hook: the
simulator rolls back the whole batch and raises :class:`~defrag.sim.state.InvalidMove`.

The daemon's hooks are :mod:`defrag.sim.daemon_driver` (timeline) and
:mod:`defrag.sim.fill_hook` (fill), the peers' :mod:`defrag.sim.peers`;
:mod:`defrag.sim.defragmenters` picks one by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from defrag.model.resources import Pod
from defrag.sim.moves import REQUEUE, Move

if TYPE_CHECKING:
    from defrag.sim.state import SimState


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


__all__ = ["REQUEUE", "DefragHook", "Move", "NoDefrag", "TickHook"]
