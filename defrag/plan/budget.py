"""An eviction budget per window that follows the demand it serves (issue 25).

A fixed budget (``windows.max_evictions_per_window``, 10 by default) is sized for a scheduler that
packs: a room then takes one or two evictions. Under a spreading scheduler (kube-scheduler's
default ``LeastAllocated``) every node holds a few small pods, so a room for an 8-GPU pod takes
about eight evictions, and a window of 10 serves about one starved pod while more arrive: the
backlog grows and defrag changes nothing (docs/benchmarks.md, § A spreading scheduler).

:class:`DemandBudget` sizes each window by its backlog: the GPUs asked by the pods the
starvation rule finds when the window opens, × ``per_gpu`` evictions (about one pod per GPU
under a spreading scheduler), never below the fixed budget and never above ``ceiling``
(the disruption ceiling of one window; the per-node and per-namespace limits of
:class:`~defrag.plan.config.EvictionBudget` still hold inside it). Pure: no client, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI

DEFAULT_CEILING = 512
"""The most evictions of one window however large the backlog (a ~1,000-node cluster: one
eviction per two nodes at most; 256 held the spreading scheduler's p95 at 24.9 h on seed 42
where 512 gives 4.9 h, docs/benchmarks.md)."""
DEFAULT_PER_GPU = 1.0
"""Evictions budgeted per GPU a starved pod asks (a spreading scheduler leaves about one pod
per GPU on the nodes a room would empty)."""


@dataclass(frozen=True, slots=True)
class DemandBudget:
    """Evictions for one window: ``per_gpu`` × the starved pods' GPUs, within
    [``floor``, ``ceiling``]."""

    floor: int
    """The fixed budget (``windows.max_evictions_per_window``): the least a window gets."""
    ceiling: int = DEFAULT_CEILING
    per_gpu: float = DEFAULT_PER_GPU

    def __post_init__(self) -> None:
        if self.floor < 0:
            raise ValueError(f"floor must be >= 0, got {self.floor}")
        if self.ceiling < self.floor:
            raise ValueError(f"ceiling ({self.ceiling}) must be >= floor ({self.floor})")
        if not self.per_gpu >= 0 or math.isinf(self.per_gpu):
            raise ValueError(f"per_gpu must be a finite number >= 0, got {self.per_gpu}")

    def total(self, starved: Iterable[Pod]) -> int:
        """The window's budget for the pods the starvation rule found as it opened."""
        gpus = sum(p.gpu_demand_milli for p in starved) / GPU_MILLI
        wanted = math.ceil(self.per_gpu * gpus - 1e-9)
        return min(max(wanted, self.floor), self.ceiling)


__all__ = ["DEFAULT_CEILING", "DEFAULT_PER_GPU", "DemandBudget"]
