"""The extender's cluster state: one relisted snapshot with its scoring profile, kept fresh."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from defrag.model.cluster import Cluster
from defrag.model.resources import RESERVED_FOR_ANNOTATION
from defrag.ports import ClusterSource
from defrag.scoring.framework import Policy, Status
from defrag.scoring.profile import ProfileConfig, ScoringProfile

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One relisted cluster with what every request needs precomputed."""

    cluster: Cluster
    profile: ScoringProfile
    """Built once per relist from the configured :class:`ProfileConfig` and this cluster (its
    mix), as ``defrag place``, the planner and the daemon's cycle build theirs."""
    reserved_for: Mapping[str, str]
    """node name → the pod key its room is reserved for."""
    taken_at: float
    """``time.monotonic()`` when the relist finished."""

    @property
    def policy(self) -> Policy:
        """The profile's score function."""
        return self.profile.policy


def make_view(cluster: Cluster, config: ProfileConfig, taken_at: float) -> ClusterView:
    reserved = {
        node.name: node.annotations[RESERVED_FOR_ANNOTATION].strip()
        for node in cluster.nodes
        if node.annotations.get(RESERVED_FOR_ANNOTATION, "").strip()
    }
    return ClusterView(cluster, config.for_cluster(cluster), reserved, taken_at)


@dataclass(slots=True)
class ClusterCache:
    """The current :class:`ClusterView`, relisted from ``source`` every ``relist_interval_s``.

    A failed relist keeps the last good view (and counts the failure); readiness turns false
    once the view is older than ``max_staleness_s``.
    """

    source: ClusterSource
    config: ProfileConfig
    """The configured scoring profile; every relist builds its :class:`ScoringProfile`."""
    relist_interval_s: float = 10.0
    max_staleness_s: float = 120.0
    clock: Callable[[], float] = time.monotonic
    on_relist: Callable[[Status, float], None] | None = None
    _view: ClusterView | None = None
    _last_error: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def view(self) -> ClusterView | None:
        return self._view

    def refresh(self) -> Status:
        """Relist once. Never raises: a failure is a Status with the reason."""
        started = self.clock()
        try:
            cluster = self.source.snapshot()
            view = make_view(cluster, self.config, self.clock())
        except Exception as exc:  # a broken source must not kill the server; keep the last view
            self._last_error = f"relist failed: {type(exc).__name__}: {exc}"
            log.warning("%s", self._last_error)
            status = Status.fail(self._last_error)
        else:
            self._view = view
            self._last_error = ""
            status = Status.success()
        if self.on_relist is not None:
            self.on_relist(status, self.clock() - started)
        return status

    def readiness(self) -> Status:
        view = self._view
        if view is None:
            return Status.fail(self._last_error or "cluster state not loaded yet")
        age = self.clock() - view.taken_at
        if age > self.max_staleness_s:
            reason = f"cluster state is {age:.0f}s old (limit {self.max_staleness_s:.0f}s)"
            return Status.fail(reason, *([self._last_error] if self._last_error else []))
        return Status.success()

    def start(self) -> None:
        """Relist now, then every ``relist_interval_s`` on a daemon thread."""
        self.refresh()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="defrag-relist", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def nudge(self) -> None:
        """Relist now rather than at the next interval (a request named a node we do not know:
        it probably just joined)."""
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.relist_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            self.refresh()


class StateUnavailable(RuntimeError):
    """No cluster state to answer from (first relist not done, or failed)."""
