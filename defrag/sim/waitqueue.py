"""The timeline's waiting pods, as numpy columns: a freed node is checked against all at once.

Queue order is kube-scheduler's active queue as the simulator models it: higher priority first,
then first come, first served (a sequence number taken at :meth:`WaitQueue.push`). Removed
entries are dropped from the columns (compacted) at the next :meth:`WaitQueue.may_fit` once they
outnumber the live ones, so the capacity prefilter scans the pods waiting now, not every pod
ever queued. Indices are valid from one :meth:`~WaitQueue.may_fit` to the next.

The queue also counts the distinct GPU asks (GPUs × share each) of its pods: a freed node on
which none of them fits is dismissed in plain Python, before any pass over the columns (on openb
the queue holds hundreds of 8-GPU pods, and almost every departure frees fewer GPUs than that).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from defrag.model.arrays import BoolArray, NodeArrays
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI

_COLUMNS = ("_cpu", "_mem", "_k", "_need", "_prio", "_seq", "_alive")


class WaitQueue:
    """Waiting pods with numpy columns, so one freed node is checked against all at once."""

    def __init__(self, models: tuple[str, ...]) -> None:
        self.models = models
        self.pods: list[Pod] = []
        cap = 256
        self._cpu = np.zeros(cap, np.int64)
        self._mem = np.zeros(cap, np.int64)
        self._k = np.zeros(cap, np.int64)
        self._need = np.zeros(cap, np.int64)
        """Free share each of a pod's GPUs needs (≥ 1 milli-GPU; 0 for a pod without GPUs)."""
        self._k_max = 8
        """The most GPUs any pod asked for (``may_fit`` looks its k-th free GPU up)."""
        self._prio = np.zeros(cap, np.int64)
        self._seq = np.zeros(cap, np.int64)
        self._model_ok = np.zeros((cap, len(models) + 1), bool)  # last column: node w/o GPU
        self._alive = np.zeros(cap, bool)
        self._pushed = 0
        self._asks: Counter[tuple[int, int]] = Counter()
        """(GPUs, share each) the waiting pods ask, with how many ask it."""
        self.count = 0
        """Pods waiting now."""

    def push(self, pod: Pod) -> None:
        i = len(self.pods)
        if i == len(self._alive):
            self._resize(2 * len(self._alive))
        self.pods.append(pod)
        self._cpu[i], self._mem[i] = pod.cpu_milli, pod.memory_mib
        self._k[i] = pod.num_gpu
        self._need[i] = max(pod.gpu_milli, 1) if pod.num_gpu else 0
        self._k_max = max(self._k_max, pod.num_gpu)
        self._prio[i] = pod.priority
        self._seq[i] = self._pushed
        self._pushed += 1
        if pod.num_gpu == 0:
            self._model_ok[i, :] = True
        else:
            self._model_ok[i, :-1] = [
                not pod.gpu_models or m in pod.gpu_models for m in self.models
            ]
            self._model_ok[i, -1] = False
        self._alive[i] = True
        self.count += 1
        self._asks[int(self._k[i]), int(self._need[i])] += 1

    def remove(self, i: int) -> None:
        self._alive[i] = False
        self.count -= 1
        ask = int(self._k[i]), int(self._need[i])
        self._asks[ask] -= 1
        if not self._asks[ask]:
            del self._asks[ask]

    def may_fit(self, arrays: NodeArrays, rows: set[int]) -> list[int]:
        """Waiting pods that may fit on one of ``rows`` by capacity alone, in queue order."""
        if not self.count or not rows:
            return []
        if len(self.pods) > 2 * self.count + 64:
            self._compact()
        # kth[j]: the j-th most free GPU's share on a row (kth[0]: any pod without GPUs
        # passes); a pod asking k GPUs of `need` each fits iff kth[k] >= need. Rows where no
        # waiting pod's (k, need) fits are skipped before any pass over the queue.
        kths: list[tuple[int, list[int]]] = []
        for row in sorted(rows):
            free = sorted(arrays.gpu_free[row, : int(arrays.gpu_total[row])].tolist(), reverse=True)
            kth = [GPU_MILLI, *free, *[0] * (self._k_max - len(free))]
            if any(kth[k] >= need for k, need in self._asks):
                kths.append((row, kth))
        if not kths:
            return []
        n = len(self.pods)
        k, need = self._k[:n], self._need[:n]
        ok: BoolArray | None = None
        for row, kth in kths:
            fits = np.array(kth, np.int64)[k] >= need
            fits &= self._cpu[:n] <= arrays.cpu_free[row]
            fits &= self._mem[:n] <= arrays.mem_free[row]
            fits &= self._model_ok[:n, int(arrays.model_code[row])]
            if ok is None:
                ok = fits
            else:
                ok |= fits
        assert ok is not None
        ok &= self._alive[:n]
        idx = np.flatnonzero(ok)
        if len(idx) < 2:
            return idx.tolist()
        return idx[np.lexsort((self._seq[idx], -self._prio[idx]))].tolist()

    def _compact(self) -> None:
        """Move the live entries to the front, in their order; drop the removed ones."""
        keep = np.flatnonzero(self._alive[: len(self.pods)])
        self.pods = [self.pods[int(i)] for i in keep]
        m = len(keep)
        for name in (*_COLUMNS, "_model_ok"):
            column = getattr(self, name)
            column[:m] = column[keep]
        self._alive[m:] = False

    def _resize(self, n: int) -> None:
        for name in _COLUMNS:
            old = getattr(self, name)
            new = np.zeros(n, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)
        ok = np.zeros((n, self._model_ok.shape[1]), bool)
        ok[: len(self._model_ok)] = self._model_ok
        self._model_ok = ok
