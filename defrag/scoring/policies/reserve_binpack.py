"""``reserve-binpack``: the seed score function (docs/concepts.md), exactly.

A pod asks R GPUs; a node has T GPUs, F free.
- R ≥ T (whole-node job): F = T → 100, otherwise 20.
- R < T: F = T → 0 (keep whole free nodes for whole-node jobs); otherwise (1 − (F − R)/T) × 100.
GPU-sharing pods count F and R in GPU units (free share summed).

Among nodes of equal score the scheduler takes the one with the fewest GPUs
(:meth:`ReserveBinpack.tie_order`; then the first name): the rule scores a pod that fills a
2-GPU node and one that fills the same share of an 8-GPU node alike, and placing it on the
smaller node keeps the larger nodes' GPUs together for the multi-GPU pods only they can host.
In the timeline on every openb trace this lowers the multi-GPU p95 wait (docs/benchmarks.md §
"The seed score's tie-break"); the scores themselves are the seed's, unchanged.
"""

from __future__ import annotations

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, IntArray, NodeArrays
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.scoring.policies.base import BestFitGpuChoice


class ReserveBinpack(BestFitGpuChoice):
    name = "reserve-binpack"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        t = arrays.gpu_total * GPU_MILLI
        if pod.num_gpu and pod.gpu_milli >= GPU_MILLI:
            f = arrays.free_whole_count() * GPU_MILLI
            r = pod.num_gpu * GPU_MILLI
        else:  # a share (or a CPU-only pod, R = 0): free share summed, in milli-GPU
            f = arrays.free_share()
            r = pod.gpu_demand_milli
        return seed_score(r, t, f, f >= t)

    def tie_order(self, pod: Pod, arrays: NodeArrays) -> FloatArray:
        """Among nodes of equal score, the fewest GPUs first (framework.TieBreak)."""
        return -arrays.gpu_total.astype(np.float64)

    def fresh_scores(self, pod: Pod, arrays: NodeArrays) -> FloatArray:
        """:meth:`score` for the scheduler's one-pass path (framework.FreshScores): a new array
        of integers in 0..100 — F ≤ T on every node (no GPU has more free than it has), so
        T − (F − R) ≥ 0 — with no NaN (integer arithmetic)."""
        return self.score(pod, arrays, _NO_MASK)


_NO_MASK: BoolArray = np.ones(0, dtype=bool)
"""The ``feasible`` :meth:`ReserveBinpack.fresh_scores` passes: the seed's rule reads none."""


def seed_score(r: int, t: IntArray, f: IntArray, node_free: BoolArray) -> FloatArray:
    """The seed's rule for R units asked of nodes with T units, F free, as integers truncated
    the way its Go code does (``int((1 - (F - R) / T) * 100)``: 62.5 → 62). Computed exactly in
    integer arithmetic — ``100·(T − (F − R)) // T`` — so a share such as F = 0.8, R = 0.5 of one
    GPU scores 70, not the 69 a float rounding would give."""
    # F ≤ T and R ≥ 0, so T − (F − R) ≥ 0: floor division is Go's truncation here.
    num = t - f
    num += r
    num *= 100
    small = np.minimum(num // np.maximum(t, 1), 100)
    small[node_free] = 0
    whole_job = r >= t
    if whole_job.any():
        small = np.where(whole_job, np.where(node_free, 100, 20), small)
    return small.astype(np.float64)
