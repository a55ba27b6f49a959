"""Reference emulations of the FGD paper's score plugins — for diagnosis in benchmarks only.

The paper's simulator (Weng et al., ATC'23; the public `kubernetes-scheduler-simulator`
artifact) scores nodes with *integer* kube-scheduler scores and normalises by fixed maximum
node specs (128 CPUs, 8 GPUs). Those details, not the protocol, explain most of the gaps
between our policies and the published numbers. ``bench_fill --reference`` swaps these in for
the six paper policies so the protocol can be checked on its own; the product's policies live
in ``defrag.scoring.policies``. Written from the paper and the artifact's documented
behaviour (facts cited; no code copied).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays, demand_class
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.scoring.framework import Policy
from defrag.scoring.policies import make_policy
from defrag.scoring.policies.base import BestFitGpuChoice
from defrag.scoring.policies.fgd import Fgd

MAX_CPU, MAX_GPU = 128_000.0, 8_000.0
"""The artifact's MaxSpecCpu / MaxSpecGpu (milli)."""


class PaperFgd(Fgd):
    """score = ⌊100 · sigmoid(−Δfrag / 1000)⌋ (integer; ties to the first node)."""

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        delta = self.deltas(pod, arrays)
        with np.errstate(over="ignore", invalid="ignore"):
            s = np.floor(100.0 / (1.0 + np.exp(delta / 1000.0)))
        return np.asarray(np.where(np.isfinite(s), s, 0.0), dtype=np.float64)


class PaperBestFit(BestFitGpuChoice):
    """⌊(1 − [0.5·(cpu_free − cpu_req)/128 CPUs + 0.5·(gpu_free − gpu_req)/8 GPUs])·100⌋,
    then min–max normalised over the feasible nodes to 0..100 (integer)."""

    name = "best-fit"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        left = (
            0.5 * (arrays.cpu_free - pod.cpu_milli) / MAX_CPU
            + 0.5 * (arrays.free_share() - pod.gpu_demand_milli) / MAX_GPU
        )
        raw = np.trunc((1.0 - left) * 100.0)
        seen = raw[feasible]
        if not len(seen) or seen.max() == seen.min():
            return np.zeros(len(raw))
        return np.asarray(np.floor((raw - seen.min()) * 100.0 / (seen.max() - seen.min())))


class PaperDotProduct(BestFitGpuChoice):
    """⌊100·(1 − d/2)⌋ with d = (cpu_free/128)(cpu_req/128) + (gpu_free/8)(gpu_req/8): the
    *smallest* dot product of demand and free resources wins (a packing rule)."""

    name = "dot-product"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        dot = (arrays.cpu_free / MAX_CPU) * (pod.cpu_milli / MAX_CPU) + (
            arrays.free_share() / MAX_GPU
        ) * (pod.gpu_demand_milli / MAX_GPU)
        return np.asarray(np.trunc(100.0 * (1.0 - dot / 2.0)), dtype=np.float64)


class PaperGpuPacking(BestFitGpuChoice):
    """CPU-only pods: 0 everywhere. Idle node (every GPU free): max(33 − free GPUs, free GPUs).
    Otherwise take the fitting GPUs with the least free share: if any is entirely free,
    max(50 − entirely free GPUs taken, 33); else max(100 − Σ ⌊free% of taken GPUs⌋ / 10, 50)."""

    name = "gpu-packing"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        n = len(arrays)
        if pod.num_gpu == 0:
            return np.zeros(n)
        whole = arrays.free_whole_count()
        idle = whole == arrays.gpu_total
        out = np.maximum(33 - whole, whole).astype(np.float64)
        for row in np.flatnonzero(~idle & feasible):
            total = int(arrays.gpu_total[row])
            left = arrays.gpu_free[row, :total]
            order = np.argsort(left, kind="stable")
            taken = [int(i) for i in order if left[i] >= pod.gpu_milli][: pod.num_gpu]
            full = sum(1 for i in taken if left[i] == GPU_MILLI)
            if full:
                out[row] = max(50 - full, 33)
            else:
                pct = sum(int(left[i]) * 100 // GPU_MILLI for i in taken)
                out[row] = max(100 - pct // 10, 50)
        return out


class PaperGpuClustering(BestFitGpuChoice):
    """CPU-only pods: 0. GPU pods, by the GPU classes (share, 1-, 2-, 4-, 8-GPU) on the node:
    only the pod's class → 75+, the pod's class among others → 50+, no GPU pod → 25+, other
    classes only → 0+; plus ⌊25·(8 GPUs − free GPU share)/8 GPUs⌋ (absolute, not per node)."""

    name = "gpu-clustering"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        n = len(arrays)
        if pod.num_gpu == 0:
            return np.zeros(n)
        classes = arrays.class_count[:, 1:] > 0  # GPU classes only (column 0: CPU-only pods)
        mine = classes[:, demand_class(pod) - 1]
        count = classes.sum(axis=1)
        base = np.where(mine & (count == 1), 75, np.where(mine, 50, np.where(count == 0, 25, 0)))
        inner = (25 * (int(MAX_GPU) - arrays.free_share())) // int(MAX_GPU)
        return np.asarray(base + inner, dtype=np.float64)


def make_reference_policy(name: str, *, mix: WorkloadMix | None = None, seed: int = 0) -> Policy:
    """The paper emulation for the six paper policies; the product's policy otherwise."""
    factories: dict[str, Any] = {
        "fgd": lambda: PaperFgd(mix),
        "best-fit": PaperBestFit,
        "dot-product": PaperDotProduct,
        "gpu-packing": PaperGpuPacking,
        "gpu-clustering": PaperGpuClustering,
    }
    if name in factories:
        policy: Policy = factories[name]()
        return policy
    return make_policy(name, mix=mix, seed=seed)
