"""The live cluster kept by list + watch, as kube-scheduler's own informers keep theirs.

:class:`KubeWatchSource` lists every kind :class:`~defrag.adapters.kube.KubeClusterSource`
lists (PriorityClasses, nodes, pods without the finished ones, PodDisruptionBudgets) page by
page (``limit``/``continue``; the next page is asked for on a thread of its own while the last
one is converted, as client-go's pager buffers pages), remembers each list's
``resourceVersion``, then watches each kind from it on a thread of its own
(``kubernetes.watch.Watch().stream(..., resource_version=, allow_watch_bookmarks=True,
timeout_seconds=)``) and applies ADDED / MODIFIED / DELETED to an in-memory store keyed by
``namespace/name``. Every event and BOOKMARK moves the kind's resourceVersion on; a watch the
server ends (``timeoutSeconds``) is resumed from it, a dropped connection too, after a backoff
(tenacity); only a 410 Gone — an ``ApiException`` with status 410, or an ERROR event whose
object is a Status with code 410, as the client surfaces it either way depending on its version
and ``timeout_seconds`` — lists that kind again.

Memory: the store keeps each object trimmed to the fields :mod:`~defrag.adapters.kube_convert`
reads (:data:`KEEP`; no ``managedFields``, images, env, volumes, status but the phase, QoS class
and conditions, no ``kubectl.kubernetes.io/last-applied-configuration``), encoded as compact
JSON (one ``bytes`` per object, :class:`Held`: a fraction of the parsed dicts' memory), and
beside it the object's conversion, made once per change, so a new cluster
(:meth:`KubeWatchSource.build`) is only :meth:`ClusterParts.build` over what is held. The events
are applied whole, never merged: a MODIFIED object replaces what was held; one whose trimmed JSON
is the held one but for its resourceVersion changes nothing else.
"""

from __future__ import annotations

import copy
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from tenacity import RetryCallState, Retrying, retry_if_exception_type

from defrag.adapters import jsonio
from defrag.adapters.deadline import Budget, current_budget, request_deadline, time_budget
from defrag.adapters.kube import (
    API_SECONDS,
    KubeClusterSource,
    KubeError,
    RetryPolicy,
    _Caller,
    _describe,
    count_transient,
    plural,
)
from defrag.adapters.kube_convert import Piece, convert, paused_gc
from defrag.adapters.store_build import AHEAD_LIMIT, Ahead, Built, StoreBuild
from defrag.model.cluster import Cluster, ModelError
from defrag.ports import WatchHealth

log = logging.getLogger(__name__)

Spec = Mapping[str, Any]
"""Which fields of an object to keep: key → True (the whole value) or a nested spec (applied to
the object there, or to each object of a list there)."""

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
"""Often the largest thing on an object, and read by nothing: dropped from annotations."""

_META: Spec = {
    "name": True,
    "namespace": True,
    "resourceVersion": True,
    "labels": True,
    "annotations": True,
}
_CONTAINER: Spec = {"resources": {"requests": True, "limits": True}, "restartPolicy": True}
KEEP: Mapping[str, Spec] = {
    "Node": {
        "metadata": _META,
        "spec": {"taints": True, "unschedulable": True},
        "status": {"allocatable": True, "capacity": True},
    },
    "Pod": {
        "metadata": {
            **_META,
            "uid": True,
            "creationTimestamp": True,
            "deletionTimestamp": True,  # a terminating pod is never a victim again (the daemon)
            "ownerReferences": {
                "apiVersion": True,
                "kind": True,
                "name": True,
                "uid": True,
                "controller": True,
            },
        },
        "spec": {
            "nodeName": True,
            "containers": _CONTAINER,
            "initContainers": _CONTAINER,
            "overhead": True,
            "resourceClaims": {"name": True},
            "priority": True,
            "priorityClassName": True,
            "nodeSelector": True,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": True}},
            "schedulingGates": True,
            "tolerations": True,
        },
        "status": {
            "phase": True,
            "qosClass": True,
            "conditions": {
                "type": True,
                "status": True,
                "reason": True,
                "lastTransitionTime": True,
            },
        },
    },
    "PodDisruptionBudget": {
        "metadata": _META,
        "spec": {"selector": True},
        "status": {"disruptionsAllowed": True},
    },
    "PriorityClass": {"metadata": _META, "value": True, "globalDefault": True},
}
"""What :mod:`~defrag.adapters.kube_convert` reads of each kind (and ``resourceVersion``)."""


