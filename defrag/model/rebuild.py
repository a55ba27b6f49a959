"""A cluster rebuilt from the previous one where only some nodes changed.

:meth:`Cluster.build <defrag.model.cluster.Cluster.build>` assigns GPU slots pod by pod over
the whole cluster; after a watch event only the nodes it touched need that. :func:`rebuilt`
makes the cluster :meth:`Cluster.build` would make from the same nodes and pods, but copies each
untouched node's free resources (one vectorised gather) and keeps its pods as the previous build
bound them; only the ``dirty`` nodes are reset and have their pods' slots assigned again, in the
same order a full build assigns them (the order of ``pods``). The model is frozen, so the
unchanged ``Node`` and ``Pod`` objects are shared with the previous cluster.

The caller vouches for what it says is clean: a node not in ``dirty`` is the previous build's
node (the same object), and the pods bound to it are the previous build's inputs, in the same
order. What this cannot do the same way (a new GPU, NVLink-domain or pool column; a pod that does
not fit its node, whose handling is the full build's) it declines with ``None``: the caller then
builds in full.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from types import MappingProxyType

import numpy as np

from defrag.model.arrays import NodeArrays
from defrag.model.cluster import Cluster, ModelError, PodDisruptionBudget
from defrag.model.cluster import _assign_gpus as assign_gpus
from defrag.model.resources import Node, Pod
from defrag.model.units import GPU_MILLI

HOLDING_PHASES = frozenset({"Pending", "Running", "Unknown"})
"""A bound pod in these phases holds its node's resources (as :meth:`Cluster.build` counts)."""


def rebuilt(
    previous: Cluster,
    nodes: Sequence[Node],
    pods: Sequence[tuple[str, Pod]],
    dirty: Set[str],
    pdbs: Iterable[PodDisruptionBudget],
    priority_classes: Mapping[str, int],
    warnings: Iterable[str],
) -> Cluster | None:
    """``Cluster.build(nodes, [pod for _key, pod in pods], pdbs, priority_classes,
    warnings=warnings)``, redoing only the ``dirty`` nodes; None where it cannot (see the module
    doc). ``nodes`` are sorted by name; ``pods`` pairs each pod with its ``Pod.key``."""
    arrays = _arrays(previous, nodes, dirty)
    if arrays is None:
        return None
    before = previous.pods
    index = arrays.index
    pod_map: dict[str, Pod] = {}
    bound: list[tuple[int, Pod]] = []
    try:
        for key, pod in pods:
            if key in pod_map:
                return None  # the full build names the duplicate
            node = pod.node
            if node is not None and pod.phase in HOLDING_PHASES:
                if node not in index:
                    return None  # the full build names the unknown node
                if node not in dirty:
                    kept = before.get(key)
                    if kept is None or kept.node != node:
                        return None  # not what the caller vouched for
                    pod = kept
                else:
                    pod = assign_gpus(arrays, pod)
                    row = index[node]
                    arrays.take_gpus(row, pod, pod.gpu_indices)
                    bound.append((row, pod))
            pod_map[key] = pod
    except ModelError:
        return None
    arrays.charge(bound)
    return Cluster(
        nodes=tuple(nodes),
        pods=MappingProxyType(pod_map),
        pdbs=tuple(pdbs),
        arrays=arrays,
        priority_classes=MappingProxyType(dict(priority_classes)),
        warnings=tuple(warnings),
    )


def _arrays(previous: Cluster, nodes: Sequence[Node], dirty: Set[str]) -> NodeArrays | None:
    """Fresh arrays for ``nodes``: the clean rows' free resources copied from ``previous``, the
    dirty rows empty (their pods are charged again)."""
    old = previous.arrays
    same_nodes = len(nodes) == len(previous.nodes) and all(
        a is b for a, b in zip(nodes, previous.nodes, strict=True)
    )
    if same_nodes:
        arrays = old.copy()
        rows = [old.index[name] for name in dirty if name in old.index]
        if rows:
            at = np.array(rows, dtype=np.int64)
            arrays.gpu_free[at] = np.where(old.gpu_exists[at], GPU_MILLI, 0)
            arrays.cpu_free[at] = old.cpu_total[at]
            arrays.mem_free[at] = old.mem_total[at]
            arrays.class_count[at] = 0
            arrays.pool_free[at] = old.pool_total[at]
        return arrays
    arrays = NodeArrays.from_nodes(nodes)
    if (
        arrays.gpu_free.shape[1] != old.gpu_free.shape[1]
        or arrays.domain_size.shape[1] != old.domain_size.shape[1]
        or arrays.pool_names != old.pool_names
    ):
        return None  # other columns: nothing to copy row for row
    new_rows, old_rows = [], []
    for row, name in enumerate(arrays.names):
        if name not in dirty:
            before = old.index.get(name)
            if before is None:
                return None  # a node the previous build lacked must be dirty
            new_rows.append(row)
            old_rows.append(before)
    new, was = np.array(new_rows, dtype=np.int64), np.array(old_rows, dtype=np.int64)
    arrays.gpu_free[new] = old.gpu_free[was]
    arrays.cpu_free[new] = old.cpu_free[was]
    arrays.mem_free[new] = old.mem_free[was]
    arrays.class_count[new] = old.class_count[was]
    arrays.pool_free[new] = old.pool_free[was]
    return arrays


__all__ = ["HOLDING_PHASES", "rebuilt"]
