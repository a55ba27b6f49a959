"""A snapshot's pending pods and its nodes emptied, found once for every part of a cycle.

The starvation rules (three in the shipped file), the fragmentation rule and the planner each
walk the snapshot's pods for the pending ones and empty every node to ask whether a pod could
ever fit: the same answers, from the same snapshot, in one cycle. Whether a pod could ever fit
is asked once per pod shape (:func:`~defrag.plan.shape.shape_of`: the filters read nothing
else). The last snapshot's are kept. A cluster is never changed
in place (every change makes a new one) and the kept one is held and compared by identity, so
the answers cannot be another cluster's.
"""

from __future__ import annotations

from collections.abc import Hashable

from defrag.model.arrays import NodeArrays
from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.plan.kept import KeptFor
from defrag.plan.shape import shape_of
from defrag.scoring.satisfiable import empty_nodes, satisfiable


class Waiting:
    """The pending pods of one cluster (``Cluster.pending_pods``, in its order) and its nodes
    emptied (:func:`~defrag.scoring.satisfiable.empty_nodes`), each found when first asked."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._pods: tuple[Pod, ...] | None = None
        self._empty: NodeArrays | None = None
        self._ever: dict[Hashable, bool] = {}

    @property
    def pods(self) -> tuple[Pod, ...]:
        if self._pods is None:
            self._pods = tuple(self.cluster.pending_pods())
        return self._pods

    def empty(self) -> NodeArrays:
        if self._empty is None:
            self._empty = empty_nodes(self.cluster)
        return self._empty

    def fits_ever(self, pod: Pod) -> bool:
        """Whether some node emptied could hold ``pod`` (``satisfiable(pod, empty).ok``), asked
        once per shape. The answer reads no generator, so it holds whatever the policy."""
        shape = shape_of(pod)
        ever = self._ever.get(shape)
        if ever is None:
            ever = self._ever[shape] = satisfiable(pod, self.empty()).ok
        return ever


_kept: KeptFor[Waiting] = KeptFor()


def waiting(cluster: Cluster) -> Waiting:
    """The :class:`Waiting` of ``cluster``: the kept one when it is of the same object."""
    return _kept.get((cluster,), lambda: Waiting(cluster))


__all__ = ["Waiting", "waiting"]
