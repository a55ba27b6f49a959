"""What every policy shares: the default in-node GPU choice and the demand in GPU units."""

from __future__ import annotations

import numpy as np

from defrag.model.arrays import FloatArray, NodeArrays
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.scoring.gpu_choice import best_fit_gpus


class BestFitGpuChoice:
    """Mixin: in-node GPU choice by best fit (DESIGN §2)."""

    def choose_gpus(self, pod: Pod, arrays: NodeArrays, row: int) -> tuple[int, ...]:
        return best_fit_gpus(pod, arrays, row)


def requested_gpus(pod: Pod) -> float:
    """R in GPU units: whole GPUs, or the share of a GPU-sharing pod."""
    return pod.num_gpu * pod.gpu_milli / GPU_MILLI if pod.num_gpu else 0.0


def free_gpus_for(pod: Pod, arrays: NodeArrays) -> FloatArray:
    """F per node in the pod's units: entirely free GPUs for whole-GPU pods, else free share."""
    if pod.num_gpu and pod.gpu_milli >= GPU_MILLI:
        return arrays.free_whole_count().astype(np.float64)
    return arrays.free_share().astype(np.float64) / GPU_MILLI


def safe_ratio(num: FloatArray, den: FloatArray) -> FloatArray:
    """num / den with 0 where den is 0."""
    out = np.zeros_like(num, dtype=np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out
