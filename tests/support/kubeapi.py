"""An emulated Kubernetes API server, at the HTTP level, so the real ``kubernetes`` client runs.

kmock (0.8) was considered: it is asyncio-only and has no list paging, no Eviction subresource
with PodDisruptionBudgets and no strategic-merge patch, so this is a small ThreadingHTTPServer.

It serves the real JSON of the endpoints defrag uses:

- list (``limit`` / ``continue`` paging, ``labelSelector``, ``fieldSelector``) and get of nodes,
  pods, poddisruptionbudgets (policy/v1), priorityclasses (scheduling.k8s.io/v1), events, leases;
- patch of any object (strategic-merge, merge and JSON patch; a ``metadata.resourceVersion`` in
  the patch is a precondition → 409), create, update (PUT, resourceVersion conflicts → 409),
  delete; ``dryRun=All`` validates and stores nothing;
- ``POST …/pods/{name}/eviction`` (policy/v1): 429 with the API server's Status body while a PDB
  selecting the pod has ``disruptionsAllowed`` 0, else the budget is decremented and the pod
  deleted (``on_eviction`` may then create a replacement, as a controller would). An Eviction's
  ``deleteOptions.preconditions.uid`` (meta/v1 ``Preconditions``) that is not the pod's UID is
  refused with 409 Conflict, the message as the storage layer writes it ("Precondition failed:
  UID in precondition: …, UID in object meta: …", apiserver ``checkPreconditions``);
- watch (``?watch=true``): newline-delimited ``{"type", "object"}`` events after a
  ``resourceVersion``, BOOKMARKs, ``timeoutSeconds``, field selectors, 410 Gone once that
  version has been compacted away (:meth:`KubeApi.compact`), dropped streams
  (:meth:`KubeApi.drop_watches`) — see :meth:`KubeApi.watch` for the upstream behaviour copied;
- a request log (method, path, query, body; verb/group/resource for RBAC checks) and injected
  faults (a status code and/or a delay for the next N matching requests; ``after=True``: the
  request is carried out first and its answer lost, as when a response times out);
- Event creation validated as the API server validates the namespaces of a core/v1 Event: one
  about a cluster-scoped object (a Node) only in ``default``, one about a pod only in the pod's
  namespace, else 422 ``involvedObject.namespace: Invalid value: …: does not match
  event.namespace``.

Use ``with KubeApi() as api:`` (or the ``kube_api`` fixture pattern) and ``api.client()`` for a
configured ``kubernetes.client.ApiClient``.
"""

from __future__ import annotations

import base64
import bisect
import copy
import json
import multiprocessing
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonpatch  # type: ignore[import-untyped]

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)


@dataclass(frozen=True, slots=True)
class ResourceType:
    resource: str
    kind: str
    group: str
    version: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = {
    r.resource: r
    for r in (
        ResourceType("nodes", "Node", "", "v1", False),
        ResourceType("pods", "Pod", "", "v1", True),
        ResourceType("events", "Event", "", "v1", True),
        ResourceType("poddisruptionbudgets", "PodDisruptionBudget", "policy", "v1", True),
        ResourceType("priorityclasses", "PriorityClass", "scheduling.k8s.io", "v1", False),
        ResourceType("leases", "Lease", "coordination.k8s.io", "v1", True),
        # The controllers defrag reads before it evicts a pod of theirs (adapters/kube_owners.py)
        ResourceType("replicasets", "ReplicaSet", "apps", "v1", True),
        ResourceType("statefulsets", "StatefulSet", "apps", "v1", True),
        ResourceType("replicationcontrollers", "ReplicationController", "", "v1", True),
        ResourceType("jobs", "Job", "batch", "v1", True),
        ResourceType("rayclusters", "RayCluster", "ray.io", "v1", True),
        ResourceType("pytorchjobs", "PyTorchJob", "kubeflow.org", "v1", True),
    )
}
KIND_TO_RESOURCE = {r.kind: r.resource for r in RESOURCES.values()}


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the server saw it, with its RBAC verb, API group and resource."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    content_type: str
    verb: str
    group: str
    resource: str
    """``pods``, or ``pods/eviction`` for a subresource."""
    namespace: str
    name: str
    status: int = 0

    @property
    def is_write(self) -> bool:
        return self.method not in ("GET", "HEAD")

    @property
    def dry_run(self) -> bool:
        return "All" in self.query.get("dryRun", []) or "All" in (
            (self.body or {}).get("deleteOptions", {}).get("dryRun", [])
            if isinstance(self.body, dict)
            else []
        )


