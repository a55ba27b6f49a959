"""What every policy shares: the default in-node GPU choice and a safe ratio."""

from __future__ import annotations

import numpy as np

from defrag.model.arrays import FloatArray, NodeArrays
from defrag.model.resources import Pod
from defrag.scoring.gpu_choice import best_fit_gpus


class BestFitGpuChoice:
    """Mixin: in-node GPU choice by best fit (docs/concepts.md)."""

    def choose_gpus(self, pod: Pod, arrays: NodeArrays, row: int) -> tuple[int, ...]:
        return best_fit_gpus(pod, arrays, row)


def safe_ratio(num: FloatArray, den: FloatArray) -> FloatArray:
    """num / den with 0 where den is 0."""
    out = np.zeros_like(num, dtype=np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out
