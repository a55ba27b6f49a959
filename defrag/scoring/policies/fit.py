"""``best-fit`` and ``dot-product`` as the FGD paper's simulator scores them.

Both divide by fixed maximum node specs (128 CPUs, 8 GPUs) rather than each node's capacity,
and both produce integer kube-scheduler scores (Weng et al., ATC'23, and its public artifact).

best-fit: leftover = 0.5 × (CPU free − CPU asked)/128 CPUs + 0.5 × (GPU free − GPU asked)/8 GPUs;
raw = ⌊(1 − leftover) × 100⌋, then min–max normalised over the feasible nodes to 0..100.
dot-product: d = (CPU free/128)(CPU asked/128) + (GPU free/8)(GPU asked/8); score =
⌊100 × (1 − d/2)⌋ — the *smallest* dot product wins, which packs.
"""

from __future__ import annotations

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays
from defrag.model.resources import Pod
from defrag.scoring.policies.base import BestFitGpuChoice

MAX_CPU_MILLI = 128_000.0
MAX_GPU_MILLI = 8_000.0


class BestFit(BestFitGpuChoice):
    name = "best-fit"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        left = (
            0.5 * (arrays.cpu_free - pod.cpu_milli) / MAX_CPU_MILLI
            + 0.5 * (arrays.free_share() - pod.gpu_demand_milli) / MAX_GPU_MILLI
        )
        raw = np.trunc((1.0 - left) * 100.0)
        seen = raw[feasible]
        if not len(seen) or seen.max() == seen.min():
            return np.zeros(len(raw))
        normalised = np.floor((raw - seen.min()) * 100.0 / (seen.max() - seen.min()))
        return np.clip(normalised, 0.0, 100.0)


class DotProduct(BestFitGpuChoice):
    name = "dot-product"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        dot = (arrays.cpu_free / MAX_CPU_MILLI) * (pod.cpu_milli / MAX_CPU_MILLI) + (
            arrays.free_share() / MAX_GPU_MILLI
        ) * (pod.gpu_demand_milli / MAX_GPU_MILLI)
        return np.clip(np.trunc(100.0 * (1.0 - dot / 2.0)), 0.0, 100.0)
