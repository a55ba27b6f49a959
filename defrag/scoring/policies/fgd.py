"""``fgd``: fragmentation gradient descent (Weng et al., ATC'23).

Each pod goes to the node (and, for a GPU-sharing pod, the GPU) where the node's
fragmentation against the workload mix grows least (see ``defrag.scoring.fgd_model``), scored
as the paper's simulator does: ⌊100 × sigmoid(−Δfrag / 1000)⌋ with Δ in milli-GPU, an integer,
so near-equal growths tie and go to the first node (see :func:`fgd_score`).
"""

from __future__ import annotations

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, IntArray, NodeArrays
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.scoring.fgd_model import FragModel
from defrag.scoring.gpu_choice import best_fit_gpus, whole_gpus


class Fgd:
    name = "fgd"

    def __init__(self, mix: WorkloadMix | None = None) -> None:
        self.mix = mix or WorkloadMix.default()
        self._models: tuple[str, ...] | None = None
        self._fm: FragModel | None = None

    def model_for(self, arrays: NodeArrays) -> FragModel:
        if self._fm is None or self._models != arrays.models:
            self._fm = FragModel.build(self.mix, arrays.models)
            self._models = arrays.models
        return self._fm

    def deltas(self, pod: Pod, arrays: NodeArrays) -> FloatArray:
        """Δfrag per node [N] (for a sharing pod, on its best GPU); inf where it cannot go."""
        fm = self.model_for(arrays)
        free = arrays.gpu_free
        count, small = fm.counts_and_small(free)
        total = free.sum(axis=1)
        model = arrays.model_code
        before = fm.combine(total, arrays.cpu_free, model, count, small)
        cpu_after = arrays.cpu_free - pod.cpu_milli
        if pod.num_gpu == 0:
            after = fm.combine(total, cpu_after, model, count, small)
            return after - before
        m = pod.gpu_milli
        if m >= GPU_MILLI:
            # k whole GPUs: every threshold loses k GPUs; no small share changes.
            after = fm.combine(
                total - pod.num_gpu * m, cpu_after, model, count - pod.num_gpu, small
            )
            return after - before
        if pod.num_gpu == 1:
            rows, _, delta = self.sharing_candidates(pod, arrays, fm, count, small, before)
            out = np.full(len(arrays), np.inf)
            np.minimum.at(out, rows, delta)
            return out
        # Several shared GPUs (rare): evaluate the best-fit choice node by node.
        out = np.full(len(arrays), np.inf)
        for row in np.flatnonzero((free >= m).sum(axis=1) >= pod.num_gpu):
            trial = free[row].copy()
            trial[list(best_fit_gpus(pod, arrays, int(row)))] -= m
            frag = fm.node_frag(trial[None, :], cpu_after[row : row + 1], model[row : row + 1])
            out[row] = frag[0] - before[row]
        return out

    def sharing_candidates(
        self,
        pod: Pod,
        arrays: NodeArrays,
        fm: FragModel,
        count: IntArray,
        small: IntArray,
        before: FloatArray,
    ) -> tuple[IntArray, IntArray, FloatArray]:
        """Δfrag for putting a single-GPU sharing pod on each candidate GPU.

        GPUs of one node with the same free share give the same Δ, so only the first of each
        (node, free share) pair is evaluated: a few per node instead of every slot.
        """
        m = pod.gpu_milli
        free = arrays.gpu_free
        rows_all, slots_all = np.nonzero(free >= m)
        values = free[rows_all, slots_all]
        _, first = np.unique(rows_all * (GPU_MILLI + 1) + values, return_index=True)
        rows, slots, f = rows_all[first], slots_all[first], values[first]
        th = fm.thresholds[:, None]
        g = f - m
        count_c = count[:, rows] - (f >= th) + (g >= th)
        small_c = small[:, rows] - np.where(f < th, f, 0) + np.where(g < th, g, 0)
        total_c = free.sum(axis=1)[rows] - m
        after = fm.combine(
            total_c,
            arrays.cpu_free[rows] - pod.cpu_milli,
            arrays.model_code[rows],
            count_c,
            small_c,
        )
        return rows, slots, after - before[rows]

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        return fgd_score(self.deltas(pod, arrays))

    def choose_gpus(self, pod: Pod, arrays: NodeArrays, row: int) -> tuple[int, ...]:
        if pod.num_gpu == 0:
            return ()
        if pod.gpu_milli >= GPU_MILLI:
            return whole_gpus(pod.num_gpu, arrays, row)
        if pod.num_gpu > 1:
            return best_fit_gpus(pod, arrays, row)
        fm = self.model_for(arrays)
        sub = arrays.row_view(row)
        count, small = fm.counts_and_small(sub.gpu_free)
        before = fm.combine(sub.gpu_free.sum(axis=1), sub.cpu_free, sub.model_code, count, small)
        _, slots, delta = self.sharing_candidates(pod, sub, fm, count, small, before)
        scores = fgd_score(delta)
        # The highest (integer) score; ties to the lowest GPU index, as the paper's plugin does.
        best = min(range(len(slots)), key=lambda c: (-scores[c], slots[c]))
        return (int(slots[best]),)


def fgd_score(delta: FloatArray) -> FloatArray:
    """⌊100 × sigmoid(−Δfrag / 1000)⌋: the paper's integer score (0 where Δ is infinite).

    Growths within ~40 milli-GPU of each other tie, and ties go to the first node in order —
    which packs; ranking by the exact Δ spreads 1-GPU pods over empty nodes instead.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.floor(100.0 / (1.0 + np.exp(delta / 1000.0)))
    return np.asarray(np.where(np.isfinite(s), s, 0.0), dtype=np.float64)