@dataclass(slots=True)
class Fault:
    method: str
    path: re.Pattern[str]
    status: int
    times: int
    delay_s: float
    message: str
    after: bool = False
    dry_run: bool | None = None
    """None: any matching request; False: only those that change something; True: only dry
    runs (``?dryRun=All``)."""
    watch: bool | None = None
    """None: any matching request; True: only watches; False: every request but watches."""


@dataclass(slots=True)
class _Route:
    group: str
    version: str
    namespace: str
    resource: str
    name: str
    subresource: str


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> Obj:
        out: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            out["details"] = self.details
        return out


def _not_found(rt: ResourceType, name: str) -> ApiError:
    qualified = f"{rt.resource}.{rt.group}" if rt.group else rt.resource
    return ApiError(
        404,
        "NotFound",
        f'{qualified} "{name}" not found',
        {"name": name, "group": rt.group, "kind": rt.resource},
    )


def _conflict(rt: ResourceType, name: str) -> ApiError:
    qualified = f"{rt.resource}.{rt.group}" if rt.group else rt.resource
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        {"name": name, "group": rt.group, "kind": rt.resource},
    )


def now_rfc3339(micro: bool = False) -> str:
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ"
    return datetime.now(UTC).strftime(fmt)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch; also the strategic merge of the fields defrag patches (maps merge,
    lists such as ``spec.taints`` are replaced — they carry no patch merge key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # strategic-merge directives: not used by defrag
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _labels_match(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _field(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _fields_match(obj: Obj, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        k, v = re.split(r"!=|==|=", term, maxsplit=1)
        if (_field(obj, k.strip()) == v.strip()) == negate:
            return False
    return True


def _pdb_selects(pdb: Obj, pod: Obj) -> bool:
    if pdb["metadata"].get("namespace") != pod["metadata"].get("namespace"):
        return False
    selector = pdb.get("spec", {}).get("selector")
    if selector is None:
        return False
    labels = pod["metadata"].get("labels") or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        present = e["key"] in labels
        values = e.get("values") or []
        op = e["operator"]
        if (
            (op == "In" and (not present or labels[e["key"]] not in values))
            or (op == "NotIn" and present and labels[e["key"]] in values)
            or (op == "Exists" and not present)
            or (op == "DoesNotExist" and present)
        ):
            return False
    return True


def _validate_event(event: Obj) -> None:
    """core/v1 Event validation of the namespaces, as the API server does it for an Event
    without ``eventTime`` (kubernetes pkg/apis/core/validation/events.go,
    ``legacyValidateEvent``): about a cluster-scoped object (``involvedObject.namespace``
    empty) the Event must be in ``default``; about a namespaced object, in that object's
    namespace. Anything else is 422 Invalid, with the field cause the API server writes."""
    if event.get("eventTime"):
        return  # the events.k8s.io-style branch: defrag never sets eventTime
    namespace = str((event.get("metadata") or {}).get("namespace") or "")
    involved = str((event.get("involvedObject") or {}).get("namespace") or "")
    if (not involved and namespace in ("", "default")) or (involved and involved == namespace):
        return
    name = str(event["metadata"].get("name") or "")
    detail = f'Invalid value: "{involved}": does not match event.namespace'
    raise ApiError(
        422,
        "Invalid",
        f'Event "{name}" is invalid: involvedObject.namespace: {detail}',
        {
            "name": name,
            "kind": "Event",
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "message": detail,
                    "field": "involvedObject.namespace",
                }
            ],
        },
    )


class _Server(ThreadingHTTPServer):
    """A client that goes away mid-request (a killed process) is no error of the server's:
    no traceback on stderr for it; anything else is printed as usual."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class KubeApi:
    """The emulated API server. Thread-safe; start/stop it or use it as a context manager."""

    def __init__(self, objects: Iterable[Obj] = ()) -> None:
        self._lock = threading.RLock()
        self._store: dict[str, dict[Key, Obj]] = {r: {} for r in RESOURCES}
        self._raw: dict[str, dict[Key, bytes]] = {r: {} for r in RESOURCES}
        self._sorted: dict[str, list[Key] | None] = dict.fromkeys(RESOURCES)
        self._rv = 1000
        self._log: list[Request] = []
        self._faults: list[Fault] = []
        self.evicted: list[Key] = []
        self.arrived: list[tuple[str, str]] = []
        """(method, path) of every request as it arrives, before faults delay it."""
        self.on_eviction: Callable[[KubeApi, Obj], None] | None = None
        """Called (outside the lock) with each evicted pod, e.g. to create its replacement."""
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._changed = threading.Condition(self._lock)
        self._events: list[_Event] = []
        """The watch history, oldest first (trimmed to :attr:`history`)."""
        self._compacted = 0
        """Watches from a resourceVersion below this get 410 Gone (its events are gone)."""
        self._drops = 0
        self._ends = 0
        self._stopping = False
        self.history = 100_000
        """Events kept for watches; older ones are compacted away."""
        self.bookmark_interval_s = 1.0
        """BOOKMARK every this often on a watch that asked for them (the API server: ~1 min)."""
        self.load(objects)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> KubeApi:
        api = self

        class Handler(_Handler):
            emulator = api

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> KubeApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the emulated API server is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` pointed at this server (no urllib3 retries: tests
        see every failure; the adapter retries on its own)."""
        return client_for(self.url)

    # --- state for tests ---------------------------------------------------------------------

    def load(self, objects: Iterable[Obj]) -> None:
        for obj in objects:
            self.put(obj)

    def put(self, obj: Obj) -> Obj:
        """Store (create or replace) an object, as a controller would; returns the stored copy.

        A pod's controlling owner of a served kind that is not stored yet is stored too (the
        pod's controller exists, as in a real cluster): its name, namespace and the UID the
        pod's reference names, and the API's defaults (a Job's ``backoffLimit`` 6). A test
        that wants a ghost owner removes it afterwards."""
        rt = RESOURCES[KIND_TO_RESOURCE[obj["kind"]]]
        with self._lock:
            stored = self._stamp(rt, copy.deepcopy(obj), create=True)
            self._save(rt, stored)
            if rt.kind == "Pod":
                self._own(stored)
            return copy.deepcopy(stored)

    def _own(self, pod: Obj) -> None:
        meta = pod["metadata"]
        for ref in meta.get("ownerReferences") or []:
            resource = KIND_TO_RESOURCE.get(ref.get("kind", ""))
            if not ref.get("controller") or resource is None:
                continue
            owner_rt = RESOURCES[resource]
            key = (meta.get("namespace", ""), ref["name"])
            if not owner_rt.namespaced or key in self._store[resource]:
                continue
            owner: Obj = {
                "metadata": {"name": ref["name"], "namespace": key[0], "uid": ref.get("uid", "")},
                "spec": {"backoffLimit": 6} if owner_rt.kind == "Job" else {},
                "status": {},
            }
            if not owner["metadata"]["uid"]:
                del owner["metadata"]["uid"]
            self._save(owner_rt, self._stamp(owner_rt, owner, create=True))

    def get(self, kind: str, name: str, namespace: str = "") -> Obj | None:
        rt = RESOURCES[KIND_TO_RESOURCE[kind]]
        with self._lock:
            obj = self._store[rt.resource].get((namespace if rt.namespaced else "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def objects(self, kind: str) -> list[Obj]:
        rt = RESOURCES[KIND_TO_RESOURCE[kind]]
        with self._lock:
            return [copy.deepcopy(o) for _, o in sorted(self._store[rt.resource].items())]

    def remove(self, kind: str, name: str, namespace: str = "") -> None:
        rt = RESOURCES[KIND_TO_RESOURCE[kind]]
        with self._lock:
            self._delete(rt, (namespace if rt.namespaced else "", name))

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._log)

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.is_write]

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def compact(self) -> None:
        """Forget the watch history, as etcd compaction does: a watch from any resourceVersion
        before now gets 410 Gone (a fresh list is needed)."""
        with self._lock:
            self._events.clear()
            self._compacted = self._rv

    def drop_watches(self) -> None:
        """Cut every open watch stream mid-response (no end chunk), as a dying connection."""
        with self._lock:
            self._drops += 1
            self._changed.notify_all()

    def end_watches(self) -> None:
        """End every open watch stream now, cleanly (the end chunk), long before its
        ``timeoutSeconds``: as a proxy or load balancer that closes streams it holds."""
        with self._lock:
            self._ends += 1
            self._changed.notify_all()

    def fail(
        self,
        method: str,
        path: str,
        status: int = 503,
        times: int = 1,
        delay_s: float = 0.0,
        message: str = "injected fault",
        after: bool = False,
        dry_run: bool | None = None,
        watch: bool | None = None,
    ) -> None:
        """The next ``times`` requests matching ``method`` and the ``path`` regex (searched) wait
        ``delay_s`` and then fail with ``status`` (0 = answer normally after the delay);
        ``after``: the request is carried out, then its answer replaced by the failure;
        ``dry_run``: False matches only requests that are not dry runs (an eviction, not the
        executor's server-side rehearsal of it), True only dry runs, None both; ``watch``: True
        matches only watches, False every request but watches, None both."""
        with self._lock:
            self._faults.append(
                Fault(
                    method,
                    re.compile(path),
                    status,
                    times,
                    delay_s,
                    message,
                    after,
                    dry_run,
                    watch,
                )
            )

    # --- internals ---------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _stamp(self, rt: ResourceType, obj: Obj, create: bool) -> Obj:
        obj["kind"] = rt.kind
        obj["apiVersion"] = rt.api_version
        meta = obj.setdefault("metadata", {})
        if create:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now_rfc3339())
        meta["resourceVersion"] = self._next_rv()
        return obj

    def _save(self, rt: ResourceType, obj: Obj) -> None:
        meta = obj["metadata"]
        key = (meta.get("namespace", "") if rt.namespaced else "", meta["name"])
        previous = self._store[rt.resource].get(key)
        if previous is None:
            self._sorted[rt.resource] = None
        self._store[rt.resource][key] = obj
        self._raw[rt.resource].pop(key, None)
        kind = "ADDED" if previous is None else "MODIFIED"
        self._record(_Event(int(meta["resourceVersion"]), rt.resource, kind, obj, previous))

    def _delete(self, rt: ResourceType, key: Key) -> Obj | None:
        obj = self._store[rt.resource].pop(key, None)
        self._raw[rt.resource].pop(key, None)
        self._sorted[rt.resource] = None
        if obj is not None:
            # The deleted object's last state, at the resourceVersion of the deletion.
            gone = {**obj, "metadata": {**obj["metadata"], "resourceVersion": self._next_rv()}}
            self._record(_Event(self._rv, rt.resource, "DELETED", gone, None))
        return obj

    def _record(self, event: _Event) -> None:
        self._events.append(event)
        if len(self._events) > self.history:
            dropped = self._events[: len(self._events) - self.history]
            del self._events[: len(dropped)]
            self._compacted = max(self._compacted, dropped[-1].rv)
        self._changed.notify_all()

    # --- watch -------------------------------------------------------------------------------

    def _after(self, rv: int, resource: str) -> list[_Event]:
        """The kept events of ``resource`` after ``rv`` (the history is in rv order)."""
        first = bisect.bisect_right(self._events, rv, key=lambda e: e.rv)
        return [e for e in self._events[first:] if e.resource == resource]

    def watch(
        self,
        handler: BaseHTTPRequestHandler,
        path: str,
        query: dict[str, list[str]],
        cuts: tuple[int, int] | None = None,
    ) -> None:
        """Serve one watch request as the API server does. ``cuts``: the drop and end counts
        when the request was logged (a :meth:`drop_watches` after that cuts this watch too,
        even one that came before the stream began; default: when the stream begins).

        Upstream behaviour copied (kubernetes/kubernetes): each line is a meta/v1 ``WatchEvent``
        ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": …}``
        (staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/watch.go, types.go), written as
        newline-delimited JSON on a chunked 200 response; events after ``resourceVersion``
        (resourceVersion "0" or unset: the current objects as ADDED first); a BOOKMARK (only
        ``metadata.resourceVersion`` set, of the watched kind) when ``allowWatchBookmarks``
        (KEP-956); the stream ends cleanly after ``timeoutSeconds``; a resourceVersion older
        than the kept history is an ERROR event whose object is a Status with code 410 and
        reason Expired, "too old resource version: N (M)" (apimachinery
        pkg/api/errors NewResourceExpired, sent by the watch cache on a 200 stream); with a
        field selector an object that stops matching arrives as DELETED and one that starts
        to match as ADDED (docs: "Efficient detection of changes", API concepts).
        """
        route = _route(path)
        rt = RESOURCES.get(route.resource) if route is not None else None
        if route is None or rt is None or route.name or route.subresource:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace = route.namespace
        since = query.get("resourceVersion", [""])[0]
        timeout = float(query.get("timeoutSeconds", ["1800"])[0] or 1800)
        bookmarks = query.get("allowWatchBookmarks", [""])[0] in ("true", "1")
        labels = query.get("labelSelector", [""])[0]
        fields = query.get("fieldSelector", [""])[0]

        def selected(obj: Obj | None) -> bool:
            if obj is None:
                return False
            meta = obj.get("metadata") or {}
            if namespace and meta.get("namespace") != namespace:
                return False
            if labels and not _labels_match(meta.get("labels") or {}, labels):
                return False
            return not fields or _fields_match(obj, fields)

        def line(kind: str, obj: Obj) -> bytes:
            return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode()

        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        deadline = time.monotonic() + timeout
        next_bookmark = time.monotonic() + self.bookmark_interval_s
        out: list[bytes] = []
        with self._lock:
            drops, ends = cuts if cuts is not None else (self._drops, self._ends)
            if since in ("", "0"):
                current = [o for _, o in sorted(self._store[rt.resource].items())]
                out = [line("ADDED", o) for o in current if selected(o)]
                after = self._rv
            else:
                after = int(since)
            if since not in ("", "0") and after < self._compacted:
                gone = ApiError(
                    410, "Expired", f"too old resource version: {after} ({self._compacted})"
                )
                out = [line("ERROR", gone.status())]
                deadline = 0.0
        sent_rv = after
        try:
            while True:
                for chunk in out:
                    _write_chunk(handler, chunk + b"\n")
                out = []
                now = time.monotonic()
                if now >= deadline:
                    break
                if bookmarks and now >= next_bookmark:
                    mark = {
                        "kind": rt.kind,
                        "apiVersion": rt.api_version,
                        "metadata": {"resourceVersion": str(sent_rv)},
                    }
                    _write_chunk(handler, line("BOOKMARK", mark) + b"\n")
                    next_bookmark = now + self.bookmark_interval_s
                with self._lock:
                    pending = self._after(sent_rv, rt.resource)
                    quiet = self._drops == drops and self._ends == ends
                    if not pending and not self._stopping and quiet:
                        wait = deadline - now
                        if bookmarks:
                            wait = min(wait, next_bookmark - now)
                        self._changed.wait(max(wait, 0.0))
                        pending = self._after(sent_rv, rt.resource)
                    if self._stopping or self._ends != ends:
                        break
                    if self._drops != drops:  # cut: no end chunk, the client sees a broken read
                        handler.close_connection = True
                        handler.connection.shutdown(socket.SHUT_RDWR)
                        return
                    sent_rv = max(sent_rv, self._rv)
                for e in pending:
                    now_in, was_in = selected(e.obj), selected(e.previous)
                    if e.kind == "MODIFIED" and now_in != was_in:
                        out.append(line("ADDED" if now_in else "DELETED", e.obj))
                    elif now_in or (e.kind == "DELETED" and selected(e.obj)):
                        out.append(line(e.kind, e.obj))
            _write_chunk(handler, b"")
        except (BrokenPipeError, ConnectionResetError, OSError):
            handler.close_connection = True

    def _item_bytes(self, rt: ResourceType, key: Key) -> bytes:
        raw = self._raw[rt.resource].get(key)
        if raw is None:
            obj = self._store[rt.resource][key]
            # A real API server leaves kind/apiVersion out of list items.
            item = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
            raw = json.dumps(item, separators=(",", ":")).encode()
            self._raw[rt.resource][key] = raw
        return raw

    def _take_fault(
        self, method: str, path: str, dry_run: bool = False, watch: bool = False
    ) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.dry_run is not None and fault.dry_run != dry_run:
                    continue
                if fault.watch is not None and fault.watch != watch:
                    continue
                if fault.method in (method, "*") and fault.path.search(path) and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    # --- request handling (called by the HTTP handler) ---------------------------------------

    def handle(
        self, method: str, raw_path: str, body: bytes, content_type: str
    ) -> tuple[int, bytes]:
        parts = urlsplit(raw_path)
        query = parse_qs(parts.query)
        path = parts.path
        self.arrived.append((method, path))
        parsed: Any = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = body.decode(errors="replace")
        route = _route(path)
        verb, group, resource, namespace, name = _rbac(method, route, query)
        fault = self._take_fault(method, path, "All" in query.get("dryRun", []), _is_watch(query))
        status, payload = 0, b""
        late, fault = (fault, None) if fault is not None and fault.after else (None, fault)
        if fault is not None:
            if fault.delay_s:
                time.sleep(fault.delay_s)
            if fault.status:
                err = ApiError(fault.status, _reason(fault.status), fault.message)
                status, payload = fault.status, json.dumps(err.status()).encode()
        if not status:
            evicted: Obj | None = None
            try:
                with self._lock:
                    status, result, evicted = self._dispatch(
                        method, route, query, parsed, content_type
                    )
                payload = result if isinstance(result, bytes) else json.dumps(result).encode()
            except ApiError as err:
                status, payload = err.code, json.dumps(err.status()).encode()
            if evicted is not None and self.on_eviction is not None:
                self.on_eviction(self, evicted)
        if late is not None:  # done, but the client never hears it
            if late.delay_s:
                time.sleep(late.delay_s)
            if late.status:
                lost = ApiError(late.status, _reason(late.status), late.message)
                status, payload = late.status, json.dumps(lost.status()).encode()
        entry = Request(
            method,
            path,
            query,
            parsed,
            content_type,
            verb,
            group,
            resource,
            namespace,
            name,
            status,
        )
        with self._lock:
            self._log.append(entry)
        return status, payload

    def serve_watch(self, handler: BaseHTTPRequestHandler, raw_path: str) -> bool:
        """Answer a watch request on ``handler`` (logged, faults applied); False when it is to
        be answered as a plain request instead (an injected fault's status, a bad path)."""
        parts = urlsplit(raw_path)
        query = parse_qs(parts.query)
        path = parts.path
        self.arrived.append(("GET", path))
        route = _route(path)
        verb, group, resource, namespace, name = _rbac("GET", route, query)
        fault = self._take_fault("GET", path, watch=True)
        if fault is not None and fault.status:
            fault.times += 1  # put back: handle() takes it and answers with its status
            return False
        if fault is not None and fault.delay_s:
            time.sleep(fault.delay_s)
        entry = Request("GET", path, query, None, "", verb, group, resource, namespace, name, 200)
        with self._lock:
            # a test that saw this watch logged and then drops every watch must cut this one:
            # the counts are taken with the log entry, not when the stream begins (under load
            # the drop could land between the two, and the watch then lived on unseen)
            self._log.append(entry)
            cuts = self._drops, self._ends
        try:
            self.watch(handler, path, query, cuts)
        except ApiError:
            with self._lock:
                self._log.remove(entry)
            return False
        return True

    def _dispatch(
        self, method: str, route: _Route | None, query: dict[str, list[str]], body: Any, ctype: str
    ) -> tuple[int, Obj | bytes, Obj | None]:
        if route is None or route.resource not in RESOURCES:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        rt = RESOURCES[route.resource]
        if route.group != rt.group or route.version != rt.version:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        key = (route.namespace if rt.namespaced else "", route.name)
        dry = "All" in query.get("dryRun", [])
        if route.subresource:
            if rt.resource == "pods" and route.subresource == "eviction" and method == "POST":
                return self._evict(rt, key, body, dry)
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method == "GET" and not route.name:
            return 200, self._list(rt, route.namespace, query), None
        if method == "GET":
            obj = self._store[rt.resource].get(key)
            if obj is None:
                raise _not_found(rt, route.name)
            return 200, obj, None
        if method == "POST" and not route.name:
            return 201, self._create(rt, route.namespace, body, dry), None
        if method == "PUT" and route.name:
            return 200, self._update(rt, key, body, dry), None
        if method == "PATCH" and route.name:
            return 200, self._patch(rt, key, body, ctype, dry), None
        if method == "DELETE" and route.name:
            obj = self._store[rt.resource].get(key)
            if obj is None:
                raise _not_found(rt, route.name)
            if not dry:
                self._delete(rt, key)
            return 200, obj, None
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _list(self, rt: ResourceType, namespace: str, query: dict[str, list[str]]) -> bytes:
        keys = self._sorted[rt.resource]
        if keys is None:
            keys = sorted(self._store[rt.resource])
            self._sorted[rt.resource] = keys
        first = 0
        token = query.get("continue", [""])[0]
        if token:
            try:
                after = tuple(json.loads(base64.urlsafe_b64decode(token))["after"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "BadRequest", "continue key is not valid") from None
            first = bisect.bisect_right(keys, after)
        labels = query.get("labelSelector", [""])[0]
        fields = query.get("fieldSelector", [""])[0]
        limit = int(query.get("limit", ["0"])[0] or 0)
        store = self._store[rt.resource]
        page: list[Key] = []
        more = False
        for i in range(first, len(keys)):
            key = keys[i]
            if namespace and key[0] != namespace:
                continue
            if labels and not _labels_match(store[key]["metadata"].get("labels") or {}, labels):
                continue
            if fields and not _fields_match(store[key], fields):
                continue
            if limit and len(page) == limit:
                more = True
                break
            page.append(key)
        meta: Obj = {"resourceVersion": str(self._rv)}
        if more:
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps({"after": list(page[-1]), "rv": self._rv}).encode()
            ).decode()
            if not (namespace or labels or fields):  # as the API server: only when it knows
                meta["remainingItemCount"] = len(keys) - first - limit
        head = json.dumps(
            {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta}
        ).encode()
        items = b",".join(self._item_bytes(rt, k) for k in page)
        return head[:-1] + b',"items":[' + items + b"]}"

    def _create(self, rt: ResourceType, namespace: str, body: Any, dry: bool) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            if meta.get("namespace") not in (None, namespace):
                raise ApiError(
                    400, "BadRequest", "the namespace of the object does not match the URL"
                )
            meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise ApiError(422, "Invalid", f"{rt.kind} is invalid: metadata.name: Required value")
        if body.get("kind") not in (None, rt.kind):
            raise ApiError(400, "BadRequest", f"kind {body.get('kind')} does not match {rt.kind}")
        if rt.resource == "events":
            _validate_event(obj)
        key = (namespace if rt.namespaced else "", meta["name"])
        if key in self._store[rt.resource]:
            qualified = f"{rt.resource}.{rt.group}" if rt.group else rt.resource
            raise ApiError(
                409,
                "AlreadyExists",
                f'{qualified} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": rt.group, "kind": rt.resource},
            )
        meta.pop("resourceVersion", None)
        obj = self._stamp(rt, obj, create=True)
        if not dry:
            self._save(rt, obj)
        return obj

    def _update(self, rt: ResourceType, key: Key, body: Any, dry: bool) -> Obj:
        current = self._store[rt.resource].get(key)
        if current is None:
            raise _not_found(rt, key[1])
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv is None:
            raise ApiError(
                422, "Invalid", "metadata.resourceVersion: Invalid value: 0x0: must be specified"
            )
        if rv != current["metadata"]["resourceVersion"]:
            raise _conflict(rt, key[1])
        obj = copy.deepcopy(body)
        obj["metadata"]["uid"] = current["metadata"].get("uid")
        obj["metadata"]["creationTimestamp"] = current["metadata"].get("creationTimestamp")
        if rt.namespaced:
            obj["metadata"]["namespace"] = key[0]
        obj = self._stamp(rt, obj, create=False)
        if not dry:
            self._save(rt, obj)
        return obj

    def _patch(self, rt: ResourceType, key: Key, body: Any, ctype: str, dry: bool) -> Obj:
        current = self._store[rt.resource].get(key)
        if current is None:
            raise _not_found(rt, key[1])
        kind = ctype.split(";")[0].strip()
        if kind == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
            try:
                patched = jsonpatch.apply_patch(current, body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, "Invalid", f"the JSON patch does not apply: {exc}") from None
        elif kind in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            rv = (body.get("metadata") or {}).get("resourceVersion")
            if rv is not None and rv != current["metadata"]["resourceVersion"]:
                raise _conflict(rt, key[1])
            patched = merge_patch(copy.deepcopy(current), body)  # the old state stays as it was
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the patch type {kind!r} is unsupported")
        for immutable in ("name", "namespace", "uid"):
            if patched.get("metadata", {}).get(immutable) != current["metadata"].get(immutable):
                raise ApiError(422, "Invalid", f"metadata.{immutable}: field is immutable")
        obj = self._stamp(rt, patched, create=False)
        if not dry:
            self._save(rt, obj)
        return obj

    def _evict(
        self, rt: ResourceType, key: Key, body: Any, dry: bool
    ) -> tuple[int, Obj, Obj | None]:
        if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
            raise ApiError(400, "BadRequest", "the body must be an Eviction")
        dry = dry or "All" in ((body.get("deleteOptions") or {}).get("dryRun") or [])
        pod = self._store["pods"].get(key)
        if pod is None:
            raise _not_found(rt, key[1])
        wanted = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
        actual = (pod.get("metadata") or {}).get("uid")
        if wanted and wanted != actual:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods "{key[1]}": StorageError: invalid object, '
                f"Code: 4, Key: /registry/pods/{key[0]}/{key[1]}, ResourceVersion: 0, "
                f"AdditionalErrorMsg: Precondition failed: UID in precondition: {wanted}, "
                f"UID in object meta: {actual}",
                {"name": key[1], "kind": "pods"},
            )
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Running":
            pdbs = [p for p in self._store["poddisruptionbudgets"].values() if _pdb_selects(p, pod)]
            if len(pdbs) > 1:
                raise ApiError(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction "
                    "subresource does not support.",
                )
            if pdbs:
                pdb = pdbs[0]
                status = pdb.setdefault("status", {})
                if status.get("disruptionsAllowed", 0) <= 0:
                    raise ApiError(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        {
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {pdb['metadata']['name']}"
                                    f" needs {status.get('desiredHealthy', 1)} healthy pods and"
                                    f" has {status.get('currentHealthy', 1)} currently",
                                }
                            ]
                        },
                    )
                if not dry:
                    status["disruptionsAllowed"] -= 1
                    status.setdefault("disruptedPods", {})[key[1]] = now_rfc3339()
                    self._save(
                        RESOURCES["poddisruptionbudgets"],
                        self._stamp(RESOURCES["poddisruptionbudgets"], pdb, create=False),
                    )
        evicted = None
        if not dry:
            evicted = self._delete(rt, key)
            self.evicted.append(key)
        success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        return 201, {**success, "code": 201}, evicted


