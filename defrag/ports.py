"""The ports between the pure core and the outside world (docs/architecture.md).

Adapters implement these; ``cycle.py`` and ``execute.py`` depend only on them, so tests can
put an emulated API, a simulated cluster or a snapshot file behind the same calls.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from defrag.detect.findings import Finding
from defrag.model.cluster import Cluster
from defrag.model.status import Status


@dataclass(frozen=True, slots=True)
class Sample:
    """One series: its labels and (unix seconds, value) points."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...] = field(default=())

    @property
    def last(self) -> float | None:
        return self.points[-1][1] if self.points else None


@dataclass(frozen=True, slots=True)
class EvictionResult:
    """What the API said to one eviction. ``outcome``: evicted, blocked (429), gone, failed."""

    pod: str
    outcome: str
    reason: str = ""


class Clock(Protocol):
    def now(self) -> datetime: ...


class ClusterSource(Protocol):
    def snapshot(self) -> Cluster: ...


@dataclass(frozen=True, slots=True)
class WatchHealth:
    """How a watched source stands: ``synced`` once every kind was listed; ``broken_since``
    (``time.monotonic()``) while some kind's watch is down — what it holds is current as of then
    — with the ``reasons``; None while every watch is connected."""

    synced: bool
    broken_since: float | None = None
    reasons: tuple[str, ...] = ()


@runtime_checkable
class WatchedClusterSource(Protocol):
    """A :class:`ClusterSource` kept current by list + watch instead of relisting.

    ``start(on_change)`` lists, then watches on threads of its own and calls ``on_change`` after
    every change it applies; ``generation()`` counts the changes; ``build()`` makes the cluster
    of what it holds now, with the generation it reflects."""

    def snapshot(self) -> Cluster: ...

    def start(self, on_change: Callable[[], None]) -> None: ...

    def stop(self) -> None: ...

    def generation(self) -> int: ...

    def build(self) -> tuple[Cluster, int]: ...

    def health(self) -> WatchHealth: ...


class MetricsSource(Protocol):
    def instant(self, query: str, at: datetime | None = None) -> list[Sample]: ...

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Sample]: ...


@dataclass(frozen=True, slots=True)
class Query:
    """One question for a :class:`MetricsSource`: instant at ``at`` or, with ``start``, a range
    from ``start`` to ``at`` every ``step_s`` seconds."""

    query: str
    at: datetime
    start: datetime | None = None
    step_s: float = 0.0


@runtime_checkable
class ConcurrentMetricsSource(MetricsSource, Protocol):
    """A source that answers several queries at once (the server works on them together while
    the answers already back are decoded). Answers in the order asked; the first query of that
    order that failed raises."""

    def ask_all(self, queries: Sequence[Query]) -> list[list[Sample]]: ...


def ask(metrics: MetricsSource, query: Query) -> list[Sample]:
    """One :class:`Query` through the plain methods."""
    if query.start is None:
        return metrics.instant(query.query, query.at)
    return metrics.range(query.query, query.start, query.at, query.step_s)


class Actuator(Protocol):
    def evict(self, namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        """Evict one pod; ``uid``: only the pod with this UID (never a same-named replacement)."""
        ...

    def rehearse_eviction(self, namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        """Ask, changing nothing, whether evicting one pod would be allowed now: ``evicted``
        when it would be, ``blocked`` (with the reason) when its disruption budget refuses it.
        The executor asks before it taints a node, so a drain a PDB would stop never starts."""
        ...

    def taint_node(self, node: str, key: str, value: str, effect: str) -> None: ...

    def untaint_node(self, node: str, key: str) -> None: ...

    def annotate_node(self, node: str, annotations: Mapping[str, str | None]) -> None: ...

    def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        """Set annotations on one pod (None removes one): the checkpoint request."""
        ...

    def event(
        self, kind: str, namespace: str, name: str, reason: str, message: str, warning: bool = False
    ) -> None: ...


class SpendUnreadable(RuntimeError):
    """The recorded window spend could not be told: the record could not be read (``malformed``
    False: try again later) or is not a JSON object (``malformed`` True)."""

    def __init__(self, message: str, *, malformed: bool = False):
        super().__init__(message)
        self.malformed = malformed


@runtime_checkable
class SpendRecord(Protocol):
    """Where the eviction budget's spend of the window openings still open outlives the
    process: the leader's Lease (the Kubernetes adapter's LeaseElector), or memory (one
    process, tests).

    ``load`` returns what was last saved (``{"windows": {key: spend}}``, written by the
    executor's ``SpendBook``), None when nothing was, or raises :class:`SpendUnreadable`.
    ``save`` records it before the evictions it counts go out, and only while this replica
    leads: a failure (not the holder, the API refused) says why, and those evictions are
    refused."""

    def load(self) -> dict[str, object] | None: ...

    def save(self, spend: Mapping[str, object]) -> Status: ...


class AlertSink(Protocol):
    def sync(
        self, findings: Sequence[Finding], now: datetime, held_rules: Collection[str] = ()
    ) -> None:
        """Make the active alerts equal to ``findings``: fire new, refresh, resolve the rest —
        except the alerts of ``held_rules`` (rules not evaluated this cycle): those stay."""
        ...

    def take_over(self) -> None:
        """This replica has just become the leader: what it knew of the alerts is stale (the
        other leader fired, refreshed and resolved them meanwhile); the next ``sync`` starts
        from what the receiver holds, as after a restart."""
        ...
