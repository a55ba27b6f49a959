"""Upper bounds on what any placement or migration can reach in the fill protocol.

Both bounds ignore node boundaries and CPU: the cluster is a pool of GPUs, a whole-GPU pod
takes ``num_gpu`` of them, and GPU-sharing pods are packed into the rest.

* :func:`packing_limit` — the *offline* limit of issue 4: every pod that arrived by 100%
  demand is known at once; place every whole-GPU pod, then pack the sharing pods into the
  remaining GPUs by the configuration LP of bin packing (relaxed: a pattern may be used a
  fractional number of times).
* :func:`online_limit` — the fill as it happens, with a perfect, free defragmenter: pods arrive
  in the protocol's order, and a pod is placed iff the pods already placed plus it can be
  packed into the pool by *some* re-pack (the scheduler places every pod that fits, and a
  migration hook only runs for a pod that fits nowhere; it never drops a pod). With
  ``packing="lp"`` "can be packed" is the LP relaxation (optimistic: every integral packing
  passes), with ``packing="ffd"`` it is first-fit decreasing (a re-pack one could carry out,
  node shapes aside). Each re-pack may move every running pod; nothing bounds the migrations.

The offline limit is at least the online one (whole GPUs moved from sharing pods to whole
pods lose at most what they held), and the online limit shows what order costs: sharing pods
that arrive before the cluster is full are placed even when they will waste part of a GPU
that a later whole-GPU pod would have filled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.optimize import linprog

from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.sim.fill import HEADLINE_PERCENT, bucket_curve

Packing = Literal["lp", "ffd"]
PACKINGS: tuple[Packing, ...] = ("lp", "ffd")


def pack_shares(sizes: Counter[int], gpus: float, tol: float = 1e-9) -> float:
    """The most milli-GPU of sharing pods (``sizes``: milli → count) that fits ``gpus`` GPUs,
    by the configuration LP solved with column generation (HiGHS master, knapsack pricing)."""
    if gpus <= 0 or not sizes:
        return 0.0
    kinds = sorted(sizes)
    counts = np.array([sizes[m] for m in kinds], dtype=np.float64)
    patterns: list[np.ndarray] = [np.eye(len(kinds), dtype=np.int64)[i] for i in range(len(kinds))]
    for _ in range(500):
        a = np.array(patterns, dtype=np.float64).T  # [kinds, patterns]
        value = np.array(kinds, dtype=np.float64) @ a
        a_ub = np.vstack([np.ones((1, a.shape[1])), a])
        b_ub = np.concatenate([[gpus], counts])
        res = linprog(-value, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"packing LP failed: {res.message}")
        duals = -np.asarray(res.ineqlin.marginals)
        y_gpu, y_kind = float(duals[0]), duals[1:]
        best, pattern = _price(kinds, counts, y_kind)
        if best - y_gpu <= tol:
            return float(-res.fun)
        patterns.append(pattern)
    raise RuntimeError("packing LP: column generation did not converge")


def _price(kinds: list[int], counts: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Bounded knapsack: the pattern (sizes summing ≤ 1000) with the most Σ (size − dual)."""
    unit = int(np.gcd.reduce(np.array([*kinds, GPU_MILLI])))
    cap = GPU_MILLI // unit
    best = np.zeros(cap + 1)
    take = np.zeros((cap + 1, len(kinds)), dtype=np.int64)
    for i, m in enumerate(kinds):
        gain = m - y[i]
        if gain <= 0:
            continue
        w = m // unit
        limit = int(min(counts[i], cap // w))
        for _ in range(limit):  # one more copy of item i at a time (0/1 knapsack per copy)
            for c in range(cap, w - 1, -1):
                if best[c - w] + gain > best[c] + 1e-12:
                    best[c] = best[c - w] + gain
                    take[c] = take[c - w]
                    take[c, i] += 1
    c = int(np.argmax(best))
    return float(best[c]), take[c].copy()


def ffd_pack(sizes: Iterable[int], gpus: int) -> np.ndarray | None:
    """First-fit decreasing of ``sizes`` (milli) into ``gpus`` GPUs: the free milli per GPU,
    or None when some size fits no GPU."""
    free = np.full(max(gpus, 0), GPU_MILLI, dtype=np.int64)
    for size in sorted(sizes, reverse=True):
        fits = np.flatnonzero(free >= size)
        if len(fits) == 0:
            return None
        free[fits[0]] -= size
    return free


def packing_limit(arrived: Sequence[Pod], capacity_gpus: int) -> float:
    """The offline limit as a % of the cluster's GPUs (allocated share / capacity)."""
    whole = min(sum(p.num_gpu for p in arrived if not p.is_sharing), capacity_gpus)
    shares = Counter(p.gpu_milli for p in arrived if p.is_sharing)
    packed = pack_shares(shares, capacity_gpus - whole)
    return 100.0 * (whole * GPU_MILLI + packed) / (capacity_gpus * GPU_MILLI)


@dataclass(frozen=True, slots=True)
class OnlineLimit:
    packing: Packing
    allocation_at_100: float
    """% of the cluster's GPUs allocated at 100% arrived demand (the fill's bucket mean)."""
    failed_at_100: int
    """Pods that no re-pack could fit, before the arrived demand passed 100%."""
    repacks: int
    """Arrivals that needed a re-pack of the placed pods to fit."""


class _Pool:
    """The GPUs of the cluster as one pool: whole GPUs taken, sharing pods and a packing of
    them (free milli per GPU not taken by whole pods), re-packed on demand."""

    def __init__(self, gpus: int, packing: Packing) -> None:
        self.gpus = gpus
        self.packing = packing
        self.whole = 0
        self.shares: list[int] = []
        self.free = np.full(gpus, GPU_MILLI, dtype=np.int64)  # a packing of ``shares``
        self.repacks = 0

    def place(self, pod: Pod) -> bool:
        if pod.is_sharing:
            return self._place_share(pod.gpu_milli)
        return self._place_whole(pod.num_gpu)

    def _place_share(self, size: int) -> bool:
        fits = np.flatnonzero(self.free >= size)
        if len(fits):  # best fit into the current packing
            self.free[fits[np.argmin(self.free[fits])]] -= size
            self.shares.append(size)
            return True
        return self._repack([*self.shares, size], self.gpus - self.whole)

    def _place_whole(self, k: int) -> bool:
        empty = np.flatnonzero(self.free == GPU_MILLI)
        if len(empty) >= k:
            self.free = np.delete(self.free, empty[:k])
            self.whole += k
            return True
        if self.gpus - self.whole - k < 0 or not self._repack(
            self.shares, self.gpus - self.whole - k
        ):
            return False
        self.whole += k
        return True

    def _repack(self, shares: list[int], gpus: int) -> bool:
        packed = ffd_pack(shares, gpus)
        if packed is None and self.packing == "lp":
            if pack_shares(Counter(shares), gpus) < sum(shares) - 1e-6:
                return False
            packed = np.zeros(gpus, dtype=np.int64)  # fits fractionally: no packing to keep
        if packed is None:
            return False
        self.shares = shares
        self.free = packed
        self.repacks += 1
        return True


def online_limit(
    arrivals: Sequence[Pod], capacity_gpus: int, packing: Packing = "lp"
) -> OnlineLimit:
    """The fill of ``arrivals`` (in order) with a perfect, free defragmenter; see the module."""
    if packing not in PACKINGS:
        raise ValueError(f"unknown packing {packing!r}; known: {', '.join(PACKINGS)}")
    capacity = capacity_gpus * GPU_MILLI
    pool = _Pool(capacity_gpus, packing)
    arrived = np.zeros(len(arrivals))
    allocated = np.zeros(len(arrivals))
    arrived_milli = allocated_milli = failed = 0
    for i, pod in enumerate(arrivals):
        arrived_milli += pod.gpu_demand_milli
        if pod.gpu_demand_milli:
            if pool.place(pod):
                allocated_milli += pod.gpu_demand_milli
            elif arrived_milli <= capacity:
                failed += 1
        arrived[i], allocated[i] = arrived_milli, allocated_milli
        if arrived_milli * 100 > capacity * (HEADLINE_PERCENT + 1):
            arrived, allocated = arrived[: i + 1], allocated[: i + 1]
            break
    zeros = np.zeros(len(arrived))
    curve = bucket_curve(arrived, allocated, zeros, zeros, capacity, HEADLINE_PERCENT)
    return OnlineLimit(packing, curve.at(HEADLINE_PERCENT)[0], failed, pool.repacks)


__all__ = [
    "PACKINGS",
    "OnlineLimit",
    "Packing",
    "ffd_pack",
    "online_limit",
    "pack_shares",
    "packing_limit",
]
