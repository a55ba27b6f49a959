"""The daemon's cluster from the store that list + watch keeps: one view, shared in kind with the
extender's (:mod:`defrag.adapters.kube_watch`), instead of listing every object each cycle.

:class:`WatchedCluster` is a :class:`~defrag.ports.ClusterSource`. The store converts each
object once per change (watch events; a relist on start and after 410 Gone); a snapshot builds
the cluster from the held conversions only when the store changed since the last build, and
otherwise answers the cluster it built last (frozen, so sharing it is safe).

It refuses to answer from a stale store: before every kind is listed, or once some kind's watch
has been down (no event, no bookmark and no successful watch or relist) for longer than
``max_staleness_s``, :meth:`WatchedCluster.snapshot` raises :class:`StaleCluster`, naming the
kinds and why; the cycle fails saying so and plans nothing on it. A watch that the server keeps
open but silent counts as down once it outlives its ``timeoutSeconds`` by the grace
(:class:`~defrag.adapters.kube_watch.KubeWatchSource`).

The executor reads it too, through :class:`WatchedOrListed`: the store is the API's history
up to a moment ago (each kind's events arrive in order, so what it shows did happen), and the
executor's polls — replacements scheduled, rooms taken, checkpoints written, every few seconds
while a drain lasts — cost one incremental build, not a list of the whole cluster each. A
store that lags only delays what the executor sees; the one verdict it could get wrong — no
replacement pending, when one was just created — the executor confirms on a list of the pods
bound to no node (:attr:`~defrag.execute.executor.Executor.confirm`). Where the store is refused
(:class:`StaleCluster`) the executor lists the API itself.
What must be exact when written is checked by the API, not by a read: the Eviction API applies
the disruption budgets, and an eviction whose answer was lost is settled by reading that pod.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import Counter

from defrag.adapters.kube import KubeError
from defrag.adapters.kube_watch import KubeWatchSource
from defrag.model.cluster import Cluster
from defrag.ports import ClusterSource


class StaleCluster(KubeError):
    """The watched store cannot be trusted now (not listed yet, or a watch down too long)."""


class WatchedCluster:
    """The daemon's :class:`~defrag.ports.ClusterSource` over a :class:`KubeWatchSource`."""

    def __init__(
        self,
        watch: KubeWatchSource,
        *,
        max_staleness_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watch = watch
        self.max_staleness_s = max_staleness_s
        self.clock = clock
        self.builds = 0
        """Clusters built (a snapshot of an unchanged store builds none)."""
        self._lock = threading.Lock()
        self._started = False
        self._last: tuple[int, Cluster] | None = None

    def start(self) -> None:
        """List every kind and start the watches (the first snapshot does it when not done)."""
        with self._lock:
            if not self._started:
                self.watch.start(lambda: None)
                self._started = True

    @property
    def started(self) -> bool:
        return self._started

    def stop(self) -> None:
        with self._lock:
            if self._started:
                self.watch.stop()
                self._started = False

    def snapshot(self) -> Cluster:
        """The cluster the store holds now; :class:`StaleCluster` when it cannot be trusted."""
        self.start()
        self.check()
        generation = self.watch.generation()
        last = self._last
        if last is not None and last[0] == generation:
            return last[1]
        cluster, built_at = self.watch.build()
        self.builds += 1
        self._last = (built_at, cluster)
        return cluster

    def check(self) -> None:
        """Raise :class:`StaleCluster` when the store is not listed, or a watch is down longer
        than ``max_staleness_s``."""
        health = self.watch.health()
        if not health.synced:
            why = "; ".join(health.reasons) or "the first list has not finished"
            raise StaleCluster(f"the watched cluster is not listed yet: {why}")
        if health.broken_since is None:
            return
        down = self.clock() - health.broken_since
        if down > self.max_staleness_s:
            raise StaleCluster(
                f"the watched cluster is stale: a watch has been down for {down:.1f} s "
                f"(more than {self.max_staleness_s:g} s): {'; '.join(health.reasons)}; "
                "not planning on it"
            )


EXECUTOR_READS = Counter(
    "defrag_executor_cluster_reads",
    "The executor's reads of the cluster while it drains, by what answered: the watched store, "
    "or a list of the API where the store is refused (not listed yet, or a watch down past its "
    "staleness bound).",
    ["source"],
)
for _source in ("store", "list"):
    EXECUTOR_READS.labels(source=_source)


class WatchedOrListed:
    """The executor's :class:`~defrag.ports.ClusterSource`: the watched store, and a list of the
    API (``lister``) only where the store is refused (not listed yet, or a watch down longer
    than its staleness bound: :class:`StaleCluster`). The first read starts the store.

    A store that lags shows only what did happen (each kind's events arrive in order), so every
    verdict the executor draws from a poll — a checkpoint written, a pod gone, a replacement
    bound, a pod Terminating — holds however late it comes; a lag only delays it. The one
    verdict a lagging store could get wrong, that no replacement is pending when one was just
    created, the executor confirms on a fresh list of the pods bound to no node
    (:attr:`~defrag.execute.executor.Executor.confirm`). So a dropped watch, or a relist after
    410 Gone, does not make the executor list the whole cluster: a read waits up to
    ``max_wait_s`` for every watch to be connected and every kind listed (a drop resumes from
    its last resourceVersion, usually within a second), then answers from the store either way.
    ``stored`` and ``listed`` count the answers from each (and
    ``defrag_executor_cluster_reads_total{source}``).
    """

    def __init__(
        self,
        watched: WatchedCluster,
        lister: ClusterSource,
        *,
        max_wait_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.watched = watched
        self.lister = lister
        self.max_wait_s = max_wait_s
        self.clock = clock
        self.sleep = sleep
        self.stored = 0
        self.listed = 0

    def snapshot(self) -> Cluster:
        # The first read starts the store (the daemon's reconcile at start reads here before
        # its first cycle would): one list of the cluster at start, not one more before it.
        self.watched.start()
        self._await_current()
        try:
            cluster = self.watched.snapshot()
        except StaleCluster:
            cluster = self.lister.snapshot()
            self.listed += 1
            EXECUTOR_READS.labels(source="list").inc()
            return cluster
        self.stored += 1
        EXECUTOR_READS.labels(source="store").inc()
        return cluster

    def _await_current(self) -> None:
        """Wait up to ``max_wait_s`` for every watch to be connected and every kind listed:
        the poll then sees what happened up to now, not up to the drop."""
        deadline = self.clock() + self.max_wait_s
        while not self.watched.watch.current():
            left = deadline - self.clock()
            if left <= 0:
                return
            self.sleep(min(WAIT_STEP_S, left))


WAIT_STEP_S = 0.05
"""How often a read waiting for the store to be current looks again."""
