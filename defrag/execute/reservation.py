"""Reservations: the room a make-room plan frees is kept for the pod it was freed for.

Before the first eviction from a node that a plan frees for a pending pod (a step with
``for_pod``), the executor annotates the node ``defrag.io/reserved-for: <namespace>/<pod>``
and ``defrag.io/reserved-at: <time>``; the scheduler extender then filters every other pod
from that node. The reservation is released once the pod is bound (there or elsewhere) or
gone, once it is older than the replacement timeout, when the room could not be made, and
on reconcile after a restart. Only reservations carrying ``reserved-at`` are defrag's: one
set by hand is left alone.

The seat before the move (after Koordinator's reservation-first migration, where a Reservation
holds the target's resources for the migrated pod before it is evicted): before a repack step
evicts a pod toward a planned ``target``, the executor reserves the target for the pod's
replacement — ``defrag.io/reserved-for: owner:<namespace>/<Kind>/<name>``, since the replacement's
name is not known before its controller creates it (several owners moving to one node are listed
comma-separated). Such a seat is released once a pod of each owner created since the seat is
bound (there or elsewhere), once it is older than the replacement timeout, when the move's
eviction did not go through, and on reconcile, exactly as a make-room reservation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from defrag.model.cluster import Cluster
from defrag.model.resources import (
    OWNER_HOLDER_PREFIX,
    RESERVED_FOR_ANNOTATION,
    Node,
    owner_holder,
    reservation_holders,
)
from defrag.model.utc import utc

RESERVED_AT_ANNOTATION = "defrag.io/reserved-at"
RESERVATION_ANNOTATIONS = (RESERVED_FOR_ANNOTATION, RESERVED_AT_ANNOTATION)


@dataclass(frozen=True, slots=True)
class Reservation:
    """``node`` is kept for ``pod`` (the ``defrag.io/reserved-for`` value: ``namespace/name``,
    or owner holders for a seat) since ``since``."""

    node: str
    pod: str
    since: datetime | None
    """None when the ``reserved-at`` annotation is unreadable: such a reservation is stale."""

    def annotations(self) -> dict[str, str | None]:
        return {
            RESERVED_FOR_ANNOTATION: self.pod,
            RESERVED_AT_ANNOTATION: self.since.isoformat() if self.since else None,
        }

    @property
    def owners(self) -> tuple[str, ...]:
        """The owner holders of a seat (none for a make-room reservation)."""
        return tuple(h for h in reservation_holders(self.pod) if h.startswith(OWNER_HOLDER_PREFIX))

    def verdict(self, cluster: Cluster, now: datetime, timeout: timedelta) -> str:
        """Why the reservation should go now, or "" while it still serves its pod."""
        if self.owners:
            return self._seat_verdict(cluster, now, timeout)
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

    def _seat_verdict(self, cluster: Cluster, now: datetime, timeout: timedelta) -> str:
        if self.since is None:
            return f"annotation {RESERVED_AT_ANNOTATION} unreadable"
        # creationTimestamp has whole seconds: a replacement made within the seat's second counts.
        since = utc(self.since).replace(microsecond=0)
        placed = {
            owner_holder(p.namespace, p.owner)
            for p in cluster.pods.values()
            if p.owner is not None
            and p.node is not None
            and not p.terminating
            and p.created_at is not None
            and utc(p.created_at) >= since
        }
        waiting = [h for h in self.owners if h not in placed]
        if not waiting:
            return f"the replacement of {', '.join(self.owners)} is bound"
        if utc(now) - utc(self.since) >= timeout:
            return (
                f"no replacement of {', '.join(waiting)} bound after {timeout.total_seconds():g} s"
            )
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
