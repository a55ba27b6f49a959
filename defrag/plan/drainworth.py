"""What a repack drain is worth: the starved pods it seats, each × the wait it saves them.

A plan repacks on demand (``PlanOptions.repack_on_demand``) because make-room left starved pods
without room. Each drain is then weighed by the rule a room is (docs/planning.md, "What a room
is worth"): it is kept only when what it is worth reaches the margin (``room_worth``) × its
cost.

- **worth**: the starved pods (a gang whole) the drained node then holds, placed by the
  scheduler's own filter and score on that node alone, most urgent first, each pod's GPUs ×
  the hours until the cluster would free such a room by itself (the forecast make-room uses,
  :func:`~defrag.plan.makeroom.room_worth`). A drain that seats none of them is worth nothing:
  the GPUs it frees go to whatever the scheduler places next, which under a spreading scheduler
  is the next small pod to arrive.
- **cost**: its victims' known lost work and restarts (:func:`~defrag.plan.makeroom.known_cost`,
  the price a room pays) and their wait to be placed again
  (:func:`~defrag.plan.makeroom.victims_wait`).

The pods a kept drain seats stay reserved there in the workspace (no later drain counts them
again) and its evictions carry the first one's name (``for_pod``): the executor keeps the node
for it (``defrag.io/reserved-for``) as it does a room.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.plan.workspace import Workspace
from defrag.scoring.framework import Placement, Policy
from defrag.scoring.scheduler import schedule


@dataclass(frozen=True, slots=True)
class Waiting:
    """A starved group without room and the hours of waiting a room would save each pod."""

    pods: tuple[Pod, ...]
    wait_h: float

    @property
    def gpus(self) -> float:
        return sum(p.gpu_demand_milli for p in self.pods) / GPU_MILLI

    @property
    def value(self) -> float:
        """GPU-hours of waiting saved: the group's GPUs × the forecast wait."""
        return self.gpus * self.wait_h


class Beneficiaries:
    """The starved groups a plan's drains may seat, most urgent first; each seated once."""

    def __init__(self, waiting: Iterable[Waiting]) -> None:
        self.left: list[Waiting] = [w for w in waiting if w.pods and w.value > 0]

    def __bool__(self) -> bool:
        return bool(self.left)

    def seat(self, ws: Workspace, policy: Policy, row: int) -> list[Waiting]:
        """The groups that fit on ``row`` as the workspace is now, in order, each reserved
        there (the caller rolls the workspace back if it refuses the drain, and calls
        :meth:`take` if it keeps it)."""
        only = np.ones(len(ws.arrays), dtype=bool)
        only[row] = False
        seated: list[Waiting] = []
        for waiting in self.left:
            mark = ws.mark()
            for pod in waiting.pods:
                placed = schedule(pod, ws.arrays, policy, exclude=only, why=False)
                if not isinstance(placed, Placement):
                    ws.rollback(mark)
                    break
                ws.reserve(pod, placed.row, placed.gpus)
            else:
                seated.append(waiting)
        return seated

    def take(self, seated: Sequence[Waiting]) -> None:
        """Drop ``seated`` (a kept drain's) from the groups left."""
        gone = {id(w) for w in seated}
        self.left = [w for w in self.left if id(w) not in gone]


def describe_seated(seated: Sequence[Waiting]) -> str:
    """``ns/a (8 GPU), ns/b (4 GPU)``: the pods a drain seats, for its reason."""
    names = [f"{p.key} ({p.gpu_demand_milli / GPU_MILLI:g} GPU)" for w in seated for p in w.pods]
    return ", ".join(names)


__all__ = ["Beneficiaries", "Waiting", "describe_seated"]
