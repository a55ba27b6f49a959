"""The simulated cluster as the daemon sees a real one: the cluster-view port of the simulator.

The daemon reads a :class:`~defrag.model.cluster.Cluster` from the API server; the simulator
hands the same decision (:func:`defrag.decide.decide`) the state it simulates, shown as a
cluster would show it at the cycle's moment (simulated hour 0 is :data:`EPOCH`):

* a running pod is bound to its node and GPUs, created at its (re)start, bound then, and
  annotated ``defrag.io/last-checkpoint`` when it has checkpointed since (a pod that never
  checkpoints shows none; a serving pod's state is always fresh, so it shows ``now``);
* a pod that answers the checkpoint handshake in the run (``Job.answers_handshake``, set from
  the run's costs, :mod:`defrag.sim.migration`) shows ``defrag.io/checkpoint: supported``, as
  its workload would declare it, running or pending: the daemon prices its eviction at its
  restart (it is asked to checkpoint first); no other pod shows it (a run with the handshake
  off shows it on none). Its state is saved on request, so it also shows its last checkpoint
  at ``now``, as a serving pod does (unless the view shows no checkpoints);
* a pending pod is pending since it was (re-)queued;
* the trace's QoS classes carry the PriorityClass values :data:`QOS_CLASS_PRIORITY` (their
  order is the trace's; the shipped starvation rule's ``min_priority: 1000`` takes every class
  above best effort), and every pod the ``status.qosClass`` an API server computes for it
  (:data:`SHOWN_QOS`): the trace's ``LS`` is not a class a cluster can show, so the daemon
  prices a latency-sensitive pod as any other of its size, as it would on a cluster;
* every pod has a controlling owner that recreates it, as the simulator does: serving pods a
  ReplicaSet, the rest a Job (kinds that recreate their pods: the planner moves them).

A pod shown at an earlier cycle is shown by the same object while nothing it shows has
changed, so a cycle converts only the pods that started, moved or checkpointed since the last.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from defrag.model.cluster import Cluster
from defrag.model.resources import (
    CHECKPOINT_ANNOTATION,
    CHECKPOINT_SUPPORT_ANNOTATION,
    CHECKPOINT_SUPPORTED,
    OwnerRef,
    Pod,
)
from defrag.sim.kai import sim_owner_kind
from defrag.sim.migration import Job
from defrag.sim.state import Placed, SimState

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
"""Simulated hour 0 as a wall-clock time (a midnight, so cron windows and the day's
out-of-window budget fall as they would on a cluster)."""

QOS_CLASS_PRIORITY = {"LS": 2000, "Guaranteed": 1500, "Burstable": 1000, "BE": 0}
"""The PriorityClass value each trace QoS class is shown with: every class above best effort
at or above the shipped starvation rule's ``min_priority: 1000``, best effort below it."""

SHOWN_QOS = "Burstable"
"""The ``status.qosClass`` the API server computes for a trace pod (requests without equal
limits: Burstable, core/v1 ``PodQOSClass``)."""

_OWNERS = {
    "Deployment": ("ReplicaSet", "apps/v1"),
    "Job": ("Job", "batch/v1"),
}


def moment(hours: float) -> datetime:
    """Simulated hour ``hours`` as a wall-clock time."""
    return EPOCH + timedelta(hours=hours)


