"""What a timeline run reports: :class:`TimelineRun` (allocation, goodput, GPU-hours lost,
pending time per job size and priority class) and the recorder that builds its wait statistics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI


@dataclass(frozen=True, slots=True)
class ClassStats:
    """Pending time of the pods of one class that arrived in the measured period (hours)."""

    name: str
    pods: int
    mean_wait_h: float
    p95_wait_h: float
    still_pending: int

    def to_dict(self) -> dict[str, object]:
        return {
            "pods": self.pods,
            "mean_wait_h": round(self.mean_wait_h, 4),
            "p95_wait_h": round(self.p95_wait_h, 4),
            "still_pending": self.still_pending,
        }


@dataclass(frozen=True, slots=True)
class TimelineSeries:
    time_h: tuple[float, ...]
    allocation: tuple[float, ...]
    """GPU allocation, % of the cluster's GPUs."""
    queue: tuple[int, ...]
    """Pods waiting."""


@dataclass(frozen=True, slots=True)
class TimelineRun:
    policy: str
    seed: int
    load: float
    arrivals: int
    migrations: int
    mean_allocation: float
    mean_queue: float
    by_gpus: tuple[ClassStats, ...]
    by_priority: tuple[ClassStats, ...]
    series: TimelineSeries
    seconds: float
    defrag: bool = False
    defragmenter: str = "none"
    """The defragmenter that ran (``none``, ``defrag``, ``descheduler-hnu``…)."""
    scheduler: str = ""
    """The score the scheduler ran with (the policy, or the one the defragmenter installs)."""
    evictions: int = 0
    """Every pod stopped by the defragmenter: migrations (with a new node) + re-queued."""
    max_evictions: int = 0
    """The most times one pod was evicted."""
    lost_work_gpu_hours: float = 0.0
    overhead_gpu_hours: float = 0.0
    goodput_pct: float = 0.0
    """Useful GPU-hours per capacity-hour, %: allocation less the GPU-hours lost to
    evictions (work since the last checkpoint + restart overhead) in the measured period."""
    gpu_wait_hours: float = 0.0
    """Σ pending time × GPUs asked, over the measured pods (GPU·h)."""
    offered_load_pct: float = 0.0
    """The realised offered load: GPU-hours of work alive in the measured period (as if
    nothing waited) per capacity-hour, %."""
    multi_waits: tuple[float, ...] = ()
    """Pending time of every measured pod asking ≥ 2 whole GPUs (for CDFs)."""
    cost: dict[str, object] = field(default_factory=dict, hash=False)

    @property
    def lost_gpu_hours(self) -> float:
        return self.lost_work_gpu_hours + self.overhead_gpu_hours

    @property
    def label(self) -> str:
        if self.defragmenter == "none":
            return f"{self.policy}+defrag" if self.defrag else self.policy
        return f"{self.policy}+{self.defragmenter}"

    def wait(self, cls: str) -> ClassStats | None:
        return next((c for c in (*self.by_gpus, *self.by_priority) if c.name == cls), None)

    def to_dict(self, *, series: bool = False) -> dict[str, object]:
        out: dict[str, object] = {
            "policy": self.policy,
            "defragmenter": self.defragmenter,
            "scheduler": self.scheduler or self.policy,
            "defrag": self.defrag,
            "seed": self.seed,
            "load": self.load,
            "offered_load_pct": round(self.offered_load_pct, 2),
            "arrivals": self.arrivals,
            "mean_allocation": round(self.mean_allocation, 3),
            "goodput_pct": round(self.goodput_pct, 3),
            "lost_gpu_hours": round(self.lost_gpu_hours, 2),
            "lost_work_gpu_hours": round(self.lost_work_gpu_hours, 2),
            "overhead_gpu_hours": round(self.overhead_gpu_hours, 2),
            "mean_queue": round(self.mean_queue, 2),
            "gpu_wait_hours": round(self.gpu_wait_hours, 1),
            "pending_by_gpus": {c.name: c.to_dict() for c in self.by_gpus},
            "pending_by_priority": {c.name: c.to_dict() for c in self.by_priority},
            "migrations": self.migrations,
            "evictions": self.evictions,
            "max_evictions_per_pod": self.max_evictions,
            "cost": self.cost,
            "seconds": round(self.seconds, 2),
        }
        if series:
            out["series"] = {
                "time_h": [round(t, 3) for t in self.series.time_h],
                "allocation": [round(a, 3) for a in self.series.allocation],
                "queue": list(self.series.queue),
            }
        return out


def gpu_class(pod: Pod) -> str:
    """``cpu``, ``share`` or the GPU count (``1``, ``2``, ``4``, ``8``…)."""
    if pod.num_gpu == 0:
        return "cpu"
    if pod.gpu_milli < GPU_MILLI:
        return "share"
    return str(pod.num_gpu)


def priority_class(pod: Pod) -> str:
    return pod.qos or str(pod.priority)


def is_multi(pod: Pod) -> bool:
    """Asks two or more whole GPUs (the ``multi`` class)."""
    return pod.num_gpu >= 2 and pod.gpu_milli >= GPU_MILLI


GPU_ORDER = ("cpu", "share", "1", "2", "4", "8", "multi")
"""The order of the ``pending_by_gpus`` classes (others after, by name)."""


@dataclass(slots=True)
class WaitRecorder:
    """The pending time of every measured pod, by GPU class and by priority class."""

    waits: dict[str, list[float]] = field(default_factory=dict)
    prio_waits: dict[str, list[float]] = field(default_factory=dict)
    unfinished: dict[str, int] = field(default_factory=dict)
    prio_unfinished: dict[str, int] = field(default_factory=dict)
    gpu_wait: float = 0.0
    multi: list[float] = field(default_factory=list)

    def record(self, pod: Pod, wait: float, pending: bool) -> None:
        """One measured pod's total pending time (first wait + every re-queue)."""
        classes = [gpu_class(pod)] + (["multi"] if is_multi(pod) else [])
        p = priority_class(pod)
        for g in classes:
            self.waits.setdefault(g, []).append(wait)
        self.prio_waits.setdefault(p, []).append(wait)
        self.gpu_wait += wait * pod.gpu_demand_milli / GPU_MILLI
        if is_multi(pod):
            self.multi.append(wait)
        if pending:
            for g in classes:
                self.unfinished[g] = self.unfinished.get(g, 0) + 1
            self.prio_unfinished[p] = self.prio_unfinished.get(p, 0) + 1

    def by_gpus(self) -> tuple[ClassStats, ...]:
        return class_stats(self.waits, self.unfinished, GPU_ORDER)

    def by_priority(self, order: Sequence[str]) -> tuple[ClassStats, ...]:
        return class_stats(self.prio_waits, self.prio_unfinished, order)


def class_stats(
    waits: dict[str, list[float]], unfinished: dict[str, int], order: Sequence[str]
) -> tuple[ClassStats, ...]:
    """One :class:`ClassStats` per class, in ``order`` (classes not in it after, by name)."""
    rank = {name: i for i, name in enumerate(order)}
    out = []
    for name in sorted(waits, key=lambda n: (rank.get(n, len(order)), n)):
        w = np.array(waits[name])
        out.append(
            ClassStats(
                name,
                len(w),
                float(w.mean()),
                float(np.percentile(w, 95)),
                unfinished.get(name, 0),
            )
        )
    return tuple(out)
