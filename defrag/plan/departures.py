"""When the cluster would free a room by itself: the run time its running pods have left.

A running pod's remaining run time is not shown anywhere, but its age is, and the ages of the
pods running now say how long pods run: while pods arrive at a steady rate, the share of running
pods aged about ``t`` is proportional to the share of pods that run at least ``t`` (a renewal
process's age density is the survival function over the mean run time). So the expected run
time left to a pod aged ``a``, counted up to a horizon ``H``, is

    E[min(T − a, H) | T > a] = ∫ₐ^{a+H} S(t) dt / S(a)
                             = (F(a + H) − F(a)) / f(a)

with ``F`` the distribution of the running pods' ages and ``f`` its density, read from the
ages in a window ``bandwidth_h`` wide centred on ``a`` (starting at 0 for a younger pod).
Exponential run times give their mean whatever the age; heavy-tailed ones (the openb traces')
give more the older the pod, as they should.

Too few running pods to read a distribution from (fewer than :data:`MIN_PODS`): a pod is
expected to run as long again as it has run already (at least ``bandwidth_h``), capped at the
horizon — the heavy-tailed rule of thumb.

:meth:`Departures.room_wait` applies it to one node: the time until enough of its pods have
left, in the order they are expected to, for a pending pod to fit there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from defrag.model.arrays import FloatArray
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.model.utc import utc

MIN_PODS = 20
"""Running GPU pods needed to read run times from their ages (fewer: the rule of thumb)."""

DEFAULT_HORIZON_H = 24.0
DEFAULT_BANDWIDTH_H = 1.0


@dataclass(frozen=True, slots=True, eq=False)
class Departures:
    """The ages of the running GPU pods, sorted, and what they say about run times left."""

    ages_h: FloatArray = field(default_factory=lambda: np.zeros(0))
    horizon_h: float = DEFAULT_HORIZON_H
    """Waits are counted up to this (a room not freed within it counts as freed at it)."""
    bandwidth_h: float = DEFAULT_BANDWIDTH_H

    @classmethod
    def of(
        cls,
        pods: Iterable[Pod],
        now: datetime,
        horizon_h: float = DEFAULT_HORIZON_H,
        bandwidth_h: float = DEFAULT_BANDWIDTH_H,
    ) -> Departures:
        """From ``pods`` (the bound pods) at ``now``: their GPU pods not being deleted."""
        ages = [
            a
            for a in (age_h(p, now) for p in pods if p.num_gpu and not p.terminating)
            if a is not None
        ]
        return cls(np.sort(np.asarray(ages, dtype=np.float64)), horizon_h, bandwidth_h)

    def residual(self, age: float) -> float:
        """Expected hours left to a pod running ``age`` hours, counted up to the horizon."""
        h, w = self.horizon_h, self.bandwidth_h
        n = len(self.ages_h)
        if n < MIN_PODS:
            return float(min(max(age, w), h))
        lo = max(age - w / 2, 0.0)  # a window centred on the age where it can be
        f_lo, f_hi, f_a, f_ah = np.searchsorted(
            self.ages_h, (lo, lo + w, age, age + h), side="left"
        )
        density = (f_hi - f_lo) / w
        if density <= 0:  # nothing of this age runs: nothing says it ends soon
            return h
        return float(min((f_ah - f_a) / density, h))

    def room_wait(
        self,
        pod: Pod,
        free: np.ndarray,
        occupants: Iterable[tuple[Pod, tuple[int, ...]]],
        now: datetime,
    ) -> float:
        """Hours until ``pod`` fits on a node whose GPUs have ``free`` milli-GPU each (its
        existing slots), once its ``occupants`` (pod, GPU slots) leave in the order they are
        expected to; the horizon when they never free enough."""
        slots = np.array(free, dtype=np.int64)
        if fits(pod, slots):
            return 0.0
        leaving = sorted(
            (self.residual(age_h(p, now) or 0.0), p.gpu_milli if p.num_gpu else 0, gpus)
            for p, gpus in occupants
            if p.num_gpu
        )
        for wait, milli, gpus in leaving:
            if wait >= self.horizon_h:
                break
            for g in gpus:
                slots[g] = min(slots[g] + milli, GPU_MILLI)
            if fits(pod, slots):
                return wait
        return self.horizon_h


def fits(pod: Pod, free: np.ndarray) -> bool:
    """Whether ``pod``'s GPUs fit in slots with ``free`` milli-GPU each (whole GPUs wholly free,
    a share on one slot; NVLink domains, CPU and memory aside: a forecast, not a placement)."""
    if pod.num_gpu == 0:
        return True
    if pod.gpu_milli >= GPU_MILLI:
        return int((free >= GPU_MILLI).sum()) >= pod.num_gpu
    return bool((free >= pod.gpu_milli).any())


def age_h(pod: Pod, now: datetime) -> float | None:
    """Hours ``pod`` has run (since it was bound, else created); None when unknown."""
    since = pod.scheduled_at or pod.created_at
    if since is None:
        return None
    return max((utc(now) - utc(since)).total_seconds() / 3600.0, 0.0)


__all__ = ["DEFAULT_BANDWIDTH_H", "DEFAULT_HORIZON_H", "MIN_PODS", "Departures", "age_h", "fits"]
