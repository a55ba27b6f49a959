"""What earlier cycles tell a plan: the daemon's own recent evictions, and whether the scheduler
packs (the packing verdict that stands, :mod:`defrag.plan.patience`).

Both drivers of the decision keep it between cycles and hand it to the planner: the daemon from
its executions, the simulator from its actuator.
"""

from __future__ import annotations

from dataclasses import dataclass

from defrag.plan.recent import NONE, RecentEvictions


@dataclass(frozen=True, slots=True)
class History:
    evicted: RecentEvictions = NONE
    """The daemon's evictions within the anti-thrash guard (:mod:`defrag.plan.recent`)."""
    packing: bool = False
    """The scheduler packs: pods leaving a node free it for a pending pod, as the scheduler
    fills partly free nodes first (:mod:`defrag.plan.departures`)."""


NO_HISTORY = History()

__all__ = ["NO_HISTORY", "History"]
