"""The FGD fragmentation measure (Weng et al., ATC'23), vectorised over nodes.

A node's fragmentation against a workload mix is the expected amount of its free GPU capacity
(milli-GPU) that a pod drawn from the mix could not use:
- a shape that cannot run on the node at all (too little CPU, too few GPUs with enough free
  share, a GPU model it does not allow, or a shape that needs no GPU) sees all free GPU
  capacity as fragmented;
- otherwise only the free share of GPUs too small for the shape (free < the shape's share).
The node's value is the frequency-weighted sum over the mix's shapes.

The work is split so that every shape is a cheap lookup: for each distinct per-GPU share m in
the mix, ``count[m]`` (GPUs with free ≥ m) and ``small[m]`` (free share summed over GPUs with
free < m) are computed once per evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, IntArray
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix


@dataclass(frozen=True, slots=True, eq=False)
class FragModel:
    """The mix, prepared for vectorised evaluation on a cluster with GPU ``models``."""

    thresholds: IntArray  # [U] distinct per-GPU shares m of the GPU shapes
    shape_m: IntArray  # [S] index into thresholds (0 for CPU-only shapes)
    shape_k: IntArray  # [S] GPUs per shape
    shape_cpu: IntArray  # [S]
    weight: FloatArray  # [S]
    gpu_shape: BoolArray  # [S] False for CPU-only shapes (they see every free GPU as fragmented)
    model_ok: BoolArray  # [S, n_models + 1]; the last column is "node has no GPU"

    @classmethod
    def build(cls, mix: WorkloadMix, models: tuple[str, ...]) -> FragModel:
        shares = sorted({s.gpu_milli for s in mix.shapes if s.num_gpu} or {GPU_MILLI})
        index = {m: i for i, m in enumerate(shares)}
        model_ok = np.zeros((len(mix.shapes), len(models) + 1), dtype=bool)
        for i, shape in enumerate(mix.shapes):
            for j, model in enumerate(models):
                model_ok[i, j] = not shape.gpu_models or model in shape.gpu_models
        return cls(
            thresholds=np.array(shares, dtype=np.int64),
            shape_m=np.array([index.get(s.gpu_milli, 0) for s in mix.shapes], dtype=np.int64),
            shape_k=np.array([s.num_gpu for s in mix.shapes], dtype=np.int64),
            shape_cpu=np.array([s.cpu_milli for s in mix.shapes], dtype=np.int64),
            weight=np.array(mix.weights, dtype=np.float64),
            gpu_shape=np.array([s.num_gpu > 0 for s in mix.shapes], dtype=bool),
            model_ok=model_ok,
        )

    # --- the parts ----------------------------------------------------------------------------

    def counts_and_small(self, free: IntArray) -> tuple[IntArray, IntArray]:
        """For free[..., G]: count[U, ...] of GPUs with free ≥ m and small[U, ...] = Σ free < m."""
        m = self.thresholds.reshape((-1,) + (1,) * free.ndim)
        ge = free[None, ...] >= m
        count = ge.sum(axis=-1)
        small = np.where(ge, 0, free[None, ...]).sum(axis=-1)
        return count, small

    def combine(
        self,
        total: IntArray,
        cpu_free: IntArray,
        model_col: IntArray,
        count: IntArray,
        small: IntArray,
    ) -> FloatArray:
        """Fragmentation from per-node totals; all arrays broadcast over the node axes."""
        s_shape = (-1,) + (1,) * np.ndim(total)
        cpu_ok = cpu_free[None, ...] >= self.shape_cpu.reshape(s_shape)
        mod_ok = self.model_ok[:, model_col]  # [S, N] (broadcast over extra axes below)
        while mod_ok.ndim < cpu_ok.ndim:
            mod_ok = mod_ok[..., None]
        gpu_ok = count[self.shape_m] >= self.shape_k.reshape(s_shape)
        feasible = cpu_ok & mod_ok & gpu_ok & self.gpu_shape.reshape(s_shape)
        usable = np.where(feasible, total[None, ...] - small[self.shape_m], 0)
        w = self.weight.reshape(s_shape)
        return np.asarray(total * self.weight.sum() - (w * usable).sum(axis=0), dtype=np.float64)

    def node_frag(self, free: IntArray, cpu_free: IntArray, model_code: IntArray) -> FloatArray:
        """Fragmentation (milli-GPU) of each node given its per-GPU free share [N, G]."""
        count, small = self.counts_and_small(free)
        return self.combine(free.sum(axis=-1), cpu_free, model_code, count, small)
