"""The cost of evicting a pod: the GPU time its restart and its lost work take, by priority.

    cost = (per_eviction + gpus_held × (restart_hours[kind] + hours_since_checkpoint))
           × (1 + max(priority, 0) / priority_scale)

``gpus_held`` counts GPU shares (a 300-milli pod holds 0.3 GPU). A restart costs the GPUs the
pod holds × its kind's restart overhead (:data:`RESTART_HOURS`, :func:`workload_kind`): an
8-GPU training pod's restart costs 8 × 10 min = 1.33 GPU·h, a 0.3-GPU share's 0.3 × 5 min =
0.025 GPU·h. The simulator charges an eviction the same overheads (``defrag.sim.migration``
reads this table), so the planner's price and the simulator's bill agree. ``per_eviction`` is
a fixed price added to every eviction (0 by default: the restart is priced by its GPU time).

``hours_since_checkpoint`` is the time since the RFC 3339 annotation
``defrag.io/last-checkpoint``, or since the pod was created when it has none (or an unreadable
one); it is 0 when the time is unknown.
A preemption (the pod waits instead of moving) costs ``preempt_factor`` times as much.

:meth:`CostModel.known` is the same price counting only the work the cluster *shows* will be
lost: since ``defrag.io/last-checkpoint``; a pod without the annotation counts its restart alone
(its lost work is unknown: a stateless server loses none, a batch job all since it started),
or, for a ``training`` or ``batch`` pod, up to ``unknown_hours`` since it started (0 by
default: docs/benchmarks.md measured no gain from it on the held-out seed).
Make-room weighs a room by it against the pod's wait (``PlanOptions.room_worth``).

A pod that answers the checkpoint handshake (``defrag.io/checkpoint: supported``: the executor
asks it to checkpoint before the eviction, docs/daemon.md) loses no work: both prices count the
stall of the requested checkpoint (:data:`CHECKPOINT_STALL_HOURS`) and its restart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType

import numpy as np

from defrag.model.arrays import FloatArray
from defrag.model.resources import CHECKPOINT_ANNOTATION, Pod
from defrag.model.units import GPU_MILLI
from defrag.model.utc import utc

RESTART_HOURS: Mapping[str, float] = MappingProxyType(
    {"training": 10 / 60, "serving": 3 / 60, "batch": 5 / 60, "cpu": 1 / 60}
)
"""Hours a pod of each kind holds its resources after a restart without making progress
(image pull mostly cached, model or dataset load, warm-up; docs/simulator.md, "Eviction
costs"). The one source of the planner's restart price and the simulator's restart overhead."""

KINDS = tuple(RESTART_HOURS)

CHECKPOINT_STALL_HOURS: Mapping[str, float] = MappingProxyType(
    {"training": 2 / 60, "batch": 1 / 60}
)
"""Hours a pod that answers the checkpoint handshake spends writing the requested checkpoint
before its eviction, GPUs held (a large model's weights and optimizer state; a smaller job's
state): assumptions within the executor's default wait (``execution.checkpoint_wait_s``, 120 s).
The one source of the planner's price and the simulator's stall (``defrag.sim.migration``)."""

STATELESS_KINDS = frozenset({"serving", "cpu"})
"""Kinds whose eviction loses no work beyond the restart when they show no checkpoint:
replicas of a service, pods without a GPU (no GPU time to lose). A ``training`` or ``batch``
pod without ``defrag.io/last-checkpoint`` is taken to lose everything since it started."""


def workload_kind(pod: Pod) -> str:
    """``training`` (two or more whole GPUs), ``serving`` (QoS class ``LS``), ``batch`` (any
    other GPU pod) or ``cpu`` (no GPU)."""
    if pod.num_gpu == 0:
        return "cpu"
    if pod.num_gpu >= 2 and pod.gpu_milli >= GPU_MILLI:
        return "training"
    return "serving" if pod.qos == "LS" else "batch"


@dataclass(frozen=True, slots=True)
class CostModel:
    per_eviction: float = 0.0
    """A fixed price added to every eviction, in GPU-hours (the restart itself is priced by
    ``restart_hours``)."""
    restart_hours: Mapping[str, float] = field(default_factory=lambda: RESTART_HOURS, hash=False)
    """Restart overhead per workload kind (:func:`workload_kind`), hours; × the GPUs held."""
    priority_scale: float = 1000.0
    """Priority that doubles the cost; priority classes in the thousands weigh more."""
    preempt_factor: float = 2.0
    """A pod that must wait costs this many times a pod that moves."""
    max_hours: float = 24.0 * 7
    """Work lost is capped (a pod without checkpoints does not weigh forever)."""
    unknown_hours: float = 0.0
    """:meth:`known`: the work a ``training`` or ``batch`` pod without a checkpoint
    annotation is taken to lose at most, hours since it started (its real loss is unknown)."""

    def eviction(self, pod: Pod, now: datetime | None) -> float:
        held = gpus_held(pod)
        weight = 1.0 + max(pod.priority, 0) / self.priority_scale
        hours = self.restart(pod) + self.hours_lost(pod, now)
        return round((self.per_eviction + held * hours) * weight, 6)

    def restart(self, pod: Pod) -> float:
        """The restart overhead of ``pod``'s kind, hours (0 for a kind the table lacks), and
        for a pod asked to checkpoint first the stall of that checkpoint."""
        kind = workload_kind(pod)
        stall = CHECKPOINT_STALL_HOURS.get(kind, 0.0) if pod.checkpoints_on_request else 0.0
        return self.restart_hours.get(kind, 0.0) + stall

    def known(self, pod: Pod, now: datetime | None) -> float:
        """The eviction's price with the work at risk: since the checkpoint annotation; without
        one, since the pod started for a kind that keeps state (``training``, ``batch``), none
        for a stateless kind (:data:`STATELESS_KINDS`)."""
        weight = 1.0 + max(pod.priority, 0) / self.priority_scale
        since = last_checkpoint(pod)
        cap = self.max_hours
        if since is None and workload_kind(pod) not in STATELESS_KINDS:
            since, cap = pod.created_at, min(self.unknown_hours, self.max_hours)
        hours = 0.0
        if now is not None and since is not None and not pod.checkpoints_on_request:
            hours = min(max((utc(now) - utc(since)).total_seconds() / 3600.0, 0.0), cap)
        return round((self.per_eviction + gpus_held(pod) * (self.restart(pod) + hours)) * weight, 6)

    def floors(self, pods: Sequence[Pod], now: datetime | None) -> FloatArray:
        """A lower bound of :meth:`eviction` for each pod, computed over all at once (a pod
        with a checkpoint annotation is counted as having lost no work)."""
        n = len(pods)
        priority = np.fromiter((p.priority for p in pods), dtype=np.float64, count=n)
        held = np.fromiter((p.gpu_demand_milli for p in pods), dtype=np.float64, count=n)
        restart = np.fromiter((self.restart(p) for p in pods), dtype=np.float64, count=n)
        hours = np.zeros(n)
        if now is not None:
            stamp = utc(now).timestamp()
            created = np.fromiter(
                (
                    utc(p.created_at).timestamp()
                    if p.created_at is not None
                    and CHECKPOINT_ANNOTATION not in p.annotations
                    and not p.checkpoints_on_request  # asked to checkpoint first: none lost
                    else stamp
                    for p in pods
                ),
                dtype=np.float64,
                count=n,
            )
            hours = np.clip((stamp - created) / 3600.0, 0.0, self.max_hours)
        weight = 1.0 + np.maximum(priority, 0) / self.priority_scale
        floor = (self.per_eviction + held / GPU_MILLI * (restart + hours)) * weight
        return np.asarray(floor - 1e-6, dtype=np.float64)  # eviction() rounds to 6 decimals

    def preemption(self, pod: Pod, now: datetime | None) -> float:
        return round(self.eviction(pod, now) * self.preempt_factor, 6)

    def hours_lost(self, pod: Pod, now: datetime | None) -> float:
        if now is None or pod.checkpoints_on_request:  # asked to checkpoint first: none lost
            return 0.0
        since = last_checkpoint(pod) or pod.created_at
        if since is None:
            return 0.0
        hours = (utc(now) - utc(since)).total_seconds() / 3600.0
        return min(max(hours, 0.0), self.max_hours)


DEFAULT_COST = CostModel()


def gpus_held(pod: Pod) -> float:
    return pod.gpu_demand_milli / GPU_MILLI


def last_checkpoint(pod: Pod) -> datetime | None:
    text = pod.annotations.get(CHECKPOINT_ANNOTATION)
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
