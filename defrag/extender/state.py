"""The extender's cluster state: the watched (or relisted) cluster view with its scoring profile.

Two ways to keep it, chosen by the source (``adapters/sources.py`` opens the live API as a
:class:`~defrag.ports.WatchedClusterSource` for the extender; snapshot files and the simulated
cluster are plain :class:`~defrag.ports.ClusterSource` objects):

- **watched** (the live API): the source applies watch events to its store; a builder thread
  makes a new :class:`ClusterView` when the store changes — at once after a quiet spell, then at
  most every ``min_interval_s`` and never sooner than the last build took (a burst of events is
  one build; the builder uses at most about half a core however busy the cluster). A request
  that arrives while the store holds changes the view lacks is answered **ahead** of the build
  when those changes are only a few pods coming, going or changing (kube-scheduler just bound
  the previous pod): from the last view with the free resources of the nodes those pods touch
  as the next build will make them (the source's ``pending()``, :meth:`StoreBuild.ahead
  <defrag.adapters.store_build.StoreBuild.ahead>`), so no build is in the request's path; the
  builder builds in the background as ever. Any other change (a node, a PriorityClass, many
  objects, a build under way) makes the request wait for the view that has it (the builder is
  hurried), up to ``fresh_wait_s``; after that it is answered from the last view. So a node
  freed by a drain is seen by the next scheduling attempt, and the answer's latency is
  bounded. A view after a change is carried from the last one (:func:`make_view`):
  the store rebuilds only the nodes the change touched, and what the change did not touch is
  kept; every ``scratch_interval_s`` one is made from scratch.
- **relisted** (snapshot files, the simulated cluster): :meth:`ClusterCache.refresh` every
  ``relist_interval_s``.

Readiness: the state is current while the watches are connected and the view has every change
the store holds (its age is 0 however long nothing changes); from the moment a watch breaks, or
a build fails, it ages, and past ``max_staleness_s`` the extender is not ready. A relisted view
ages from its relist.
"""

from __future__ import annotations

import logging
import math
import operator
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from itertools import compress
from typing import TYPE_CHECKING, Protocol

from defrag.extender.wire import ObjectArray, host_prefixes
from defrag.model.arrays import NodeArrays
from defrag.model.cluster import Cluster
from defrag.model.resources import RESERVED_FOR_ANNOTATION, Pod
from defrag.model.status import Status
from defrag.model.workload import Shape, WorkloadMix
from defrag.ports import ClusterSource, WatchedClusterSource
from defrag.scoring.framework import Policy
from defrag.scoring.profile import ProfileConfig, ScoringProfile

if TYPE_CHECKING:
    from defrag.adapters.store_build import Ahead

log = logging.getLogger(__name__)


MIX_POLICIES = frozenset({"fgd"})
"""The policies whose score reads the workload mix (``defrag/scoring/policies/__init__.py``
builds only ``fgd`` from it; tests/test_extender_incremental.py checks that every other policy
scores alike under any mix). For the others a view counts no pod shapes and its profile holds
the default mix: counting every pod's shape after each binding would cost a pass over all the
pods (tens of milliseconds at 200,000) for nothing the answers read."""


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
    """``time.monotonic()`` when the relist (or the build) finished."""
    generation: int = 0
    """The watched source's change count this view reflects (0 for a relisted source)."""
    hosts: ObjectArray | None = None
    """Each row's ``{"Host":"NAME","Score":`` for the prioritize answer (None: a name needs
    JSON escaping)."""
    shape_counts: Counter[Shape] = field(default_factory=Counter)
    """How many GPU pods (bound and pending) of each shape the cluster holds: the observed
    workload mix before its cut (``WorkloadMix.from_counts``), kept to move by the next change
    (empty when the policy reads no mix, :data:`MIX_POLICIES`)."""
    ahead: NodeArrays | None = None
    """A view answered ahead of its build (:func:`view_ahead`): the free resources with the
    store's pending pod changes applied (None: ``cluster``'s own). ``cluster`` is then the last
    build, whose pods and nodes lack those changes: the answers read only :attr:`arrays`."""

    @property
    def policy(self) -> Policy:
        """The profile's score function."""
        return self.profile.policy

    @property
    def arrays(self) -> NodeArrays:
        """The free resources and capacity the answers are worked out on."""
        return self.ahead if self.ahead is not None else self.cluster.arrays


