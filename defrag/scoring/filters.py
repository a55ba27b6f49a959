"""Filters: which nodes can take a pod, and why the others cannot (docs/concepts.md).

``feasible_mask`` answers for every node at once; ``filter_reasons`` gives the per-node reasons
(used to explain a placement and to count why a pod is unschedulable).
"""

from __future__ import annotations

import numpy as np

from defrag.model.arrays import BoolArray, NodeArrays
from defrag.model.resources import Pod, Taint
from defrag.model.units import GPU_MILLI

# Reason texts, named once so callers and tests can match them.
R_EXCLUDED = "node excluded (draining or reserved)"
R_UNSCHEDULABLE = "node unschedulable (cordoned)"
R_SELECTOR = "node selector or affinity does not match"
R_TAINT = "untolerated taint"
R_CPU = "insufficient cpu"
R_MEMORY = "insufficient memory"
R_MODEL = "gpu model not allowed"
R_GPU_MEMORY = "insufficient gpu memory"
R_GPU = "insufficient gpu"
R_POOL = "insufficient gpu units of the requested resource (MIG profile or shared GPU)"
R_TOPOLOGY = "nvlink topology: no set of free GPUs sharing an NVLink domain"


def gpu_fit(pod: Pod, arrays: NodeArrays) -> tuple[BoolArray, BoolArray]:
    """(enough GPUs, topology satisfied) for every node; both True for CPU-only pods.

    Rows where the pod draws from a GPU pool (MIG profiles, time-sliced replicas) need enough
    free units there; NVLink does not apply to them.
    """
    n = len(arrays)
    pooled = arrays.pool_rows(pod)
    if pod.num_gpu == 0 and pooled is None:
        ones = np.ones(n, dtype=bool)
        return ones, ones
    if pod.gpu_milli < GPU_MILLI:
        if pod.num_gpu == 1:  # one GPU with the share free: the kept per-node maximum
            enough = arrays.share_max >= pod.gpu_milli
        else:
            enough = (arrays.gpu_free >= pod.gpu_milli).sum(axis=1) >= pod.num_gpu
        return enough, enough
    if pod.pool:
        enough = arrays.pool_free_for(pod) >= pod.pool_units
        return enough, enough
    enough = arrays.whole_count >= pod.num_gpu  # the kept count, read (no view)
    # One NVLink domain per node (the common NVSwitch case): any R free GPUs will do.
    topo = (
        enough if arrays.domain_size.shape[1] == 1 else enough & topology_fit(pod.num_gpu, arrays)
    )
    if pooled is not None:
        _, rows = pooled
        in_pool = arrays.pool_free_for(pod) >= pod.num_gpu
        enough = np.where(rows, in_pool, enough)
        topo = np.where(rows, in_pool, topo)
    return enough, topo


def topology_fit(r: int, arrays: NodeArrays) -> BoolArray:
    """NVLink rule: R ≤ largest domain → one domain holds R free GPUs; else enough free domains.

    Domain by domain over columns (a reduction along the short domain axis is slow)."""
    if arrays.domain_size.shape[1] == 1:
        # One domain per node (the common NVSwitch case): any R free GPUs will do.
        return np.asarray(arrays.free_whole_count() >= r)
    dom_free = arrays.domain_free()
    n = len(arrays)
    within = np.zeros(n, dtype=bool)
    spanning = np.zeros(n, dtype=np.int64)
    max_dom = np.zeros(n, dtype=np.int64)
    for d in range(arrays.domain_size.shape[1]):
        free, size = dom_free[:, d], arrays.domain_size[:, d]
        within |= free >= r
        spanning += np.where((free == size) & (size > 0), size, 0)
        np.maximum(max_dom, size, out=max_dom)
    return np.asarray(np.where(r <= max_dom, within, spanning >= r))


def taint_mask(pod: Pod, arrays: NodeArrays) -> BoolArray:
    ok = np.ones(len(arrays), dtype=bool)
    for row in arrays.tainted_rows:
        ok[row] = pod.tolerates_all(arrays.taints[row])
    return ok


UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "NoSchedule")
"""A cordon, as the scheduler's NodeUnschedulable filter reads it: a pod tolerating this taint
may still use the node (kube-scheduler pkg/scheduler/framework/plugins/nodeunschedulable)."""


def schedulable_mask(pod: Pod, arrays: NodeArrays) -> BoolArray:
    """[N] nodes not cordoned, or cordoned but the pod tolerates the cordon."""
    if pod.tolerations and any(t.tolerates(UNSCHEDULABLE_TAINT) for t in pod.tolerations):
        return np.ones(len(arrays), dtype=bool)
    return arrays.schedulable


def node_mask(pod: Pod, arrays: NodeArrays) -> BoolArray:
    """Nodes the pod may ever use, whatever is free: not cordoned, taints tolerated, the
    nodeSelector and required node affinity admitted (the planner's candidate filter)."""
    ok = schedulable_mask(pod, arrays).copy()
    if arrays.tainted_rows:
        ok &= taint_mask(pod, arrays)
    if pod.has_node_constraints:
        ok &= arrays.selector_mask(pod)
    return ok


def filter_masks(
    pod: Pod, arrays: NodeArrays, exclude: BoolArray | None = None
) -> list[tuple[str, BoolArray]]:
    """Each filter's pass mask, in the order reasons are reported."""
    enough, topo = gpu_fit(pod, arrays)
    masks: list[tuple[str, BoolArray]] = []
    if exclude is not None:
        masks.append((R_EXCLUDED, ~exclude))
    masks.append((R_UNSCHEDULABLE, schedulable_mask(pod, arrays)))
    if pod.has_node_constraints:
        masks.append((R_SELECTOR, arrays.selector_mask(pod)))
    if arrays.tainted_rows:
        masks.append((R_TAINT, taint_mask(pod, arrays)))
    masks.append((R_CPU, arrays.cpu_free >= pod.cpu_milli))
    masks.append((R_MEMORY, arrays.mem_free >= pod.memory_mib))
    if pod.pool:
        masks.append((R_POOL, enough))
    elif pod.num_gpu:
        if pod.gpu_models:
            masks.append((R_MODEL, arrays.model_allowed(pod)))
        if pod.gpu_memory_mib:
            masks.append((R_GPU_MEMORY, arrays.gpu_mem >= pod.gpu_memory_mib))
        masks.append((R_GPU, enough))
        masks.append((R_TOPOLOGY, topo | ~enough))
    return masks


def feasible_mask(pod: Pod, arrays: NodeArrays, exclude: BoolArray | None = None) -> BoolArray:
    """Nodes that pass every filter: the masks of :func:`filter_masks`, and-ed as they are
    computed (no list of masks; the GPU and topology filters as one mask, since a node meeting
    the topology has enough GPUs)."""
    ok = arrays.cpu_free >= pod.cpu_milli
    ok &= arrays.mem_free >= pod.memory_mib
    ok &= schedulable_mask(pod, arrays)
    if exclude is not None:
        ok &= ~exclude
    if pod.has_node_constraints:
        ok &= arrays.selector_mask(pod)
    if arrays.tainted_rows:
        ok &= taint_mask(pod, arrays)
    if pod.pool:
        ok &= gpu_fit(pod, arrays)[0]
    elif pod.num_gpu:
        if pod.gpu_models:
            ok &= arrays.model_allowed(pod)
        if pod.gpu_memory_mib:
            ok &= arrays.gpu_mem >= pod.gpu_memory_mib
        ok &= gpu_fit(pod, arrays)[1]
    return ok


def filter_reasons(
    pod: Pod, arrays: NodeArrays, exclude: BoolArray | None = None
) -> list[tuple[str, ...]]:
    """For every row, the reasons it is filtered out (empty = feasible)."""
    masks = filter_masks(pod, arrays, exclude)
    return [tuple(reason for reason, mask in masks if not mask[row]) for row in range(len(arrays))]
