"""``least-allocated`` (the kube-scheduler default, NodeResourcesFit) and ``most-allocated``.

Each resource the node has (CPU, memory, GPU share) scores its free (least) or used (most)
fraction after placing the pod, × 100; the node's score is the mean over those resources.
"""

from __future__ import annotations

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays
from defrag.model.resources import Pod
from defrag.scoring.policies.base import BestFitGpuChoice, safe_ratio


def _free_fractions_after(pod: Pod, arrays: NodeArrays) -> tuple[FloatArray, FloatArray]:
    """(sum of free fractions after placement, number of resources counted) per node."""
    cpu = safe_ratio(
        (arrays.cpu_free - pod.cpu_milli).astype(float), arrays.cpu_total.astype(float)
    )
    mem = safe_ratio(
        (arrays.mem_free - pod.memory_mib).astype(float), arrays.mem_total.astype(float)
    )
    gpu_cap = (arrays.gpu_total * 1000).astype(float)
    gpu = safe_ratio((arrays.free_share() - pod.gpu_demand_milli).astype(float), gpu_cap)
    counted = 1.0 + (arrays.mem_total > 0) + (gpu_cap > 0)
    return cpu + mem + gpu, counted.astype(float)


class LeastAllocated(BestFitGpuChoice):
    name = "least-allocated"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        free, counted = _free_fractions_after(pod, arrays)
        return np.clip(free / counted * 100.0, 0.0, 100.0)


class MostAllocated(BestFitGpuChoice):
    name = "most-allocated"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        free, counted = _free_fractions_after(pod, arrays)
        return np.clip((counted - free) / counted * 100.0, 0.0, 100.0)