def make_view(
    cluster: Cluster,
    config: ProfileConfig,
    taken_at: float,
    generation: int = 0,
    previous: ClusterView | None = None,
) -> ClusterView:
    """The view of ``cluster``. With ``previous`` (the view of an earlier cluster of the same
    store), what did not change is carried over instead of being derived again: the workload
    mix's shape counts are moved by the pods that came, went or changed; the reservations are
    read again only when a node changed; the hosts' answer prefixes are kept while the node
    names are. The view is the one ``make_view(cluster, config, …)`` makes from scratch
    (tests/test_extender_incremental.py checks it on random event sequences)."""
    if config.policy not in MIX_POLICIES:
        counts: Counter[Shape] = Counter()  # nothing reads the mix: none counted
    elif previous is not None:
        counts = _moved_counts(previous, cluster)
    else:
        counts = Counter(Shape.of(p) for p in cluster.pods.values() if p.num_gpu)
    if previous is not None and _same_nodes(previous.cluster, cluster):
        reserved = previous.reserved_for
    else:
        reserved = {
            node.name: node.annotations[RESERVED_FOR_ANNOTATION].strip()
            for node in cluster.nodes
            if node.annotations.get(RESERVED_FOR_ANNOTATION, "").strip()
        }
    names = cluster.arrays.names
    if previous is not None and previous.cluster.arrays.names == names:
        hosts = previous.hosts
    else:
        hosts = host_prefixes(names)
    mix = WorkloadMix.from_counts(counts) if counts else WorkloadMix.default()
    # A fresh profile for every view, as a build from scratch makes (a seeded policy starts
    # its sequence again); only its mix is carried.
    profile = config.with_mix(mix)
    return ClusterView(cluster, profile, reserved, taken_at, generation, hosts, counts)


def view_ahead(
    view: ClusterView, ahead: Ahead, generation: int, config: ProfileConfig, taken_at: float
) -> ClusterView:
    """``view`` with the store's pending pod changes applied (``ahead``, made from the build
    ``view`` was made of): it answers as the view of the next build will (nodes, reservations
    and host prefixes are the same: only pods changed), with a fresh profile as that view has,
    and the mix's shape counts moved by the pods that went and came."""
    counts: Counter[Shape] = Counter()
    if config.policy in MIX_POLICIES:
        counts = _shifted(view.shape_counts, ahead.went, ahead.came)
    mix = WorkloadMix.from_counts(counts) if counts else WorkloadMix.default()
    profile = config.with_mix(mix)
    return replace(
        view,
        profile=profile,
        taken_at=taken_at,
        generation=generation,
        shape_counts=counts,
        ahead=ahead.arrays,
    )


def _shifted(
    counts: Counter[Shape], went: tuple[Pod, ...], came: tuple[Pod, ...]
) -> Counter[Shape]:
    moved = Counter(counts)
    moved.subtract(Shape.of(p) for p in went if p.num_gpu)
    moved.update(Shape.of(p) for p in came if p.num_gpu)
    return +moved  # shapes no pod has any more are dropped


class PendingSource(Protocol):
    """A watched source that can say what its pending changes make of the last build's free
    resources (:meth:`KubeWatchSource.pending
    <defrag.adapters.kube_watch.KubeWatchSource.pending>`)."""

    def pending(self) -> tuple[Ahead, int] | None: ...


def _same_nodes(before: Cluster, after: Cluster) -> bool:
    """Whether ``after`` holds the very Node objects of ``before`` (a build that touched no
    node keeps them: the model is frozen)."""
    return len(before.nodes) == len(after.nodes) and all(
        map(operator.is_, before.nodes, after.nodes)
    )


def _moved_counts(previous: ClusterView, cluster: Cluster) -> Counter[Shape]:
    """The GPU pods' shape counts of ``cluster``, from ``previous``'s and the pods that differ
    (a pod whose object is the same is the same pod: the model is frozen)."""
    before, after = previous.cluster.pods, cluster.pods
    counts = Counter(previous.shape_counts)
    # The keys whose pod is not the previous object, found without a Python-level loop over
    # every pod (a binding changes one of thousands).
    differs = compress(after.keys(), map(operator.is_not, after.values(), map(before.get, after)))
    added = 0
    for key in differs:
        old, pod = before.get(key), after[key]
        if old is None:
            added += 1
        elif old.num_gpu:
            counts[Shape.of(old)] -= 1
        if pod.num_gpu:
            counts[Shape.of(pod)] += 1
    if len(before) > len(after) - added:  # some pods went
        for key in before.keys() - after.keys():
            old = before[key]
            if old.num_gpu:
                counts[Shape.of(old)] -= 1
    return +counts  # shapes no pod has any more are dropped


