"""``least-allocated`` (the kube-scheduler default, NodeResourcesFit) and ``most-allocated``.

Each resource the node has (CPU, memory, GPU share) scores its free (least) or used (most)
fraction after placing the pod, × 100; the node's score is the mean over those resources.

The node totals as floats, and how many resources each node counts, never change for one set of
nodes (copies of a :class:`NodeArrays` share their totals), so each policy keeps them for the
last totals it saw: a score is then six subtractions and divisions and a mean, with no float
conversion of the totals per pod (the simulator scores ~100,000 pods per run).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, IntArray, NodeArrays
from defrag.model.resources import Pod
from defrag.scoring.policies.base import BestFitGpuChoice, safe_ratio


@dataclass(frozen=True, slots=True)
class _Totals:
    """One node set's totals as floats, and the resources each node counts."""

    cpu_total: IntArray
    mem_total: IntArray
    gpu_total: IntArray
    cpu: FloatArray
    mem: FloatArray
    gpu: FloatArray
    counted: FloatArray
    dense: bool
    """Every total > 0: a plain division gives what :func:`safe_ratio` gives."""

    @classmethod
    def of(cls, arrays: NodeArrays) -> _Totals:
        cpu = arrays.cpu_total.astype(float)
        mem = arrays.mem_total.astype(float)
        gpu = (arrays.gpu_total * 1000).astype(float)
        counted = (1.0 + (arrays.mem_total > 0) + (gpu > 0)).astype(float)
        dense = bool((cpu > 0).all() and (mem > 0).all() and (gpu > 0).all())
        return cls(
            arrays.cpu_total, arrays.mem_total, arrays.gpu_total, cpu, mem, gpu, counted, dense
        )

    def holds(self, arrays: NodeArrays) -> bool:
        return (
            self.cpu_total is arrays.cpu_total
            and self.mem_total is arrays.mem_total
            and self.gpu_total is arrays.gpu_total
        )


class _AllocationScore(BestFitGpuChoice):
    """The free fractions after placement, over totals kept per node set; a subclass turns
    them into a percentage (:meth:`_percent`) and names the clip side that can bite on a
    feasible row (:meth:`_clip_feasible`)."""

    _totals: _Totals | None = None

    def _kept(self, arrays: NodeArrays) -> _Totals:
        t = self._totals
        if t is None or not t.holds(arrays):
            t = self._totals = _Totals.of(arrays)
        return t

    def _free_fractions_after(self, pod: Pod, arrays: NodeArrays) -> tuple[FloatArray, FloatArray]:
        """(sum of free fractions after placement, number of resources counted) per node."""
        t = self._kept(arrays)
        cpu_left = arrays.cpu_free - pod.cpu_milli
        mem_left = arrays.mem_free - pod.memory_mib
        gpu_left = arrays.share_free - pod.gpu_demand_milli
        if t.dense:  # int64 / float64 converts as astype(float) does: the same figures
            free = np.divide(cpu_left, t.cpu)
            free += np.divide(mem_left, t.mem)
            free += np.divide(gpu_left, t.gpu)
        else:
            free = safe_ratio(cpu_left.astype(float), t.cpu)
            free += safe_ratio(mem_left.astype(float), t.mem)
            free += safe_ratio(gpu_left.astype(float), t.gpu)
        return free, t.counted

    def _percent(self, free: FloatArray, counted: FloatArray) -> FloatArray:
        """The score before clipping, computed in ``free``'s place."""
        raise NotImplementedError

    def _clip_feasible(self, values: FloatArray) -> FloatArray:
        """:func:`_clip_percent` on every row the filters pass, in place (the other side of the
        clip cannot change such a row)."""
        raise NotImplementedError

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        return _clip_percent(self._percent(*self._free_fractions_after(pod, arrays)))

    def fresh_scores(self, pod: Pod, arrays: NodeArrays) -> FloatArray | None:
        """:meth:`score` for the scheduler's one-pass path (framework.FreshScores), where every
        total is > 0 (None elsewhere): a new array every call, no NaN (a division by a positive
        total, a mean over 3 resources). On a row the filters pass, the pod's CPU, memory and
        GPU share fit, so every free amount after placement is ≥ 0 and so is their sum: only
        one side of the clip can bite there (:meth:`_clip_feasible`)."""
        if not self._kept(arrays).dense:
            return None
        return self._clip_feasible(self._percent(*self._free_fractions_after(pod, arrays)))


class LeastAllocated(_AllocationScore):
    name = "least-allocated"

    def _percent(self, free: FloatArray, counted: FloatArray) -> FloatArray:
        free /= counted
        free *= 100.0
        return free

    def _clip_feasible(self, values: FloatArray) -> FloatArray:
        # free ≥ 0 → free / counted ≥ 0 → × 100 ≥ 0 (rounding keeps the order): only the top
        return np.minimum(values, 100.0, out=values)


class MostAllocated(_AllocationScore):
    name = "most-allocated"

    def _percent(self, free: FloatArray, counted: FloatArray) -> FloatArray:
        used = np.subtract(counted, free, out=free)
        used /= counted
        used *= 100.0
        return used

    def _clip_feasible(self, values: FloatArray) -> FloatArray:
        # free ≥ 0 → counted − free ≤ counted → ÷ counted ≤ 1 → × 100 ≤ 100: only the bottom
        return np.maximum(values, 0.0, out=values)


def _clip_percent(values: FloatArray) -> FloatArray:
    """``np.clip(values, 0, 100)`` in place (NaN stays NaN), without its wrapper's cost."""
    np.maximum(values, 0.0, out=values)
    return np.minimum(values, 100.0, out=values)