Trimmer = Callable[[Mapping[str, Any]], dict[str, Any]]


def trimmer(spec: Spec) -> Trimmer:
    """``obj`` with only the fields ``spec`` names (a value of an unexpected type is kept as it
    is, so the conversion reports the same error it would on the whole object), made once per
    spec: the spec is walked when the trimmer is made, not for every object, and each nested
    spec is a function of its own (tests/test_watch_list.py checks it field for field against
    a plain recursive reading, ``tests/support/kube_trim.py``, on random objects)."""
    fields = tuple((key, None if keep is True else trimmer(keep)) for key, keep in spec.items())

    def trim_one(obj: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, sub in fields:
            if key not in obj:
                continue
            value = obj[key]
            if sub is None:
                out[key] = value
            elif isinstance(value, dict):
                out[key] = sub(value)
            elif isinstance(value, list):
                out[key] = [sub(v) if isinstance(v, dict) else v for v in value]
            else:
                out[key] = value
        return out

    if "metadata" not in spec:
        return trim_one

    def trim_top(obj: Mapping[str, Any]) -> dict[str, Any]:
        out = trim_one(obj)
        meta = out.get("metadata")
        if isinstance(meta, dict):
            annotations = meta.get("annotations")
            if isinstance(annotations, dict) and LAST_APPLIED in annotations:
                meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
        return out

    return trim_top


TRIMMERS: Mapping[str, Trimmer] = {kind: trimmer(spec) for kind, spec in KEEP.items()}
"""Each kind's :data:`KEEP` as a made :func:`trimmer`."""


SETTLE_FROM = 20_000
"""Objects listed or built from which :func:`settle` freezes (below, a collection is cheap)."""


def settle(objects: int) -> None:
    """Take every object alive now out of the cyclic garbage collector's sight (``gc.freeze``)
    after ``objects`` Kubernetes objects were listed or built, when they are that many.

    A list or a full build leaves millions of long-lived, acyclic objects (the store's trimmed
    JSON, the conversions, the cluster). The collector would walk all of them again at each
    full collection — seconds at 40,000 pods, in the middle of a cycle. Frozen, they are still
    freed by reference counting when replaced or deleted; only a reference cycle that was alive
    at the freeze and dies later is not reclaimed. Called after a list or a full build only
    (at start, after 410 Gone, after a change to the whole cluster), not per event, and only
    for a large cluster (:data:`SETTLE_FROM`).
    """
    if objects >= SETTLE_FROM:
        gc.freeze()


class Held(NamedTuple):
    """One object as the store holds it: its trimmed JSON without ``metadata.resourceVersion``
    (compact, keys sorted: one ``bytes`` object, a fraction of the memory of the parsed
    dicts), its resourceVersion, and its conversion."""

    body: bytes | dict[str, Any]
    """The encoded trimmed object; the object itself in the rare case JSON cannot encode it
    compactly (an integer past 64 bits, a key that is not a string)."""
    version: str
    piece: Piece

    def same_but_version(self, other: Held) -> bool:
        """The two trimmed objects are equal but for ``metadata.resourceVersion``."""
        return type(self.body) is type(other.body) and self.body == other.body

    def trimmed(self) -> dict[str, Any]:
        """The trimmed object, resourceVersion and all."""
        if isinstance(self.body, bytes):
            obj: dict[str, Any] = jsonio.loads(self.body)
        else:
            obj = copy.deepcopy(self.body)
        meta = obj.get("metadata")
        if self.version and isinstance(meta, dict):
            meta["resourceVersion"] = self.version
        return obj


def encode(kind: str, obj: Mapping[str, Any]) -> tuple[dict[str, Any], Held]:
    """``obj`` (a ``kind``) trimmed, and held without its conversion yet (an empty
    :class:`Piece`: :func:`hold` makes it). The conversion reads no resourceVersion."""
    trimmed = TRIMMERS[kind](obj)
    version = ""
    meta = trimmed.get("metadata")
    if isinstance(meta, dict) and "resourceVersion" in meta:
        version = str(meta.pop("resourceVersion") or "")  # trim made this dict: ours to change
    try:
        # Copied to its own size: orjson's bytes keep the capacity of its write buffer (4 kB
        # for a small object), several times the JSON.
        body: bytes | dict[str, Any] = bytes(
            memoryview(orjson.dumps(trimmed, option=orjson.OPT_SORT_KEYS))
        )
    except orjson.JSONEncodeError:
        body = trimmed
    return trimmed, Held(body, version, Piece())


def hold(kind: str, obj: Mapping[str, Any], key: str) -> Held:
    """``obj`` (a ``kind``, stored under ``key``) trimmed, encoded and converted."""
    trimmed, held = encode(kind, obj)
    return held._replace(piece=convert(kind, trimmed, f"{kind} {key}"))


class Expired(Exception):
    """The watch's resourceVersion is gone (410): the kind must be listed again."""


# A watch that ends cleanly before this share of its timeoutSeconds was ended by something
# other than the API server's timer (which ends it at timeoutSeconds, never before).
EARLY_END = 0.9


class _RawWatch(watch.Watch):
    """A watch that hands out the raw JSON of each event (``raw_object``): no typed model is
    built (the adapter reads raw JSON, as ``KubeClusterSource`` does)."""

    def get_return_type(self, func: Callable[..., Any]) -> None:
        return None


@dataclass(slots=True)
class _Kind:
    name: str
    lister: Callable[..., Any]
    kwargs: dict[str, Any]
    objects: dict[str, Held] = field(default_factory=dict)
    resource_version: str = ""
    listed: bool = False
    broken_since: float | None = None
    failures: int = 0  # in a row since the watch was last healthy (the backoff's exponent)
    reason: str = "not listed yet"
    watch: watch.Watch | None = None

    @property
    def plural(self) -> str:
        return plural(self.name)


@dataclass(slots=True)
class WatchStats:
    """Counts since start, for tests and logs."""

    lists: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    expired: int = 0
    retries: int = 0
    ended_early: int = 0
    unchanged: int = 0
    """MODIFIED events that changed nothing the store keeps but the resourceVersion."""


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    name, namespace = str(meta.get("name") or ""), meta.get("namespace")
    return f"{namespace}/{name}" if namespace else name


def _rv(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""


class KubeWatchSource:
    """:class:`defrag.ports.WatchedClusterSource` over the API (see the module doc).

    ``watch_timeout_s``: each watch request's ``timeoutSeconds`` (the server ends it; it is
    resumed from the last resourceVersion). A watch read that stays silent longer than that plus
    ``grace_s`` counts as a dead connection. Connection errors are retried with exponential
    backoff from ``backoff_s`` up to ``max_backoff_s``, forever (while the watch is down,
    :meth:`health` says since when).
    """

    def __init__(
        self,
        api: client.ApiClient,
        *,
        page_size: int = 500,
        retry: RetryPolicy | None = None,
        watch_timeout_s: int = 300,
        grace_s: float = 30.0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        skip_finished_pods: bool = True,
        read_ahead: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        lister = KubeClusterSource(
            api, page_size=page_size, retry=retry, skip_finished_pods=skip_finished_pods
        )
        self.page_size = page_size
        self.read_ahead = read_ahead
        self.call = _Caller(retry or RetryPolicy(), api)
        self.watch_timeout_s = watch_timeout_s
        self.grace_s = grace_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.stats = WatchStats()
        self._kinds = [_Kind(kind, fn, dict(kwargs)) for kind, fn, kwargs in lister.listings()]
        self._lock = threading.RLock()
        self._generation = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._on_change: Callable[[], None] | None = None
        self._said: set[str] = set()
        self._build_lock = threading.Lock()  # one build at a time: each reuses the last
        self._builder = StoreBuild()
        self._changes: dict[tuple[str, str], None] = {}
        """(kind, store key) of each object changed since the last build, for the next."""

    # --- the port --------------------------------------------------------------------------

    def start(self, on_change: Callable[[], None]) -> None:
        """List every kind now (a failure is retried by the watch threads), then watch each on
        a daemon thread of its own."""
        self._on_change = on_change
        self._stop.clear()
        try:
            self.sync()
        except (KubeError, ApiException, OSError) as exc:
            log.warning("first list failed, retrying in the background: %s", exc)
        for kind in self._kinds:
            thread = threading.Thread(
                target=self._run, args=(kind,), name=f"defrag-watch-{kind.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for kind in self._kinds:
            w = kind.watch
            if w is not None:
                w.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []

    def generation(self) -> int:
        return self._generation

    def health(self) -> WatchHealth:
        with self._lock:
            synced = all(k.listed or k.resource_version for k in self._kinds)
            broken = [k for k in self._kinds if k.broken_since is not None]
            if not broken:
                return WatchHealth(synced)
            since = min(k.broken_since for k in broken if k.broken_since is not None)
            reasons = tuple(f"watching {k.plural}: {k.reason}" for k in broken)
            return WatchHealth(synced, since, reasons)

    def current(self) -> bool:
        """Every kind listed (no relist after 410 Gone under way) and every watch connected:
        the store is the API's history up to the watch's own latency."""
        with self._lock:
            return all(k.listed and k.broken_since is None for k in self._kinds)

    def snapshot(self) -> Cluster:
        """The cluster held now; lists first when nothing was listed yet (not started)."""
        if not self._threads and not all(k.listed for k in self._kinds):
            self.sync()
        return self.build()[0]

    def build(self) -> tuple[Cluster, int]:
        """A Cluster from what is held, and the generation it reflects. Only what changed since
        the last build is done again (:class:`~defrag.adapters.store_build.StoreBuild`)."""
        with self._build_lock:
            with paused_gc():
                built, generation = self._build()
            cluster = built.cluster
            if built.dropped:
                log.info(
                    "left out %d pod(s) bound to nodes not (yet) seen: %s",
                    len(built.dropped),
                    ", ".join(built.dropped[:5]),
                )
            for warning in [w for w in cluster.warnings if w not in self._said]:
                log.warning("not modelled fully: %s", warning)
            self._said = set(cluster.warnings)
        return cluster, generation

    def pending(self) -> tuple[Ahead, int] | None:
        """The changes held beyond the last build, applied ahead of the next one
        (:meth:`StoreBuild.ahead <defrag.adapters.store_build.StoreBuild.ahead>`: the free
        resources that build will have), with the generation they bring it to; None when only
        a build can say, or one is under way (it is about to say)."""
        if not self._build_lock.acquire(blocking=False):
            return None
        try:
            with self._lock:
                if not self._builder.ready or len(self._changes) > AHEAD_LIMIT:
                    return None
                generation = self._generation
                by_kind = {k.name: k.objects for k in self._kinds}
                changed = {}
                for kind, key in self._changes:
                    entry = by_kind[kind].get(key)
                    changed[kind, key] = entry.piece if entry is not None else None
            ahead = self._builder.ahead(changed)
        finally:
            self._build_lock.release()
        return None if ahead is None else (ahead, generation)

    def _build(self) -> tuple[Built, int]:
        """From the objects changed since the last build when it can (``StoreBuild.update``),
        else from every object."""
        with self._lock:
            generation = self._generation
            changes, self._changes = self._changes, {}
            changed = None
            if self._builder.ready:
                by_kind = {k.name: k.objects for k in self._kinds}
                changed = {}
                for kind, key in changes:
                    entry = by_kind[kind].get(key)
                    changed[kind, key] = entry.piece if entry is not None else None
        built = None
        if changed is not None:
            try:
                built = self._builder.update(changed)
            except Exception:  # a full build is always right: never fail a cycle for this
                log.exception("building the cluster from the changes failed; building it whole")
        if built is not None:
            return built, generation
        with self._lock:
            generation = self._generation
            self._changes = {}
            kinds = [
                (k.name, {key: held.piece for key, held in k.objects.items()}) for k in self._kinds
            ]
        try:
            built = self._builder.full(kinds)
        except ModelError as exc:
            raise KubeError(f"inconsistent cluster state: {exc}") from exc
        settle(sum(len(pieces) for _kind, pieces in kinds))
        return built, generation

    # --- for tests and the benchmark ---------------------------------------------------------

    def objects(self, kind: str) -> dict[str, dict[str, Any]]:
        """The trimmed objects held of ``kind``, by ``namespace/name``."""
        with self._lock:
            of_kind = next(k for k in self._kinds if k.name == kind)
            return {key: held.trimmed() for key, held in of_kind.objects.items()}

    def resource_version(self, kind: str) -> str:
        with self._lock:
            return next(k for k in self._kinds if k.name == kind).resource_version

    # --- list --------------------------------------------------------------------------------

    def sync(self) -> None:
        """List every kind (the watch threads keep them current from there)."""
        for kind in self._kinds:
            self._list(kind)

    def _list(self, kind: _Kind) -> None:
        """Every object of ``kind``, page by page; an expired continue token starts again. An
        object whose resourceVersion is the one held keeps its conversion."""
        for _restart in range(3):
            try:
                objects, version = self._pages(kind)
            except ApiException as exc:
                if exc.status == 410:
                    log.info("listing %s: continue token expired, listing again", kind.plural)
                    continue
                raise KubeError(f"cannot list {kind.plural}: {_describe(exc)}") from None
            with self._lock:
                for key in kind.objects.keys() | objects.keys():
                    self._changes[kind.name, key] = None
                kind.objects = objects
                kind.resource_version = version
                kind.listed = True
                self._generation += 1
                self.stats.lists += 1
            self._healthy(kind)
            self._changed()
            return
        raise KubeError(f"cannot list {kind.plural}: the continue token kept expiring")

    def _pages(self, kind: _Kind) -> tuple[dict[str, Held], str]:
        with self._lock:
            held = dict(kind.objects)
        objects: dict[str, Held] = {}
        version = ""
        budget = current_budget()
        with paused_gc(), ThreadPoolExecutor(1, f"defrag-list-{kind.plural}") as ahead:
            page = self._page(kind, None)
            while True:
                meta = page.get("metadata") or {}
                token = meta.get("continue") or None
                # The next page is asked for while this one is converted: the server makes it
                # and the answer crosses the network meanwhile, as client-go's pager fetches
                # chunks in the background (kubernetes/client-go tools/pager/pager.go,
                # eachListChunkBuffered), here one page ahead.
                following = (
                    ahead.submit(self._page, kind, token, budget)
                    if token and self.read_ahead
                    else None
                )
                for item in page.get("items") or []:
                    key = _key(item)
                    old = held.get(key)
                    if old is not None and old.version == _rv(item) != "":
                        objects[key] = old
                    else:
                        objects[key] = hold(kind.name, item, key)
                version = str(meta.get("resourceVersion") or version)
                if not token:
                    settle(len(objects))  # before the collector is back: it would walk them
                    return objects, version
                del page
                page = following.result() if following else self._page(kind, token)

    def _page(self, kind: _Kind, token: str | None, budget: Budget | None = None) -> dict[str, Any]:
        """One page of ``kind`` after ``token``; ``budget``: the listing thread's time budget,
        when another thread asks for the page (it holds there too)."""
        if budget is not None and current_budget() is None:
            with time_budget(budget.remaining(), budget.what):
                return self._page(kind, token)

        def call() -> dict[str, Any]:
            args = dict(kind.kwargs, limit=self.page_size)
            if token:
                args["_continue"] = token
            response = kind.lister(
                **args, _preload_content=False, _request_timeout=self.call.timeout
            )
            data = jsonio.loads(response.data)
            if not isinstance(data, dict):
                raise KubeError("the API returned a list that is not a JSON object")
            return data

        return self.call(call)

    # --- watch -------------------------------------------------------------------------------

    def _run(self, kind: _Kind) -> None:
        """List (when needed) and watch ``kind`` until stopped; errors are retried with backoff."""
        retrying = Retrying(
            wait=lambda _state: self._backoff(kind),
            retry=retry_if_exception_type(Exception),
            stop=lambda _state: self._stop.is_set(),
            sleep=self._pause,
            before_sleep=lambda state: self._broken(kind, state),
            reraise=True,
        )
        while not self._stop.is_set():
            try:
                retrying(self._cycle, kind)
            except Exception:  # only when stopping: the retries never give up otherwise
                if not self._stop.is_set():
                    log.exception("watching %s stopped", kind.plural)
                return

    def _cycle(self, kind: _Kind) -> None:
        if not kind.listed:
            self._list(kind)
        if self._stop.is_set():
            return
        opened = self.clock()
        try:
            for event in self._events(kind):
                self._apply(kind, event)
                if self._stop.is_set():
                    return
        except ApiException as exc:
            if exc.status != 410:
                raise
            self._expired(kind, str(exc.reason or "410 Gone"))
            return
        except Expired as exc:
            self._expired(kind, str(exc))
            return
        self._healthy(kind)  # the server ended the watch (timeoutSeconds): resumed next
        lasted = self.clock() - opened
        if lasted < self.watch_timeout_s * EARLY_END:
            # Not the server's timeoutSeconds: something between (a proxy, a load balancer)
            # closed the stream cleanly. Harmless (resumed from the last resourceVersion), but
            # an operator should be able to see a watch that keeps being cut.
            with self._lock:
                self.stats.ended_early += 1
            log.info(
                "watching %s: the stream ended after %.1fs, before its timeoutSeconds %g; resuming",
                kind.plural,
                lasted,
                self.watch_timeout_s,
            )

    def _events(self, kind: _Kind) -> Iterator[dict[str, Any]]:
        w = _RawWatch()
        kind.watch = w

        def call(**kwargs: Any) -> Any:
            # A watch request is an API call too: the time to its answer and a transient
            # failure of it count where every other call's do (/metrics).
            started = time.monotonic()
            try:
                response = kind.lister(**kwargs)
            except Exception as exc:
                count_transient(exc)
                raise
            finally:
                API_SECONDS.observe(time.monotonic() - started)
            if 200 <= int(getattr(response, "status", 200)) < 300:
                self._healthy(kind)
            return response

        with self._lock:
            self.stats.watches += 1
            version = kind.resource_version
        # The server ends a watch at timeoutSeconds; one that outlives it by the grace (a
        # server that trickles, or holds the stream open) is cut: its socket is shut, and the
        # watch counts as broken and resumes from the last resourceVersion after a backoff.
        limit = self.watch_timeout_s + self.grace_s
        try:
            with request_deadline(limit) as deadline:
                try:
                    yield from w.stream(
                        call,
                        **kind.kwargs,
                        resource_version=version,
                        allow_watch_bookmarks=True,
                        timeout_seconds=self.watch_timeout_s,
                        _request_timeout=(self.call.policy.timeout_s, limit),
                    )
                except Exception:
                    if not deadline.expired:
                        raise
                if deadline.expired:
                    raise KubeError(
                        f"watching {kind.plural}: {self.call.server} did not end the watch "
                        f"within {limit:g} s (timeoutSeconds {self.watch_timeout_s:g} + "
                        f"{self.grace_s:g} s grace)"
                    )
        finally:
            kind.watch = None

    def _apply(self, kind: _Kind, event: dict[str, Any]) -> None:
        what = event.get("type")
        obj = event.get("raw_object", event.get("object"))
        if not isinstance(obj, dict):
            raise KubeError(f"watching {kind.plural}: an event without an object: {event!r:.200}")
        if what == "ERROR":
            code = obj.get("code")
            message = f"{obj.get('reason') or ''}: {obj.get('message') or ''}"
            if code == 410:
                raise Expired(message)
            raise KubeError(f"watching {kind.plural}: error event {code} {message}")
        version = _rv(obj)
        if what == "BOOKMARK":
            with self._lock:
                kind.resource_version = version or kind.resource_version
                self.stats.bookmarks += 1
            self._healthy(kind)
            return
        key = _key(obj)
        if what in ("ADDED", "MODIFIED"):
            trimmed, entry = encode(kind.name, obj)
            with self._lock:
                held = kind.objects.get(key)
            if held is not None and held.same_but_version(entry):
                # Nothing defrag reads changed (a node's heartbeat, a pod's IP): the version
                # moves on, the conversion and the cluster built from it stay.
                with self._lock:
                    kind.objects[key] = held._replace(version=entry.version)
                    kind.resource_version = version or kind.resource_version
                    self.stats.events += 1
                    self.stats.unchanged += 1
                self._healthy(kind)
                return
            entry = entry._replace(piece=convert(kind.name, trimmed, f"{kind.name} {key}"))
            with self._lock:
                kind.objects[key] = entry
                self._changes[kind.name, key] = None
        elif what == "DELETED":
            with self._lock:
                kind.objects.pop(key, None)
                self._changes[kind.name, key] = None
        else:
            log.warning("watching %s: unknown event type %r ignored", kind.plural, what)
            return
        with self._lock:
            kind.resource_version = version or kind.resource_version
            self._generation += 1
            self.stats.events += 1
        self._healthy(kind)
        self._changed()

    def _expired(self, kind: _Kind, reason: str) -> None:
        log.info("watching %s: resourceVersion expired (%s); listing again", kind.plural, reason)
        with self._lock:
            kind.listed = False
            self.stats.expired += 1

    # --- health ------------------------------------------------------------------------------

    def _healthy(self, kind: _Kind) -> None:
        with self._lock:
            kind.broken_since = None
            kind.reason = ""
            kind.failures = 0

    def _backoff(self, kind: _Kind) -> float:
        """Exponential in the failures since the watch was last healthy — not since the thread
        began: a watch that ran for minutes and then broke starts again at ``backoff_s``."""
        with self._lock:
            failures = kind.failures
            kind.failures += 1
        return float(min(self.max_backoff_s, self.backoff_s * 2.0**failures))

    def _broken(self, kind: _Kind, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        reason = _describe(exc) if exc is not None else "failed"
        with self._lock:
            if kind.broken_since is None:
                kind.broken_since = self.clock()
            kind.reason = reason
            self.stats.retries += 1
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("watching %s: %s; retrying in %.1fs", kind.plural, reason, wait)

    def _pause(self, seconds: float) -> None:
        """The backoff: cut short by :meth:`stop`."""
        self._stop.wait(seconds)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


__all__ = [
    "KEEP",
    "TRIMMERS",
    "Expired",
    "Held",
    "KubeWatchSource",
    "Piece",
    "WatchStats",
    "convert",
    "encode",
    "hold",
    "trimmer",
]
