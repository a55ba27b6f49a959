"""``reserve-binpack``: the seed score function of DESIGN §2, exactly.

A pod asks R GPUs; a node has T GPUs, F free.
- R ≥ T (whole-node job): F = T → 100, otherwise 20.
- R < T: F = T → 0 (keep whole free nodes for whole-node jobs); otherwise (1 − (F − R)/T) × 100.
GPU-sharing pods count F and R in GPU units (free share summed).
"""

from __future__ import annotations

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays
from defrag.model.resources import Pod
from defrag.scoring.policies.base import BestFitGpuChoice, free_gpus_for, requested_gpus


class ReserveBinpack(BestFitGpuChoice):
    name = "reserve-binpack"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        r = requested_gpus(pod)
        t = arrays.gpu_total.astype(np.float64)
        f = free_gpus_for(pod, arrays)
        if pod.num_gpu and pod.gpu_milli < 1000:
            node_free = arrays.free_share() >= arrays.gpu_total * 1000
        else:
            node_free = f >= t
        whole_job = r >= t
        with np.errstate(divide="ignore", invalid="ignore"):
            small = np.where(node_free, 0.0, (1.0 - (f - r) / np.where(t > 0, t, 1.0)) * 100.0)
        big = np.where(node_free, 100.0, 20.0)
        return np.clip(np.where(whole_job, big, small), 0.0, 100.0)
