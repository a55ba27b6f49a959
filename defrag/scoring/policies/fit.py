"""``best-fit`` and ``dot-product``: the two resource-vector heuristics of the FGD paper.

best-fit: the node with the smallest weighted leftover after placement,
0.5 × CPU left / CPU capacity + 0.5 × GPU left / GPU capacity; score = (1 − leftover) × 100.
dot-product: the node maximising demand · free, both normalised by the node's capacity
over (CPU, GPU); score = dot / 2 × 100 (each term is at most 1).
"""

from __future__ import annotations

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays
from defrag.model.resources import Pod
from defrag.scoring.policies.base import BestFitGpuChoice, safe_ratio


class BestFit(BestFitGpuChoice):
    name = "best-fit"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        cpu_left = safe_ratio(
            (arrays.cpu_free - pod.cpu_milli).astype(float), arrays.cpu_total.astype(float)
        )
        gpu_left = safe_ratio(
            (arrays.free_share() - pod.gpu_demand_milli).astype(float),
            (arrays.gpu_total * 1000).astype(float),
        )
        return np.clip((1.0 - (0.5 * cpu_left + 0.5 * gpu_left)) * 100.0, 0.0, 100.0)


class DotProduct(BestFitGpuChoice):
    name = "dot-product"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        cpu_cap = arrays.cpu_total.astype(float)
        gpu_cap = (arrays.gpu_total * 1000).astype(float)
        demand_cpu = safe_ratio(np.full(len(arrays), float(pod.cpu_milli)), cpu_cap)
        demand_gpu = safe_ratio(np.full(len(arrays), float(pod.gpu_demand_milli)), gpu_cap)
        free_cpu = safe_ratio(arrays.cpu_free.astype(float), cpu_cap)
        free_gpu = safe_ratio(arrays.free_share().astype(float), gpu_cap)
        dot = demand_cpu * free_cpu + demand_gpu * free_gpu
        return np.clip(dot / 2.0 * 100.0, 0.0, 100.0)