@dataclass(frozen=True, slots=True)
class _Event:
    """One change, for watches: its resourceVersion, the object and (MODIFIED) its state
    before, so a field-selected watch can tell an object that stopped matching."""

    rv: int
    resource: str
    kind: str
    obj: Obj
    previous: Obj | None


def _write_chunk(handler: BaseHTTPRequestHandler, data: bytes) -> None:
    """One chunk of a chunked response; ``b""`` ends it."""
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()


def _reason(code: int) -> str:
    return {
        404: "NotFound",
        409: "Conflict",
        410: "Expired",
        429: "TooManyRequests",
        500: "InternalError",
        503: "ServiceUnavailable",
        504: "Timeout",
    }.get(code, "InternalError")


_API = re.compile(r"^/api/(?P<version>v1)(?P<rest>/.*)?$")
_APIS = re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)(?P<rest>/.*)?$")


def _route(path: str) -> _Route | None:
    match = _API.match(path) or _APIS.match(path)
    if match is None:
        return None
    group = match.groupdict().get("group") or ""
    parts = [p for p in (match["rest"] or "").split("/") if p]
    namespace = ""
    if len(parts) >= 3 and parts[0] == "namespaces":
        namespace, parts = parts[1], parts[2:]
    if not parts or len(parts) > 3:
        return None
    return _Route(
        group=group,
        version=match["version"],
        namespace=namespace,
        resource=parts[0],
        name=parts[1] if len(parts) > 1 else "",
        subresource=parts[2] if len(parts) > 2 else "",
    )


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _is_watch(query: dict[str, list[str]]) -> bool:
    return query.get("watch", [""])[0] in ("true", "1")


