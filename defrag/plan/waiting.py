"""A snapshot's pending pods and its nodes emptied, found once for every part of a cycle.

The starvation rules (three in the shipped file), the fragmentation rule and the planner each
walk the snapshot's pods for the pending ones and empty every node to ask whether a pod could
ever fit: the same answers, from the same snapshot, in one cycle. Whether a pod could ever fit
is asked once per pod shape (:func:`~defrag.plan.shape.shape_of`: the filters read nothing
else). The last snapshot's are kept. A cluster is never changed
in place (every change makes a new one) and the kept one is held and compared by identity, so
the answers cannot be another cluster's.

The nodes emptied, and whether each shape could ever fit them, are kept further, from snapshot
to snapshot: emptied nodes read only what the nodes are (sizes, GPUs and their domains, models,
labels, taints, pools), none of what is free on them, and between two snapshots where only pods
changed those parts are the same objects (a snapshot's arrays are a copy of the last one's, its
free columns changed). So the last emptied nodes serve while every part they are made from is
the same object as theirs and, for the numpy ones, holds the same values.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from defrag.model.arrays import NodeArrays
from defrag.model.carried import Carried, KeptFor
from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.plan.shape import shape_of
from defrag.scoring.satisfiable import empty_nodes, satisfiable


class Waiting:
    """The pending pods of one cluster (``Cluster.pending_pods``, in its order) and its nodes
    emptied (:func:`~defrag.scoring.satisfiable.empty_nodes`), each found when first asked."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._pods: tuple[Pod, ...] | None = None
        self._kept: Emptied | None = None

    @property
    def pods(self) -> tuple[Pod, ...]:
        if self._pods is None:
            self._pods = tuple(self.cluster.pending_pods())
        return self._pods

    def empty(self) -> NodeArrays:
        return self._emptied().arrays

    def _emptied(self) -> Emptied:
        if self._kept is None:
            self._kept = emptied(self.cluster.arrays)
        return self._kept

    def fits_ever(self, pod: Pod) -> bool:
        """Whether some node emptied could hold ``pod`` (``satisfiable(pod, empty).ok``), asked
        once per shape. The answer reads no generator, so it holds whatever the policy."""
        known = self._emptied()
        shape = shape_of(pod)
        ever = known.ever.get(shape)
        if ever is None:
            ever = known.ever[shape] = satisfiable(pod, known.arrays).ok
        return ever


EMPTIED_FROM = (
    "names",
    "index",
    "gpu_total",
    "gpu_exists",
    "gpu_domain",
    "domain_size",
    "cpu_total",
    "mem_total",
    "gpu_mem",
    "model_code",
    "models",
    "taints",
    "class_count",
    "pool_names",
    "pool_index",
    "pool_total",
    "labels",
    "selector_cache",
)
"""The parts of :class:`~defrag.model.arrays.NodeArrays` its ``emptied`` reads (of
``class_count`` only its shape; the rest of what it makes is every resource free)."""


class Emptied:
    """Nodes emptied (:func:`~defrag.scoring.satisfiable.empty_nodes`), what they were made
    from, and each pod shape's answer to whether it could ever fit them."""

    def __init__(self, source: NodeArrays) -> None:
        self.parts = tuple(getattr(source, name) for name in EMPTIED_FROM)
        self.values = tuple(
            p.copy() if isinstance(p, np.ndarray) and name != "class_count" else None
            for name, p in zip(EMPTIED_FROM, self.parts, strict=True)
        )
        self.shape = source.class_count.shape
        self.arrays = empty_nodes(source)
        self.ever: dict[Hashable, bool] = {}

    def serves(self, source: NodeArrays) -> bool:
        """Whether ``source`` emptied is these nodes emptied: each part the same object, the
        numpy ones still with the values these were made from."""
        if source.class_count.shape != self.shape:
            return False
        for name, part, value in zip(EMPTIED_FROM, self.parts, self.values, strict=True):
            now = getattr(source, name)
            if now is not part and name != "class_count":  # its shape alone is read
                return False
            if value is not None and not np.array_equal(now, value):
                return False
        return True


_emptied: Carried[Emptied] = Carried()


def emptied(arrays: NodeArrays) -> Emptied:
    """The nodes of ``arrays`` emptied, with the shapes' answers: the kept ones when they
    serve (:meth:`Emptied.serves`), else made (then kept)."""
    return _emptied.step(
        lambda kept: kept if kept is not None and kept.serves(arrays) else Emptied(arrays)
    )


_kept: KeptFor[Waiting] = KeptFor()


def waiting(cluster: Cluster) -> Waiting:
    """The :class:`Waiting` of ``cluster``: the kept one when it is of the same object."""
    return _kept.get((cluster,), lambda: Waiting(cluster))


__all__ = ["EMPTIED_FROM", "Emptied", "Waiting", "emptied", "waiting"]