class ClusterView:
    """The cluster-view port: :meth:`cluster` shows a :class:`SimState` at a simulated hour."""

    def __init__(self, *, checkpoints: bool = True) -> None:
        self.checkpoints = checkpoints
        """False: no pod shows ``defrag.io/last-checkpoint`` (a cluster whose jobs do not say
        when they checkpoint; the planner prices each eviction by its restart alone)."""
        self._shown: dict[str, tuple[tuple[object, ...], Pod]] = {}
        self._stamped: dict[str, tuple[Pod, str, Pod]] = {}
        """Running pods shown with their last checkpoint: (the pod without it, the stamp, the
        pod with it)."""

    def cluster(self, state: SimState, now: float) -> Cluster:
        shown: dict[str, tuple[tuple[object, ...], Pod]] = {}
        stamped: dict[str, tuple[Pod, str, Pod]] = {}
        pods = [
            self._running(state, placed, now, shown, stamped) for placed in state.placed.values()
        ]
        pods += [self._pending(state, pod, shown) for pod in state.pending.values()]
        self._shown, self._stamped = shown, stamped
        return Cluster.build(state.nodes, pods)

    def _running(
        self,
        state: SimState,
        placed: Placed,
        now: float,
        shown: dict[str, tuple[tuple[object, ...], Pod]],
        stamped: dict[str, tuple[Pod, str, Pod]],
    ) -> Pod:
        pod = placed.pod
        job = state.jobs.get(pod.key)
        started = job.started if job is not None and job.started is not None else placed.since
        key = (pod, placed.row, placed.gpus, placed.since, started)
        base = self._show(pod.key, key, shown, lambda: self._bound(state, placed, started))
        if not self.checkpoints or job is None or job.interval_h is None:
            return base
        last = job.last_checkpoint(now)
        if last is None:
            return base
        # A checkpointing pod shows its (re)start until its first checkpoint in this run: it
        # resumed from the state saved then; a serving pod (interval 0) shows ``now``.
        stamp = moment(max(last, started)).isoformat()
        hit = self._stamped.get(pod.key)
        if hit is not None and hit[0] is base and hit[1] == stamp:
            stamped[pod.key] = hit
            return hit[2]
        shown_pod = replace(base, annotations={**base.annotations, CHECKPOINT_ANNOTATION: stamp})
        stamped[pod.key] = (base, stamp, shown_pod)
        return shown_pod

    def _bound(self, state: SimState, placed: Placed, started: float) -> Pod:
        return replace(
            _as_cluster_shows(placed.pod, _answers(state.jobs.get(placed.pod.key))),
            node=state.nodes[placed.row].name,
            gpu_indices=placed.gpus,
            phase="Running",
            created_at=moment(started),
            scheduled_at=moment(placed.since),
        )

    def _pending(
        self, state: SimState, pod: Pod, shown: dict[str, tuple[tuple[object, ...], Pod]]
    ) -> Pod:
        job = state.jobs.get(pod.key)
        queued = job.queued_at if job is not None else None
        key = (pod, queued)

        def show() -> Pod:
            since = moment(queued) if queued is not None else pod.pending_since
            return replace(
                _as_cluster_shows(pod, _answers(job)), node=None, gpu_indices=(), phase="Pending",
                pending_since=since, created_at=since or pod.created_at,
            )  # fmt: skip

        return self._show(pod.key, key, shown, show)

    def _show(
        self,
        name: str,
        key: tuple[object, ...],
        shown: dict[str, tuple[tuple[object, ...], Pod]],
        build: Callable[[], Pod],
    ) -> Pod:
        hit = self._shown.get(name)
        if hit is not None and _same(hit[0], key):
            shown[name] = hit
            return hit[1]
        made = build()
        shown[name] = (key, made)
        return made


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """The same pod object in the same place and times (the pod by identity: cheap)."""
    return a[0] is b[0] and a[1:] == b[1:]


def _answers(job: Job | None) -> bool:
    return job is not None and job.answers_handshake


def _as_cluster_shows(pod: Pod, answers: bool = False) -> Pod:
    """The pod's priority as its class's value, its QoS class as a cluster computes it, a
    controlling owner that recreates it and, when it ``answers`` the checkpoint handshake, the
    annotation its workload declares that with."""
    priority = QOS_CLASS_PRIORITY.get(pod.qos, pod.priority)
    annotations = (
        {**pod.annotations, CHECKPOINT_SUPPORT_ANNOTATION: CHECKPOINT_SUPPORTED}
        if answers
        else pod.annotations
    )
    if pod.owner is not None:
        return replace(pod, priority=priority, qos=SHOWN_QOS, annotations=annotations)
    kind, api_version = _OWNERS[sim_owner_kind(pod)]
    owner = OwnerRef(kind, f"{pod.name}-owner", True, api_version)
    return replace(pod, priority=priority, qos=SHOWN_QOS, owner=owner, annotations=annotations)


__all__ = ["EPOCH", "QOS_CLASS_PRIORITY", "SHOWN_QOS", "ClusterView", "moment"]
