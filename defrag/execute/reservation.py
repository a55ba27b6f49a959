"""Reservations: the room a make-room plan frees is kept for the pod it was freed for.

Before the first eviction from a node that a plan frees for a pending pod (a step with
``for_pod``), the executor annotates the node ``defrag.io/reserved-for: <namespace>/<pod>``
and ``defrag.io/reserved-at: <time>``; the scheduler extender then filters every other pod
from that node. The reservation is released once the pod is bound (there or elsewhere) or
gone, once it is older than the replacement timeout, when the room could not be made, and
on reconcile after a restart. Only reservations carrying ``reserved-at`` are defrag's: one
set by hand is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from defrag.model.cluster import Cluster
from defrag.model.resources import RESERVED_FOR_ANNOTATION, Node
from defrag.model.utc import utc

RESERVED_AT_ANNOTATION = "defrag.io/reserved-at"
RESERVATION_ANNOTATIONS = (RESERVED_FOR_ANNOTATION, RESERVED_AT_ANNOTATION)


@dataclass(frozen=True, slots=True)
class Reservation:
    """``node`` is kept for ``pod`` (``namespace/name``) since ``since``."""

    node: str
    pod: str
    since: datetime | None
    """None when the ``reserved-at`` annotation is unreadable: such a reservation is stale."""

    def annotations(self) -> dict[str, str | None]:
        return {
            RESERVED_FOR_ANNOTATION: self.pod,
            RESERVED_AT_ANNOTATION: self.since.isoformat() if self.since else None,
        }

    def verdict(self, cluster: Cluster, now: datetime, timeout: timedelta) -> str:
        """Why the reservation should go now, or "" while it still serves its pod."""
        pod = cluster.pods.get(self.pod)
        if pod is None:
            return f"{self.pod} is gone"
        if pod.node == self.node:
            return f"{self.pod} is bound to {self.node}"
        if pod.node:
            return f"{self.pod} was bound to {pod.node} instead"
        if self.since is None:
            return f"annotation {RESERVED_AT_ANNOTATION} unreadable"
        if utc(now) - utc(self.since) >= timeout:
            return f"{self.pod} still Pending after {timeout.total_seconds():g} s"
        return ""


def released() -> dict[str, str | None]:
    """The annotation patch that removes a reservation (None deletes a key)."""
    return dict.fromkeys(RESERVATION_ANNOTATIONS)


def read_reservation(node: Node) -> Reservation | None:
    """The reservation defrag set on ``node`` (``reserved-at`` present), or None."""
    notes = node.annotations
    if RESERVED_AT_ANNOTATION not in notes:
        return None
    try:
        since: datetime | None = datetime.fromisoformat(notes[RESERVED_AT_ANNOTATION])
    except ValueError:
        since = None
    return Reservation(node.name, notes.get(RESERVED_FOR_ANNOTATION, "").strip(), since)
