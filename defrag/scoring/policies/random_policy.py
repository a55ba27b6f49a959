"""``random``: any feasible node, any feasible GPU, from a seeded generator (a baseline)."""

from __future__ import annotations

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.scoring.gpu_choice import whole_gpus


class RandomPolicy:
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        return self._rng.random(len(arrays)) * 100.0

    def choose_gpus(self, pod: Pod, arrays: NodeArrays, row: int) -> tuple[int, ...]:
        if pod.num_gpu == 0:
            return ()
        if pod.gpu_milli >= GPU_MILLI:
            return whole_gpus(pod.num_gpu, arrays, row)
        total = int(arrays.gpu_total[row])
        fits = np.flatnonzero(arrays.gpu_free[row, :total] >= pod.gpu_milli)
        picked = self._rng.choice(fits, size=pod.num_gpu, replace=False)
        return tuple(sorted(int(i) for i in picked))
