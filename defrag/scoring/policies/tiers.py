"""``gpu-packing`` and ``gpu-clustering``: tiered policies of the FGD paper.

Scores put each tier in its own band (high 70–100, middle 35–65, low 0–30) and order nodes
inside a band, so a higher tier always wins.

gpu-packing: for a GPU-sharing pod, a node with an already-shared GPU that fits (the one with
the least free share best), then a node already in use with a free GPU, then an idle node.
Whole-GPU pods: nodes in use (fewest free GPUs first), then idle nodes.

gpu-clustering: nodes hosting only pods of the pod's GPU-demand class, then nodes hosting other
(or mixed) classes, then idle nodes; inside a tier, the least free GPU share first.
"""

from __future__ import annotations

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays, demand_class
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.scoring.policies.base import BestFitGpuChoice, safe_ratio

HIGH, MIDDLE, LOW = 70.0, 35.0, 0.0
BAND = 30.0


def _free_fraction(arrays: NodeArrays) -> FloatArray:
    return safe_ratio(
        arrays.free_share().astype(float), (arrays.gpu_total * GPU_MILLI).astype(float)
    )


def _in_use(arrays: NodeArrays) -> BoolArray:
    return np.asarray(arrays.class_count.sum(axis=1) > 0) | (
        arrays.free_share() < arrays.gpu_total * GPU_MILLI
    )


class GpuPacking(BestFitGpuChoice):
    name = "gpu-packing"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        tight = 1.0 - _free_fraction(arrays)  # 1 = full, 0 = empty
        in_use = _in_use(arrays)
        scores = np.where(in_use, MIDDLE + BAND * tight, LOW + BAND * tight)
        if pod.num_gpu and pod.gpu_milli < GPU_MILLI:
            free = arrays.gpu_free
            shared_fit = (free >= pod.gpu_milli) & (free < GPU_MILLI)
            least = np.where(shared_fit, free, GPU_MILLI).min(axis=1)
            scores = np.where(
                shared_fit.any(axis=1), HIGH + BAND * (1.0 - least / GPU_MILLI), scores
            )
        return np.asarray(scores, dtype=np.float64)


class GpuClustering(BestFitGpuChoice):
    name = "gpu-clustering"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        counts = arrays.class_count
        total = counts.sum(axis=1)
        same_only = (total > 0) & (counts[:, demand_class(pod)] == total)
        tight = 1.0 - _free_fraction(arrays)
        base = np.where(same_only, HIGH, np.where(total > 0, MIDDLE, LOW))
        return np.asarray(base + BAND * tight, dtype=np.float64)