@dataclass(slots=True)
class ClusterCache:
    """The current :class:`ClusterView`: built from a watched source as it changes, or relisted
    from a plain source every ``relist_interval_s`` (see the module doc).

    A failed relist or build keeps the last good view (and counts the failure); readiness turns
    false once the state is older than ``max_staleness_s``.
    """

    source: ClusterSource
    config: ProfileConfig
    """The configured scoring profile; every relist or build makes its :class:`ScoringProfile`."""
    relist_interval_s: float = 10.0
    max_staleness_s: float = 120.0
    clock: Callable[[], float] = time.monotonic
    on_relist: Callable[[Status, float], None] | None = None
    min_interval_s: float = 0.1
    """Watched: builds at least this far apart (and at least as far as the last one took)."""
    fresh_wait_s: float = 1.0
    """Watched: how long a request waits for a view with the changes made before it came."""
    scratch_interval_s: float = 300.0
    """Watched: a view is made from scratch at least this often; the others carry over from
    the last view what a change did not touch (:func:`make_view`)."""
    _view: ClusterView | None = None
    _scratch_at: float = -math.inf
    _last_error: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)
    _hurry: threading.Event = field(default_factory=threading.Event)
    _built: threading.Condition = field(default_factory=threading.Condition)
    _build_lock: threading.Lock = field(default_factory=threading.Lock)
    _tried: int = -1
    """Watched: the source generation of the last build tried (done or failed)."""
    _current_at: float = -math.inf
    """When the view was last known to hold everything there was (``clock()``)."""
    _thread: threading.Thread | None = None
    _watched: bool | None = None
    """Whether the source is watched, asked once (a Protocol isinstance check is slow)."""
    _pending: Callable[[], tuple[Ahead, int] | None] | None = None
    """The source's ``pending`` (:class:`PendingSource`), looked up once; None: it has none."""
    _ahead_of: tuple[ClusterView, ClusterView] | None = None
    """The last view answered ahead (second) and the built view it was made from (first)."""
    _ahead_lock: threading.Lock = field(default_factory=threading.Lock)
    on_fresh: Callable[[str], None] | None = None
    """Watched: told how each request that wanted every change was answered: ``current``
    (the view had them), ``ahead`` (:meth:`ahead`) or ``waited`` (for a build, or until
    ``fresh_wait_s``)."""

    def __post_init__(self) -> None:
        self._pending = getattr(self.source, "pending", None)

    @property
    def watched(self) -> bool:
        if self._watched is None:
            self._watched = isinstance(self.source, WatchedClusterSource)
        return self._watched

    def view(self) -> ClusterView | None:
        """The view to answer from. Watched: when the source holds changes the view lacks, the
        view ahead of its build (:meth:`ahead`) where the changes allow, else wait (at most
        ``fresh_wait_s`` in all) for the build that has them."""
        view = self._view
        if view is None or not self.watched:
            return view
        source: WatchedClusterSource = self.source  # type: ignore[assignment]
        deadline = time.monotonic() + self.fresh_wait_s
        how = "current"
        while True:
            tried = self._tried  # read before the view: a build sets the view, then this
            view = self._view
            wanted = source.generation()
            if view is None or view.generation >= wanted:
                break
            ahead = self.ahead(view)
            if ahead is not None:
                view, how = ahead, "ahead" if how == "current" else how
                break
            how = "waited"
            with self._built:
                self._hurry.set()
                self._wake.set()
                while self._tried == tried:  # until a build is done: then ahead of it again
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._built.wait(left)
                if self._tried == tried or self._tried >= wanted:
                    view = self._view  # built (or failed) with every change there was, or late
                    break
        if self.on_fresh is not None:
            self.on_fresh(how)
        return view

    def ahead(self, view: ClusterView) -> ClusterView | None:
        """``view`` with the source's pending pod changes applied (:func:`view_ahead`), without
        waiting for their build; None when the source cannot say (a change to anything but
        pods, a build under way, ``view`` not its last build). The last one is kept: requests
        between two changes share it (and, as one built view would, its profile)."""
        pending = self._pending
        if pending is None:
            return None
        source: WatchedClusterSource = self.source  # type: ignore[assignment]
        with self._ahead_lock:
            last = self._ahead_of
            if last is not None and last[0] is view and last[1].generation >= source.generation():
                return last[1]
            got = pending()
            if got is None or got[0].base is not view.cluster:
                return None
            made = view_ahead(view, got[0], got[1], self.config, self.clock())
            self._ahead_of = (view, made)
            return made

    def latest(self) -> ClusterView | None:
        """The newest view there is without waiting: the last one built, or ahead of it where
        the source's pending changes allow (:meth:`ahead`)."""
        view = self._view
        if view is None or not self.watched:
            return view
        source: WatchedClusterSource = self.source  # type: ignore[assignment]
        if view.generation >= source.generation():
            return view
        return self.ahead(view) or view

    def refresh(self) -> Status:
        """Relist (or, watched, build) once. Never raises: a failure is a Status with the
        reason."""
        if self.watched:
            return self._build()
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
            self._current_at = view.taken_at
            self._last_error = ""
            status = Status.success()
        if self.on_relist is not None:
            self.on_relist(status, self.clock() - started)
        return status

    def _build(self) -> Status:
        source: WatchedClusterSource = self.source  # type: ignore[assignment]
        with self._build_lock:
            started = self.clock()
            health = source.health()
            generation = source.generation()
            try:
                if not health.synced:
                    raise RuntimeError("; ".join(health.reasons) or "not listed yet")
                cluster, generation = source.build()
                previous = self._view
                if started - self._scratch_at >= self.scratch_interval_s:
                    previous = None  # now and then from scratch: nothing carried for long
                view = make_view(cluster, self.config, self.clock(), generation, previous)
                if previous is None:
                    self._scratch_at = started
            except Exception as exc:  # keep the last view; readiness reports it as it ages
                self._last_error = f"building the cluster view failed: {type(exc).__name__}: {exc}"
                log.warning("%s", self._last_error)
                status = Status.fail(self._last_error)
            else:
                self._view = view
                self._last_error = ""
                status = Status.success()
                self._observe()
            with self._built:
                self._tried = max(self._tried, generation)
                self._built.notify_all()
        if self.on_relist is not None:
            self.on_relist(status, self.clock() - started)
        return status

    def _observe(self) -> None:
        """Watched: note the time when the view is known to hold everything there is."""
        source: WatchedClusterSource = self.source  # type: ignore[assignment]
        view = self._view
        if view is None:
            return
        health = source.health()
        if view.generation < source.generation():
            return
        if health.broken_since is None and health.synced:
            self._current_at = self.clock()
        elif health.broken_since is not None:
            self._current_at = max(self._current_at, health.broken_since)

    def state_age(self) -> float:
        """Seconds since the state was last known current (inf before the first view)."""
        if self._view is None:
            return math.inf
        if self.watched:
            self._observe()
        return self.clock() - self._current_at

    def readiness(self) -> Status:
        view = self._view
        health = self.source.health() if self.watched else None  # type: ignore[attr-defined]
        if view is None:
            reasons = [self._last_error or "cluster state not loaded yet"]
            return Status.fail(*reasons, *(health.reasons if health is not None else ()))
        age = self.state_age()
        if age > self.max_staleness_s:
            reason = f"cluster state is {age:.0f}s old (limit {self.max_staleness_s:.0f}s)"
            extra = [*(health.reasons if health is not None else ())]
            extra += [self._last_error] if self._last_error else []
            return Status.fail(reason, *extra)
        return Status.success()

    def start(self) -> None:
        """Relist now, then every ``relist_interval_s`` on a daemon thread; watched: start the
        source's watches, build now, then on every change."""
        self._stop.clear()
        if self.watched:
            source: WatchedClusterSource = self.source  # type: ignore[assignment]
            source.start(self._wake.set)
            self._build()
            target = self._build_loop
        else:
            self.refresh()
            target = self._loop
        self._thread = threading.Thread(target=target, name="defrag-relist", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._hurry.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.watched:
            self.source.stop()  # type: ignore[attr-defined]

    def nudge(self) -> None:
        """Relist now rather than at the next interval (a request named a node we do not know:
        it probably just joined). Watched: build now (its ADDED event may be in)."""
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.relist_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            self.refresh()

    def _build_loop(self) -> None:
        source: WatchedClusterSource = self.source  # type: ignore[assignment]
        last_start, last_took = -math.inf, 0.0
        while not self._stop.is_set():
            self._wake.wait(1.0)  # at least once a second: readiness follows the watches
            self._wake.clear()
            if self._stop.is_set():
                return
            view = self._view
            if view is not None and view.generation >= source.generation():
                self._observe()
                continue
            spacing = max(self.min_interval_s, last_took) - (time.monotonic() - last_start)
            if spacing > 0 and not self._hurry.is_set():
                self._hurry.wait(spacing)  # coalesce the burst, unless a request waits
            self._hurry.clear()
            if self._stop.is_set():
                return
            last_start = time.monotonic()
            self._build()
            last_took = time.monotonic() - last_start


class StateUnavailable(RuntimeError):
    """No cluster state to answer from (first relist not done, or failed)."""
