"""The bound GPU pods in bind order, kept from snapshot to snapshot.

The spreading rule reads the placements of its window: the latest bound GPU pods by bind time.
Found by a walk over every pod, that is a large part of a later cycle at fleet scale, though
between two snapshots a few pods change (jobs ending and starting) while every other pod is the
same object. So the bound GPU pods are kept sorted by bind order (bind time, namespace, name)
with the count of those without a time, and brought up to the next cluster by the pods whose
object differs (a :class:`~defrag.model.resources.Pod` is frozen: the same object is the same
pod; a cluster is never changed in place, so the one kept is held and compared pod by pod).
Many changed pods: sorted from nothing. Either way the same list as a walk over every pod
(``tests/test_cycle_kept.py``).
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right, insort
from collections.abc import Mapping
from datetime import datetime

from defrag.model.carried import Carried
from defrag.model.cluster import Cluster, occupies
from defrag.model.podchanges import changed_keys
from defrag.model.resources import Pod

REBUILD_SHARE = 0.05
"""Past this share of the pods changed, the placements are sorted from nothing."""

Order = tuple[datetime, str, str]
"""A placement's bind order: bind time, namespace, name (unique: a pod's key)."""


def bind_time(pod: Pod) -> datetime | None:
    """When ``pod`` was bound: its ``PodScheduled`` time, else its creation."""
    return pod.scheduled_at or pod.created_at


def placed(pod: Pod) -> bool:
    """A placement the rule reads: a bound GPU (or GPU pool) pod holding its node."""
    return pod.node is not None and bool(pod.num_gpu or pod.pool_units) and occupies(pod)


class Placements:
    """The bound GPU pods of one cluster's pods, in bind order, and how many have no time."""

    def __init__(self, pods: Mapping[str, Pod]) -> None:
        self.pods = pods
        """The pods these are of (compared pod by pod, by identity)."""
        self.order: list[Order] = []
        self.undated = 0
        for p in pods.values():
            if placed(p):
                at = bind_time(p)
                if at is None:
                    self.undated += 1
                else:
                    self.order.append((at, p.namespace, p.name))
        self.order.sort()

    def latest(self, since: datetime, until: datetime, most: int) -> list[Pod]:
        """The latest ``most`` placements bound in [``since``, ``until``], in bind order."""
        start = bisect_left(self.order, since, key=_time)
        end = bisect_right(self.order, until, key=_time)
        return [
            self.pods[f"{ns}/{name}"] for _, ns, name in self.order[max(start, end - most) : end]
        ]

    def take(self, pod: Pod) -> None:
        if not placed(pod):
            return
        at = bind_time(pod)
        if at is None:
            self.undated -= 1
            return
        del self.order[bisect_left(self.order, (at, pod.namespace, pod.name))]

    def put(self, pod: Pod) -> None:
        if not placed(pod):
            return
        at = bind_time(pod)
        if at is None:
            self.undated += 1
            return
        insort(self.order, (at, pod.namespace, pod.name))


def _time(order: Order) -> datetime:
    return order[0]


def updated(last: Placements, pods: Mapping[str, Pod]) -> Placements | None:
    """``last`` brought up to ``pods`` in place, or None when many pods changed."""
    old = last.pods
    if pods is old:
        return last
    changed = changed_keys(old, pods, max(int(len(pods) * REBUILD_SHARE), 1))
    if changed is None:
        return None
    for key in changed:
        before, after = old.get(key), pods.get(key)
        if before is not None:
            last.take(before)
        if after is not None:
            last.put(after)
    last.pods = pods
    return last


_kept: Carried[Placements] = Carried()


def placements(cluster: Cluster) -> Placements:
    """The placements of ``cluster``: the kept ones brought up to it, else sorted from nothing
    (then kept). Read them under :func:`held`."""

    def step(last: Placements | None) -> Placements:
        found = updated(last, cluster.pods) if last is not None else None
        return found if found is not None else Placements(cluster.pods)

    return _kept.step(step)


def held() -> threading.RLock:
    """The lock under which :func:`placements` is asked and read."""
    return _kept.lock


__all__ = ["REBUILD_SHARE", "Placements", "bind_time", "held", "placed", "placements"]
