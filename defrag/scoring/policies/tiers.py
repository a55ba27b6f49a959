"""``gpu-packing`` and ``gpu-clustering``: the tiered policies of the FGD paper, scored as its
simulator scores them (integer scores; Weng et al., ATC'23, and its public artifact).

gpu-packing — CPU-only pods score 0 everywhere. An idle node (every GPU free) scores
max(33 − free GPUs, free GPUs). Otherwise the pod's GPUs are the fitting ones with the least free
share: if any of them is entirely free, max(50 − entirely free GPUs taken, 33); else (only
already-shared GPUs) max(100 − Σ⌊free % of the GPUs taken⌋ / 10, 50).

gpu-clustering — CPU-only pods score 0. For a GPU pod, by the GPU-demand classes (share, 1-, 2-,
4-, 8-GPU) of the pods on the node: only the pod's class → 75+, the pod's class among others →
50+, no GPU pod → 25+, other classes only → 0+; plus ⌊25 × (8 GPUs − free GPU share) / 8 GPUs⌋.
"""

from __future__ import annotations

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays, demand_class
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.scoring.policies.base import BestFitGpuChoice

MAX_GPU_MILLI = 8 * GPU_MILLI
_UNFIT = np.iinfo(np.int64).max


class GpuPacking(BestFitGpuChoice):
    name = "gpu-packing"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        n = len(arrays)
        if pod.num_gpu == 0:
            return np.zeros(n)
        whole = arrays.free_whole_count()
        idle = whole == arrays.gpu_total
        # The GPUs the pod would take: the fitting ones with the least free share.
        fitting = np.where(arrays.gpu_free >= pod.gpu_milli, arrays.gpu_free, _UNFIT)
        taken = np.sort(fitting, axis=1)[:, : pod.num_gpu]
        valid = taken != _UNFIT
        full = ((taken == GPU_MILLI) & valid).sum(axis=1)
        pct = np.where(valid, taken * 100 // GPU_MILLI, 0).sum(axis=1)
        used = np.where(full > 0, np.maximum(50 - full, 33), np.maximum(100 - pct // 10, 50))
        out = np.where(idle, np.maximum(33 - whole, whole), used)
        return np.clip(out.astype(np.float64), 0.0, 100.0)


class GpuClustering(BestFitGpuChoice):
    name = "gpu-clustering"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        n = len(arrays)
        if pod.num_gpu == 0:
            return np.zeros(n)
        classes = arrays.class_count[:, 1:] > 0  # GPU classes only (column 0: CPU-only pods)
        mine = classes[:, demand_class(pod) - 1]
        count = classes.sum(axis=1)
        base = np.where(mine & (count == 1), 75, np.where(mine, 50, np.where(count == 0, 25, 0)))
        inner = (25 * (MAX_GPU_MILLI - arrays.free_share())) // MAX_GPU_MILLI
        return np.clip((base + inner).astype(np.float64), 0.0, 100.0)
