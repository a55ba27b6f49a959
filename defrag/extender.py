"""The kube-scheduler extender: ``filter`` and ``prioritize`` with defrag's own score function.

The wire format is kube-scheduler's own (``k8s.io/kube-scheduler`` ``extender/v1/types.go``):
those structs carry no json tags, so ``json.Marshal`` in kube-scheduler (``pkg/scheduler/
extender.go``, ``HTTPExtender.send``) writes the Go field names. It POSTs an ``ExtenderArgs`` —
``{"Pod": <v1 Pod>, "Nodes": null, "NodeNames": [...]}`` when the extender is configured
``nodeCacheCapable``, else ``{"Pod": …, "Nodes": {"metadata": {}, "items": [<v1 Node>…]},
"NodeNames": null}`` — to ``<urlPrefix>/filter`` and ``<urlPrefix>/prioritize``. Keys are read
with ``encoding/json``'s rules (an exact match, else a case-insensitive one: :func:`go_fields`), so
the lowercase form decodes too. The answers use the same field names: an
``ExtenderFilterResult`` ``{"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes",
"Error"}`` (the list in the request's mode, the other null) and a ``HostPriorityList``
``[{"Host", "Score"}]``, scores 0..10. kube-scheduler reads no body from a non-200 answer; a
body it could not have sent gets 400 with ``{"Error": <the field that is wrong>}``.

Score mapping (0..100 → 0..10): the node :func:`schedule` picks gets 10; every other feasible
node gets ``min(9, floor(score / 10))``; infeasible and unknown nodes get 0. Plain rounding
would tie the winner with near-winners (95 and 100 both → 10) and let kube-scheduler's random
tie-break undo the packing; reserving 10 for the winner keeps defrag's choice on top.

Reservations: a node annotated ``defrag.io/reserved-for: <namespace>/<pod>`` (set by make-room
plans) is filtered out for every other pod, in ``FailedAndUnresolvableNodes`` so kube-scheduler
does not preempt its way onto the room made for someone else.

Hardening (any client that reaches the port is served by the same process as kube-scheduler):
a body is at most :data:`MAX_BODY_BYTES` (sized from a 5,000-node ``Nodes``-mode request, see
docs/operations.md) and waits for room in a budget of body bytes held at once
(:class:`BodyBudget`) before it is read, so concurrent huge bodies queue instead of multiplying
memory; connections are a bounded pool with idle and read deadlines
(:class:`~defrag.adapters.httpserve.BoundedHTTPServer`); every body kube-scheduler could not
have sent gets 400 naming the field, never 500; TLS is an option (``enableHTTPS``).
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from defrag.adapters.gpu_shapes import ShapeWarning
from defrag.adapters.httpserve import BoundedHandler, BoundedHTTPServer, ServerLimits
from defrag.adapters.kube_convert import ConversionError, pod_from_json
from defrag.adapters.snapshot import load_snapshot
from defrag.model.arrays import BoolArray, FloatArray, IntArray, NodeArrays
from defrag.model.cluster import Cluster
from defrag.model.resources import RESERVED_FOR_ANNOTATION, Pod
from defrag.model.workload import WorkloadMix
from defrag.ports import ClusterSource
from defrag.scoring.framework import Placement, Policy, Status
from defrag.scoring.policies import make_policy
from defrag.scoring.scheduler import explain, feasible_mask, node_scores, schedule

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler's MaxExtenderPriority: extender scores are 0..10."""
MAX_BODY_BYTES = 80 * 2**20
"""The largest body read: 1.5 × a 5,000-node ``Nodes``-mode request with 50 images per node
(55.2 MB, ``bench/extender_bodies.py``); a ``NodeNames`` request for 5,000 nodes is 61 kB."""
BODY_BUDGET_BYTES = MAX_BODY_BYTES
"""Body bytes read and parsed at once, all requests together (one maximal body at a time)."""
MAX_NESTING = 64
"""JSON nesting deeper than a v1 Pod or Node ever is (a deeper body is refused, not recursed)."""
R_UNKNOWN_NODE = "node unknown to defrag's cluster state (not relisted yet; relisting now)"


class BadRequest(ValueError):
    """A body that is not a usable ExtenderArgs; the message goes back with the 400."""


