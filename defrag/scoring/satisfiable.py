"""Could any node ever hold a pod: the scheduler's own filters, asked on the nodes emptied.

A pod no node could hold even with nothing on it (more GPUs than any node has, a GPU model or
node selector no node offers, more CPU or memory than any node's allocatable) is
*unsatisfiable*: no repack, make-room or preemption ever places it, so it is neither starving
for room nor a sign of fragmentation. The question is asked with :func:`feasible_mask` — the
filters :func:`~defrag.scoring.scheduler.schedule` applies — on
:meth:`~defrag.model.arrays.NodeArrays.emptied` nodes, so "fits now", "fits once room is made"
and "could ever fit" are one rule read on three states.
"""

from __future__ import annotations

from defrag.model.arrays import NodeArrays
from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.model.status import Status
from defrag.scoring.filters import feasible_mask
from defrag.scoring.scheduler import unschedulable


def empty_nodes(target: Cluster | NodeArrays) -> NodeArrays:
    """The nodes of ``target`` emptied (:meth:`NodeArrays.emptied`): build once per cluster and
    pass to :func:`satisfiable` for each pod."""
    arrays = target.arrays if isinstance(target, Cluster) else target
    return arrays.emptied()


def satisfiable(pod: Pod, empty: NodeArrays) -> Status:
    """Whether some node of ``empty`` (:func:`empty_nodes`) could hold ``pod``; when none could,
    why, in the scheduler's words, with the GPU count the largest node has when GPUs are what
    no node offers."""
    if feasible_mask(pod, empty).any():
        return Status.success()
    verdict = unschedulable(pod, empty)
    reasons = []
    largest = largest_gpu_node(empty)
    if pod.num_gpu > largest and not pod.pool:
        reasons.append(f"asks {pod.num_gpu} GPUs, the largest node has {largest}")
    reasons.append(f"even with every node empty, {verdict.summary}")
    return Status.fail(*reasons)


def largest_gpu_node(arrays: NodeArrays) -> int:
    """The most GPUs any one node has: the largest whole-GPU job some node could ever hold
    (NVLink rules allow any k ≤ a node's GPUs on an empty node)."""
    return int(arrays.gpu_total.max(initial=0))


__all__ = ["empty_nodes", "largest_gpu_node", "satisfiable"]