def _rbac(
    method: str, route: _Route | None, query: dict[str, list[str]]
) -> tuple[str, str, str, str, str]:
    """(verb, group, resource[/subresource], namespace, name) as RBAC authorises the request."""
    if route is None:
        return method.lower(), "", "", "", ""
    if method == "GET":
        verb = "get" if route.name else "watch" if _is_watch(query) else "list"
    else:
        verb = _VERBS.get(method, method.lower())
        if method == "DELETE" and not route.name:
            verb = "deletecollection"
    resource = f"{route.resource}/{route.subresource}" if route.subresource else route.resource
    return verb, route.group, resource, route.namespace, route.name


class _Handler(BaseHTTPRequestHandler):
    emulator: KubeApi
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        query = parse_qs(urlsplit(self.path).query)
        watching = self.command == "GET" and _is_watch(query)
        if watching and self.emulator.serve_watch(self, self.path):
            return
        status, payload = self.emulator.handle(
            self.command, self.path, body, self.headers.get("Content-Type") or ""
        )
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


def client_for(url: str) -> Any:
    """A ``kubernetes.client.ApiClient`` for an emulator at ``url`` (e.g. in another process)."""
    from kubernetes import client

    config = client.Configuration()
    config.host = url
    config.retries = 0
    return client.ApiClient(config)


def serve_in_subprocess(objects: list[Obj]) -> tuple[str, Callable[[], None]]:
    """Run an emulator in a forked process (so it does not share the client's GIL, as a real API
    server would not); returns its URL and a function that stops it. For benchmarks."""
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    process = ctx.Process(target=_serve_child, args=(objects, theirs), daemon=True)
    process.start()
    url = ours.recv()

    def stop() -> None:
        ours.send("stop")
        process.join(10)

    return str(url), stop


def _serve_child(objects: list[Obj], conn: Any) -> None:
    api = KubeApi(objects).start()
    conn.send(api.url)
    conn.recv()
    api.stop()


def running(objects: Iterable[Obj] = ()) -> Iterator[KubeApi]:
    """Generator for a pytest fixture: ``yield from running(objects)``."""
    api = KubeApi(objects).start()
    try:
        yield api
    finally:
        api.stop()


__all__ = [
    "ApiError",
    "Fault",
    "KubeApi",
    "Request",
    "client_for",
    "merge_patch",
    "running",
    "serve_in_subprocess",
]
