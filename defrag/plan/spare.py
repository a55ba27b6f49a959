"""Which running jobs make-room spares, whatever the room would be worth.

A multi-GPU job (:func:`~defrag.plan.cost.workload_kind` ``training``: two or more whole GPUs)
that does not answer the checkpoint handshake (``defrag.io/checkpoint: supported``) is not
moved to make room for another multi-GPU pod of equal or lower priority. Such a move trades one
job's GPUs for another's of the same kind: the cluster gains at most the pending pod's start,
and pays the victim's restart on all its GPUs (8 GPUs × 10 min = 1.33 GPU·h for an 8-GPU pod,
:data:`~defrag.plan.cost.RESTART_HOURS`) plus every GPU's work since its last checkpoint —
which a job that cannot checkpoint on request loses in full. A job that answers the handshake
is asked to checkpoint first (the executor, ``defrag.execute.checkpoint``), so it loses its
restart alone and may still be moved; a pending pod of higher priority may still move any job
(the scheduler's own preemption would take it anyway, and make-room only moves it where it
re-fits at once).

The rule is ``PlanOptions.spare_jobs`` (the daemon's ``make_room_spares_jobs``), **off by
default**: measured in the simulator it loses more work than it saves, because the rooms it
refuses are made instead by moving several small pods whose lost work the worth check cannot
see (docs/benchmarks.md § "Sparing multi-GPU jobs, pricing unknown work").
"""

from __future__ import annotations

from defrag.model.resources import Pod
from defrag.model.status import Status
from defrag.plan import constraints as c
from defrag.plan.cost import workload_kind
from defrag.plan.room import VictimFilter

MULTI_GPU = "training"
"""The workload kind of a multi-GPU job (:func:`~defrag.plan.cost.workload_kind`)."""


def spared(victim: Pod, pod: Pod) -> Status:
    """Whether make-room must leave ``victim`` in place for ``pod`` (fail: spared, with why)."""
    if workload_kind(victim) != MULTI_GPU or workload_kind(pod) != MULTI_GPU:
        return Status.success()
    if victim.checkpoints_on_request or pod.priority > victim.priority:
        return Status.success()
    return Status.fail(
        f"{c.SPARED}: a {victim.num_gpu}-GPU job that does not answer the checkpoint handshake "
        f"is not moved for a {pod.num_gpu}-GPU pod of equal or lower priority "
        f"({pod.priority} ≤ {victim.priority}): it would lose its work since its last "
        "checkpoint and its restart on every GPU"
    )


def sparing(allowed: VictimFilter, pod: Pod) -> VictimFilter:
    """``allowed``, less the victims :func:`spared` keeps in place for ``pod``."""

    def check(victim: Pod) -> Status:
        status = allowed(victim)
        return spared(victim, pod) if status.ok else status

    return check


__all__ = ["MULTI_GPU", "spared", "sparing"]