# --- the request ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A parsed ExtenderArgs: the pod, the candidate node names, and (``nodes`` mode) the
    node objects as sent, so that a filter answer can return them untouched."""

    pod: Pod
    node_names: tuple[str, ...]
    node_objects: tuple[Mapping[str, Any], ...] | None = None
    """The v1 Node items when the request carried ``Nodes``; None in ``NodeNames`` mode."""
    unmodelled: str = ""
    """Why defrag cannot model the pod's request (a DRA claim, an unknown accelerator); such a
    pod is not judged: every node passes the filter and scores 0, so kube-scheduler decides."""

    @property
    def node_cache_capable(self) -> bool:
        return self.node_objects is None


ARGS_FIELDS = ("Pod", "Nodes", "NodeNames")
"""``extender/v1.ExtenderArgs``'s fields, in declaration order (no json tags: the keys are the Go
field names)."""
NODE_LIST_FIELDS = ("metadata", "items")
"""The json tags of ``core/v1.NodeList`` that the extender reads."""

# encoding/json's foldName (fold.go): ASCII letters upper-cased, any other rune replaced by the
# smallest rune of its unicode.SimpleFold orbit. Against ASCII field names only two non-ASCII
# runes can match, both listed in unicode's caseOrbit table: KELVIN SIGN (U+212A, orbit K k K)
# and LATIN SMALL LETTER LONG S (U+017F, orbit S s ſ). Every other non-ASCII rune folds to a
# non-ASCII rune and so never matches an ASCII name; it is kept as it is.
_GO_FOLD = str.maketrans(
    {**{chr(c): chr(c - 32) for c in range(ord("a"), ord("z") + 1)}, "\u212a": "K", "\u017f": "S"}
)


def go_fold(name: str) -> str:
    """A JSON key folded as encoding/json folds it, for comparison with an ASCII field name."""
    return name.translate(_GO_FOLD)


class _Pairs(dict[str, Any]):
    """A JSON object that remembers its members in document order, duplicates included."""

    pairs: list[tuple[str, Any]]


def _pairs_hook(pairs: list[tuple[str, Any]]) -> _Pairs:
    obj = _Pairs(pairs)
    obj.pairs = pairs
    return obj


def go_fields(
    obj: Mapping[str, Any], fields: Sequence[str], pairs: Sequence[tuple[str, Any]] | None = None
) -> dict[str, Any]:
    """The value each field of a Go struct receives when ``encoding/json`` decodes ``obj``.

    Go's rule (``decode.go``, ``object()``): for each member in document order, the field whose
    name equals the key exactly, else the field whose folded name equals the folded key; a later
    member for the same field replaces the earlier one; unknown keys are ignored. A field no key
    names is absent from the result; JSON ``null`` comes back as None (a nil pointer). ``pairs``
    are the members in document order with duplicates; without them ``obj``'s items stand in,
    which is exact unless two keys name one field (see :func:`parse_args`).
    """
    exact = {f: f for f in fields}
    folded = {go_fold(f): f for f in reversed(fields)}  # the first declared field wins a tie
    out: dict[str, Any] = {}
    for key, value in pairs if pairs is not None else obj.items():
        name = exact.get(key) or folded.get(go_fold(key))
        if name is not None:
            out[name] = value
    return out


def _collides(obj: Mapping[str, Any], fields: Sequence[str]) -> bool:
    """Whether two keys of ``obj`` name the same field (their order then matters)."""
    wanted = {go_fold(f) for f in fields}
    seen = [go_fold(k) for k in obj if go_fold(k) in wanted]
    return len(seen) != len(set(seen))


def _no_constant(name: str) -> Any:
    raise BadRequest(f"body: {name} is not JSON (Go's encoding/json refuses it)")


def _nesting(body: bytes | bytearray | str) -> int:
    """The deepest ``[``/``{`` nesting outside strings, cheaply (a bound before json.loads)."""
    text = body.decode(errors="replace") if isinstance(body, bytes | bytearray) else body
    if text.count("[") + text.count("{") < MAX_NESTING:
        return 0
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_NESTING:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_args(body: bytes | bytearray | str) -> ExtenderArgs:
    """Read an ExtenderArgs body as kube-scheduler's ``encoding/json`` would; :class:`BadRequest`
    names the field that is wrong.

    kube-scheduler sends ``{"Pod": …, "Nodes": null, "NodeNames": [...]}`` (nodeCacheCapable)
    or ``{"Pod": …, "Nodes": {"metadata": {}, "items": [...]}, "NodeNames": null}``; the keys
    match case-insensitively (:func:`go_fields`), so ``{"pod": …, "nodenames": […]}`` is read
    too. The Pod and the Node items are ordinary Kubernetes JSON (lowercase json tags).
    """
    if _nesting(body) > MAX_NESTING:
        raise BadRequest(f"body: JSON nested deeper than {MAX_NESTING} levels")
    try:
        doc = json.loads(body, parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("body: expected a JSON object (ExtenderArgs)")
    pairs: list[tuple[str, Any]] | None = None
    if _collides(doc, ARGS_FIELDS):  # e.g. both "Pod" and "pod": the last one wins, as in Go
        pairs = json.loads(body, object_pairs_hook=_pairs_hook, parse_constant=_no_constant).pairs
    args = go_fields(doc, ARGS_FIELDS, pairs)
    raw_pod = args.get("Pod")
    if not isinstance(raw_pod, dict):
        what = "null" if "Pod" in args and raw_pod is None else "missing or not an object"
        raise BadRequest(f"Pod: {what} (ExtenderArgs.Pod is the v1 Pod to place)")
    _check_quantities(raw_pod)
    found: list[ShapeWarning] = []
    try:
        pod, _ = pod_from_json(raw_pod, "Pod", found)
    except ConversionError as exc:
        raise BadRequest(f"Pod: {exc}") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as exc:
        # a field of the wrong JSON type that the converter did not name
        raise BadRequest(
            f"Pod: not a v1 Pod defrag can read ({type(exc).__name__}: {exc})"
        ) from None
    _check_requests(pod)
    unmodelled = "; ".join(str(w) for w in found if w.leave_out)
    if unmodelled:
        log.warning("not judging %s: %s", pod.key, unmodelled)
    names = args.get("NodeNames")
    nodes = args.get("Nodes")
    if names is not None:
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise BadRequest("NodeNames: expected a list of node names (strings) or null")
        return ExtenderArgs(pod, tuple(names), None, unmodelled)
    if nodes is None:
        raise BadRequest("Nodes and NodeNames: both null or missing; one must list the nodes")
    if not isinstance(nodes, dict):
        raise BadRequest("Nodes: expected a v1 NodeList object ({metadata, items}) or null")
    node_list = go_fields(nodes, NODE_LIST_FIELDS)
    items = node_list.get("items")
    if items is None:  # Go marshals an empty NodeList's nil Items as null
        items = []
    if not isinstance(items, list):
        raise BadRequest("Nodes.items: expected a list of v1 Node objects or null")
    node_names = []
    for i, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise BadRequest(f"Nodes.items[{i}].metadata.name: missing")
        annotations = meta.get("annotations") if isinstance(meta, dict) else None
        if annotations is not None and not isinstance(annotations, dict):
            raise BadRequest(f"Nodes.items[{i}].metadata.annotations: expected an object")
        node_names.append(name)
    return ExtenderArgs(pod, tuple(node_names), tuple(items), unmodelled)


def _check_quantities(raw_pod: Mapping[str, Any]) -> None:
    """Kubernetes validation refuses a negative quantity in any container's requests or limits
    ("must be greater than or equal to 0"); a pod asking −1 GPU was never admitted."""
    spec = raw_pod.get("spec")
    if not isinstance(spec, dict):
        return
    for kind in ("containers", "initContainers"):
        containers = spec.get(kind)
        if not isinstance(containers, list):
            continue
        for i, container in enumerate(containers):
            resources = container.get("resources") if isinstance(container, dict) else None
            if resources is None:
                continue
            if not isinstance(resources, dict):
                raise BadRequest(f"Pod.spec.{kind}[{i}].resources: expected an object")
            for part in ("requests", "limits"):
                values = resources.get(part)
                if not isinstance(values, dict):
                    continue
                for name, value in values.items():
                    if str(value).strip().startswith("-"):
                        raise BadRequest(
                            f"Pod.spec.{kind}[{i}].resources.{part}[{name}]: negative quantity "
                            f"{value!s} (must be greater than or equal to 0)"
                        )


def _check_requests(pod: Pod) -> None:
    """A request Kubernetes would refuse (negative GPUs or shares) is a body it never sent."""
    if pod.num_gpu < 0:
        raise BadRequest(f"Pod: spec.containers[].resources: negative GPU request ({pod.num_gpu})")
    for name in ("gpu_milli", "cpu_milli", "memory_mib"):
        value = getattr(pod, name, 0)
        if isinstance(value, int | float) and (value < 0 or value != value):
            raise BadRequest(f"Pod: spec.containers[].resources: {name} {value} is not a quantity")


# --- the cluster state -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One relisted cluster with what every request needs precomputed."""

    cluster: Cluster
    policy: Policy
    reserved_for: Mapping[str, str]
    """node name → the pod key its room is reserved for."""
    taken_at: float
    """``time.monotonic()`` when the relist finished."""


def make_view(cluster: Cluster, policy_name: str, taken_at: float) -> ClusterView:
    reserved = {
        node.name: node.annotations[RESERVED_FOR_ANNOTATION].strip()
        for node in cluster.nodes
        if node.annotations.get(RESERVED_FOR_ANNOTATION, "").strip()
    }
    # The mix `defrag place` uses: the GPU pods the cluster holds, or the default when none.
    mix = WorkloadMix.observed(cluster.pods.values())
    return ClusterView(cluster, make_policy(policy_name, mix=mix), reserved, taken_at)


@dataclass(slots=True)
class ClusterCache:
    """The current :class:`ClusterView`, relisted from ``source`` every ``relist_interval_s``.

    A failed relist keeps the last good view (and counts the failure); readiness turns false
    once the view is older than ``max_staleness_s``.
    """

    source: ClusterSource
    policy_name: str
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
            view = make_view(cluster, self.policy_name, self.clock())
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


# --- filter and prioritize -------------------------------------------------------------------


def extender_scores(scores: FloatArray, winner: BoolArray) -> IntArray:
    """Policy scores (0..100) on kube-scheduler's extender scale (0..10); see the module doc.

    The winner gets 10; any other node ``min(9, floor(score / 10))``; NaN (not feasible) → 0.
    """
    finite = np.isfinite(scores)
    clipped = np.clip(np.where(finite, scores, 0.0), 0.0, None) // 10
    values = np.minimum(MAX_EXTENDER_PRIORITY - 1, clipped).astype(np.int64)
    return np.asarray(np.where(winner, MAX_EXTENDER_PRIORITY, values), dtype=np.int64)


def extender_score(score: float, winner: bool) -> int:
    """:func:`extender_scores` for one node."""
    return int(extender_scores(np.array([score]), np.array([winner]))[0])


@dataclass(frozen=True, slots=True)
class Candidates:
    """The request's nodes resolved against the view."""

    rows: IntArray
    """Row of each requested node, in request order; -1 for a node the view does not know."""
    unknown: tuple[str, ...]
    reserved: dict[str, str]
    """Node name → pod key, for requested nodes reserved for another pod."""
    exclude: BoolArray
    """[N] rows that are not candidates, or are reserved for another pod."""


class Extender:
    """The two verbs over the current cluster view; pure of HTTP (the server wraps it)."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def _view(self) -> ClusterView:
        view = self.cache.view()
        if view is None:
            raise StateUnavailable(str(self.cache.readiness()))
        return view

    def _candidates(self, args: ExtenderArgs, view: ClusterView) -> Candidates:
        arrays = view.cluster.arrays
        get = arrays.index.get
        names = args.node_names
        rows = np.fromiter(map(get, names, repeat(-1)), dtype=np.int64, count=len(names))
        known = rows >= 0
        unknown: tuple[str, ...] = ()
        if not known.all():
            unknown = tuple(n for n, k in zip(names, known, strict=True) if not k)
            self.cache.nudge()
        exclude = np.ones(len(arrays), dtype=bool)
        exclude[rows[known]] = False
        reserved_for = dict(view.reserved_for)
        if args.node_objects is not None:
            # The request's node objects are fresher than the last relist.
            for obj in args.node_objects:
                meta = obj.get("metadata") or {}
                annotations = meta.get("annotations") or {}
                value = annotations.get(RESERVED_FOR_ANNOTATION, "")
                if isinstance(value, str) and value.strip():
                    reserved_for[meta["name"]] = value.strip()
                else:
                    reserved_for.pop(meta["name"], None)
        pod_key = args.pod.key
        reserved: dict[str, str] = {}
        for name, key in reserved_for.items():
            row = get(name)
            if key != pod_key and row is not None and not exclude[row]:
                reserved[name] = key
        for name in reserved:
            exclude[arrays.index[name]] = True
        return Candidates(rows, unknown, reserved, exclude)

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        """An ExtenderFilterResult: the nodes that fit, and a reason for each that does not."""
        view = self._view()
        cand = self._candidates(args, view)
        failed: dict[str, str] = dict.fromkeys(cand.unknown, R_UNKNOWN_NODE)
        unresolvable = {
            name: f"node reserved for {key} ({RESERVED_FOR_ANNOTATION})"
            for name, key in cand.reserved.items()
        }
        mask = feasible_mask(args.pod, view.cluster.arrays, cand.exclude)
        passes = (cand.rows >= 0) & mask[cand.rows]  # rows of -1 are masked by the first term
        if args.unmodelled:  # not defrag's to judge: only reserved nodes are refused
            failed = {}
            passes = np.array([n not in unresolvable for n in args.node_names], dtype=bool)
        passed = [n for n, ok in zip(args.node_names, passes.tolist(), strict=True) if ok]
        infeasible = [
            n
            for n, ok, row in zip(args.node_names, passes.tolist(), cand.rows.tolist(), strict=True)
            if not ok and row >= 0 and n not in unresolvable
        ]
        if infeasible:
            verdicts = {v.node: v for v in explain(args.pod, view.cluster, view.policy)}
            for name in infeasible:
                reasons = verdicts[name].reasons if name in verdicts else ()
                failed[name] = "; ".join(reasons) or "does not fit"
        # Every field, in ExtenderFilterResult's order, as Go's json.Marshal writes it: the node
        # list in the request's mode, the other one null (kube-scheduler reads NodeNames when
        # nodeCacheCapable and it is non-null, else Nodes).
        nodes: dict[str, Any] | None = None
        names: list[str] | None = passed
        if args.node_objects is not None:
            keep = set(passed)
            items = [o for o in args.node_objects if o["metadata"]["name"] in keep]
            nodes, names = {"metadata": {}, "items": items}, None
        return {
            "Nodes": nodes,
            "NodeNames": names,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }

    def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        """A HostPriorityList: every requested node with a 0..10 score (see the module doc)."""
        values = self.scores(args)
        return [
            {"Host": name, "Score": value}
            for name, value in zip(args.node_names, values, strict=True)
        ]

    def scores(self, args: ExtenderArgs) -> list[int]:
        """The 0..10 score of each requested node, in request order."""
        view = self._view()
        if args.unmodelled:
            return [0] * len(args.node_names)
        cand = self._candidates(args, view)
        arrays = view.cluster.arrays
        feasible = feasible_mask(args.pod, arrays, cand.exclude)
        scores = node_scores(args.pod, arrays, view.policy, feasible)
        # The winner by the scheduler's own selection, over the very scores returned (a
        # random policy scored twice would disagree with itself).
        choice = schedule(args.pod, arrays, _Scored(view.policy, scores), exclude=cand.exclude)
        known = cand.rows >= 0
        rows = np.where(known, cand.rows, 0)
        ok = known & feasible[rows]
        per_node = np.where(ok, scores[rows], np.nan)
        winner = np.zeros(len(rows), dtype=bool)
        if isinstance(choice, Placement):
            winner = ok & (rows == choice.row)
        values: list[int] = extender_scores(per_node, winner).tolist()
        return values


class _Scored:
    """A policy whose scores for this one pod are already computed."""

    __slots__ = ("name", "policy", "scores")

    def __init__(self, policy: Policy, scores: FloatArray) -> None:
        self.name = policy.name
        self.policy = policy
        self.scores = scores

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        return self.scores

    def choose_gpus(self, pod: Pod, arrays: NodeArrays, row: int) -> tuple[int, ...]:
        return self.policy.choose_gpus(pod, arrays, row)


class StateUnavailable(RuntimeError):
    """No cluster state to answer from (first relist not done, or failed)."""


# --- HTTP --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExtenderMetrics:
    registry: CollectorRegistry
    requests: Counter
    seconds: Histogram
    relists: Counter
    relist_seconds: Gauge
    state_age: Gauge
    closed: Counter

    @classmethod
    def create(cls, cache: ClusterCache | None = None) -> ExtenderMetrics:
        registry = CollectorRegistry()
        metrics = cls(
            registry=registry,
            requests=Counter(
                "defrag_extender_requests",
                "Extender requests by verb and HTTP status code.",
                ["verb", "code"],
                registry=registry,
            ),
            seconds=Histogram(
                "defrag_extender_request_seconds",
                "Time to answer one extender request.",
                ["verb"],
                buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                registry=registry,
            ),
            relists=Counter(
                "defrag_extender_relists",
                "Cluster relists by result (ok, failed).",
                ["result"],
                registry=registry,
            ),
            relist_seconds=Gauge(
                "defrag_extender_relist_seconds",
                "Duration of the last cluster relist.",
                registry=registry,
            ),
            state_age=Gauge(
                "defrag_extender_state_age_seconds",
                "Age of the cluster state the extender answers from.",
                registry=registry,
            ),
            closed=Counter(
                "defrag_extender_connections_closed",
                "Connections closed by the server: idle (keep-alive idle timeout), read-timeout "
                "(a request not in within the read deadline), busy (connection pool full).",
                ["reason"],
                registry=registry,
            ),
        )
        if cache is not None:

            def age() -> float:
                view = cache.view()
                return cache.clock() - view.taken_at if view is not None else float("nan")

            metrics.state_age.set_function(age)
        return metrics

    def observe_relist(self, status: Status, seconds: float) -> None:
        self.relists.labels(result="ok" if status.ok else "failed").inc()
        self.relist_seconds.set(seconds)


VERBS = ("filter", "prioritize")


_PLAIN_NAMES = re.compile(r"[a-z0-9.,\-]*")


def encode_priorities(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """A HostPriorityList (``[{"Host", "Score"}]``) as JSON, fast: node names (RFC 1123:
    lower-case letters, digits, '-' and '.') need no escaping, so 1,000 entries are joined
    directly; anything else goes through ``json.dumps``."""
    if _PLAIN_NAMES.fullmatch(",".join(hosts)):
        body = ",".join(
            f'{{"Host":"{h}","Score":{int(v)}}}' for h, v in zip(hosts, scores, strict=True)
        )
        return f"[{body}]".encode()
    items = [{"Host": h, "Score": int(v)} for h, v in zip(hosts, scores, strict=True)]
    return json.dumps(items, separators=(",", ":")).encode()


class BodyBudget:
    """Body bytes held at once, all requests together: a request waits (at most ``wait_s``)
    until its body fits before reading it, so N concurrent huge bodies queue, not pile up."""

    def __init__(self, capacity: int, wait_s: float) -> None:
        self.capacity = capacity
        self.wait_s = wait_s
        self.used = 0
        self._cond = threading.Condition()

    def acquire(self, n: int) -> bool:
        """Take ``n`` bytes (a body alone may always take up to the whole capacity)."""
        n = min(n, self.capacity)
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            while self.used and self.used + n > self.capacity:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            self.used += n
            return True

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= min(n, self.capacity)
            self._cond.notify_all()


class _Handler(BoundedHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: kube-scheduler reuses its connections
    # Headers and body are separate writes: with Nagle on, the client's delayed ACK adds ~40 ms.
    disable_nagle_algorithm = True
    server: ExtenderHTTPServer
    logger = log

    _metered: str | None = None
    """The verb of the POST being answered: counted just before its answer is written, so a
    client that reads the answer and then asks /metrics always sees it counted."""
    _started: float = 0.0

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        verb, self._metered = self._metered, None
        if verb is not None:
            self.server.metrics.requests.labels(verb=verb, code=str(code)).inc()
            self.server.metrics.seconds.labels(verb=verb).observe(
                time.perf_counter() - self._started
            )
        self.send_body(code, body, content_type)

    def _json(self, code: int, data: Any) -> None:
        self._send(code, json.dumps(data, separators=(",", ":")).encode())

    def do_GET(self) -> None:
        self._metered = None
        self.request_read()
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, b"ok\n", "text/plain")
        elif path == "/readyz":
            status = self.server.extender.cache.readiness()
            code = 200 if status.ok else 503
            self._send(code, (str(status) + "\n").encode(), "text/plain")
        elif path == "/metrics":
            self._send(200, generate_latest(self.server.metrics.registry), CONTENT_TYPE_LATEST)
        else:
            self._json(404, {"Error": f"no such path {path}"})

    def do_POST(self) -> None:
        verb = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        self._started = time.perf_counter()
        self._metered = verb if verb in VERBS else None
        self._answer(verb)

    def _answer(self, verb: str) -> int:
        if verb not in VERBS:
            self.request_read()
            self.close_connection = True  # its body is not read: the connection cannot go on
            self._json(404, {"Error": f"unknown verb {verb!r}; served: {', '.join(VERBS)}"})
            return 404
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        length = self._content_length()
        if not chunked and (length is None or length > self.server.max_body_bytes):
            self.request_read()
            self.close_connection = True
            limit = self.server.max_body_bytes // 2**20
            self._json(
                400,
                {"Error": f"a body (Content-Length or chunked) of at most {limit} MiB is required"},
            )
            return 400
        budget = self.server.body_budget
        held = self.server.max_body_bytes if chunked else (length or 0)
        self.request_read()  # the headers are in; waiting for room is not the client's delay
        if not budget.acquire(held):
            # Read the body away (a chunk at a time, under the read deadline) so the client can
            # read the 503 instead of hitting a reset while it still sends.
            self.reading()
            drained = not chunked and self._discard(length or 0)
            self.request_read()
            self.close_connection = not drained
            self._json(503, {"Error": "server busy: too many large bodies in flight; retry"})
            return 503
        try:
            return self._answer_body(verb, chunked, length or 0)
        finally:
            budget.release(held)

    def _content_length(self) -> int | None:
        text = self.headers.get("Content-Length")
        try:
            length = int(text) if text is not None else -1
        except ValueError:
            return None
        return length if length >= 0 else None

    def _answer_body(self, verb: str, chunked: bool, length: int) -> int:
        limit = self.server.max_body_bytes
        self.reading()
        body = self._read_chunked(limit) if chunked else self._read_exact(length)
        self.request_read()
        if body is None:
            self.close_connection = True
            self._json(
                400,
                {"Error": f"body: incomplete, or larger than {limit // 2**20} MiB (chunked)"},
            )
            return 400
        extender = self.server.extender
        try:
            args = parse_args(body)
            if verb == "filter":
                body_out = json.dumps(extender.filter(args), separators=(",", ":")).encode()
            else:
                body_out = encode_priorities(args.node_names, extender.scores(args))
        except BadRequest as exc:
            self._json(400, {"Error": str(exc)})
            return 400
        except StateUnavailable as exc:
            self._json(503, {"Error": f"defrag extender not ready: {exc}"})
            return 503
        except Exception as exc:  # never let one request take the server down
            log.exception("extender %s failed", verb)
            self._json(500, {"Error": f"internal error: {type(exc).__name__}: {exc}"})
            return 500
        self._send(200, body_out)
        return 200

    def _discard(self, length: int) -> bool:
        """Read ``length`` bytes and drop them; False if the client stopped short."""
        left = length
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 16))
            if not chunk:
                return False
            left -= len(chunk)
        return True

    def _read_exact(self, length: int) -> bytearray | None:
        """``length`` bytes into one buffer (no intermediate copies), or None if cut short."""
        buf = bytearray(length)
        view = memoryview(buf)
        got = 0
        while got < length:
            n = self.rfile.readinto(view[got:])
            if not n:
                return None
            got += n
        return buf

    def _read_chunked(self, limit: int) -> bytes | None:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024).split(b";", 1)[0].strip()
            try:
                size = int(line, 16)
            except ValueError:
                return None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            total += size
            if size < 0 or total > limit:
                return None
            chunk = self.rfile.read(size)
            if len(chunk) != size:
                return None
            parts.append(chunk)
            self.rfile.readline(8)  # the CRLF after each chunk


class _StatusHandler(_Handler):
    """Only ``GET /healthz``, ``/readyz`` and ``/metrics``: the address that kubelet probes and
    Prometheus reach, while ``filter`` and ``prioritize`` stay on the loopback address that the
    kube-scheduler beside the extender calls (deploy/components/extender)."""

    def do_POST(self) -> None:
        self.request_read()
        self.close_connection = True  # its body is not read: the connection cannot go on
        self._json(404, {"Error": "this address serves only GET /healthz, /readyz and /metrics"})


class ExtenderHTTPServer(BoundedHTTPServer):
    logger = log

    def __init__(
        self,
        address: tuple[str, int],
        extender: Extender,
        metrics: ExtenderMetrics,
        limits: ServerLimits | None = None,
        *,
        handler: type[_Handler] = _Handler,
        max_body_bytes: int = MAX_BODY_BYTES,
        body_budget_bytes: int = BODY_BUDGET_BYTES,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(address, handler, limits)
        self.extender = extender
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.body_budget = BodyBudget(max(body_budget_bytes, 1), wait_s=self.limits.read_timeout_s)
        self.scheme = "http"
        if tls is not None:
            # The handshake runs in the connection's thread (BoundedHandler.setup), under the
            # read deadline, never in the accept loop.
            self.socket = tls.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )
            self.scheme = "https"

    def count_closed(self, reason: str) -> None:
        super().count_closed(reason)
        self.metrics.closed.labels(reason=reason).inc()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"{self.scheme}://{host!s}:{port}"


def tls_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2+) from PEM files, as kube-scheduler's ``enableHTTPS``
    extender config expects; :class:`ssl.SSLError`/:class:`OSError` name a bad file."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert_file), str(key_file))
    return context


def serve(
    source: ClusterSource,
    *,
    policy: str,
    host: str = "0.0.0.0",
    port: int = 8888,
    relist_interval_s: float = 10.0,
    max_staleness_s: float = 120.0,
    limits: ServerLimits | None = None,
    tls: ssl.SSLContext | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> ExtenderHTTPServer:
    """Build the cache, the extender and the server, relist once and start relisting.

    The caller runs ``server.serve_forever()`` (or a thread of it) and ``server.shutdown()``.
    """
    cache = ClusterCache(
        source, policy, relist_interval_s=relist_interval_s, max_staleness_s=max_staleness_s
    )
    metrics = ExtenderMetrics.create(cache)
    cache.on_relist = metrics.observe_relist
    server = ExtenderHTTPServer(
        (host, port),
        Extender(cache),
        metrics,
        limits,
        max_body_bytes=max_body_bytes,
        body_budget_bytes=max(max_body_bytes, BODY_BUDGET_BYTES),
        tls=tls,
    )
    cache.start()
    return server


def serve_status(server: ExtenderHTTPServer, host: str, port: int) -> ExtenderHTTPServer:
    """A second server for ``server``'s probes and metrics only (same cache, same registry).

    The caller runs its ``serve_forever()`` and, when done, ``shutdown()`` and
    ``server_close()``; :func:`stop` on the main server stops the shared cache.
    """
    return ExtenderHTTPServer(
        (host, port), server.extender, server.metrics, server.limits, handler=_StatusHandler
    )


def stop(server: ExtenderHTTPServer) -> None:
    """Stop relisting and close the socket (after ``shutdown()`` if it was serving)."""
    server.extender.cache.stop()
    server.server_close()


class SnapshotFileSource:
    """A :class:`~defrag.ports.ClusterSource` over snapshot files (``--snapshot``), reread when
    a file changes (e.g. a ConfigMap update), so a long-running trial follows the file."""

    def __init__(self, paths: Sequence[str | Path]) -> None:
        self.paths = tuple(Path(p) for p in paths)
        self._stamp: tuple[float, ...] | None = None
        self._cluster: Cluster | None = None

    def snapshot(self) -> Cluster:
        stamp = tuple(p.stat().st_mtime for p in self.paths)
        if self._cluster is None or stamp != self._stamp:
            self._cluster = load_snapshot(self.paths)
            self._stamp = stamp
        return self._cluster
