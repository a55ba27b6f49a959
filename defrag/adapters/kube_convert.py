"""Real Kubernetes v1 JSON (Node, Pod, PodDisruptionBudget, PriorityClass) → the cluster model.

One converter serves both snapshot files (``kubectl get … -o json``) and the live API (raw JSON
read with ``_preload_content=False``), so both paths see the same cluster.

Conventions read here (documented in docs/kubernetes.md):

- GPUs: ``nvidia.com/gpu`` in ``status.allocatable`` (node) and in container requests (pod; a
  container with only a limit requests its limit, as Kubernetes defaults it).
- GPU model and memory: GPU Feature Discovery labels ``nvidia.com/gpu.product`` and
  ``nvidia.com/gpu.memory`` (MiB); ``nvidia.com/gpu.count`` is checked against allocatable.
- NVLink domains: node annotation ``defrag.io/nvlink-domains`` = ``"0-3,4-7"`` (comma-separated
  domains, each a GPU index or an inclusive range). Absent = one domain holding every GPU.
- GPU sharing: pod annotation ``defrag.io/gpu-milli`` = the share of its one GPU in milli-GPU
  (1..1000); a sharing pod requests ``nvidia.com/gpu: 1`` (or nothing: one GPU is implied).
- GPU memory a pod needs: pod annotation ``defrag.io/gpu-memory`` (a quantity, e.g. ``"20Gi"``).
- Allowed GPU models: ``nvidia.com/gpu.product`` in ``spec.nodeSelector`` or in the required
  node affinity (``In`` expressions).
- Bound GPU slots: pod annotation ``defrag.io/gpu-indices`` = ``"0,1"`` or ``"0-3"``.
- Gangs: labels ``job-name``, ``training.kubeflow.org/job-name``, ``volcano.sh/job-name``,
  ``scheduling.x-k8s.io/pod-group``; else a controlling owner of a batch kind (Job, PyTorchJob,
  …) gives the gang ``<kind>/<name>`` (lowercase kind).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import ROUND_CEILING, Decimal
from functools import lru_cache
from typing import Any, NamedTuple, TypeGuard

from defrag.adapters.gpu_shapes import (
    GPU_COUNT_LABEL,
    GPU_PRODUCT_LABEL,
    KAI_RESERVATION_NAMESPACE,
    ShapeWarning,
    is_pool_resource,
    is_unknown_accelerator,
    node_gpus,
    pod_gpus,
    share_for_memory,
)
from defrag.model import units
from defrag.model.cluster import Cluster, ModelError, PodDisruptionBudget
from defrag.model.gc_policy import gc_deferred
from defrag.model.resources import (
    EVICTABLE_ANNOTATION,
    GANG_LABELS,
    GPU_INDICES_ANNOTATION,
    GPU_RESOURCE,
    NVLINK_DOMAINS_ANNOTATION,
    Node,
    OwnerRef,
    Pod,
    Taint,
    Toleration,
)
from defrag.model.selectors import (
    LABEL_SELECTOR_OPERATORS,
    NODE_NAME_FIELD,
    OPERATORS,
    NodeSelector,
    NodeSelectorTerm,
    Requirement,
)
from defrag.model.units import GPU_MILLI, QuantityError
from defrag.model.utc import utc

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_MILLI_ANNOTATION = "defrag.io/gpu-milli"
GPU_MEMORY_ANNOTATION = "defrag.io/gpu-memory"
EXTRA_GANG_LABELS = ("scheduling.x-k8s.io/pod-group", "kueue.x-k8s.io/pod-group-name")
GANG_ANNOTATIONS = ("scheduling.k8s.io/group-name", "pod-group-name")
"""Volcano's PodGroup annotation; KAI-Scheduler's pod grouper annotation."""
PRIORITY_CLASS_LABEL = "priorityClassName"
"""KAI-Scheduler reads a workload's priority class from this label (docs/priority/)."""
GANG_OWNER_KINDS = frozenset(
    {"Job", "PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "TrainJob"}
)
TAINT_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})
SELECTOR_OPERATORS = LABEL_SELECTOR_OPERATORS
UNREADABLE_TAINT = Taint("defrag.io/unreadable-pod", "NoSchedule")
"""Put (in the model only) on a node holding a pod defrag could not read."""
MAX_GPU_INDEX = 1023
"""GPU indices in annotations above this are refused (a hostile range must not cost memory)."""
MAX_QUANTITY = 2**53
"""Model quantities (milli-CPU, MiB, counts) are capped here: fits numpy's int64 sums."""

JsonObj = Mapping[str, Any]


class ConversionError(ValueError):
    """A Kubernetes object that cannot be read: names the object and the JSON field path."""

    def __init__(self, obj: str, path: str, message: str) -> None:
        self.obj = obj
        self.path = path
        self.message = message
        super().__init__(f"{obj}: {path}: {message}" if path else f"{obj}: {message}")


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    global_default: bool = False


@dataclass(slots=True)
class ClusterParts:
    """Objects converted so far; :meth:`build` resolves priorities and makes the Cluster."""

    nodes: list[Node] = field(default_factory=list)
    pods: list[tuple[Pod, bool]] = field(default_factory=list)
    """Each pod with whether ``spec.priority`` was set (else resolved from its class)."""
    pdbs: list[PodDisruptionBudget] = field(default_factory=list)
    priority_classes: list[PriorityClass] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    """Pods left out by a lenient :meth:`build`, with the reason (bound to a node the node list
    did not have, or not fitting their node — e.g. GPUs gone from allocatable under them)."""
    warnings: list[ShapeWarning] = field(default_factory=list)
    """What could not be modelled (unknown accelerator keys, DRA claims, contradicting labels),
    each naming the object and the key; pods marked ``leave_out`` are not in :attr:`pods`."""
    share_memory: dict[str, int] = field(default_factory=dict)
    """Pod key → GPU memory (MiB) its share is asked in; the share is sized at :meth:`build`."""
    strict: bool = False
    """Raise on an object that cannot be read, instead of leaving it out with a warning."""
    skipped_nodes: set[str] = field(default_factory=set)
    """Nodes left out as unreadable: pods bound to them are left out too."""
    hidden_usage: set[str] = field(default_factory=set)
    """Nodes holding a pod that could not be read: what it uses is unknown, so nothing is placed
    there and nothing is planned onto them (taint :data:`UNREADABLE_TAINT` in the model)."""

    def add(self, obj: object, where: str, kind: str | None = None) -> None:
        """Convert one object; ``kind`` overrides ``obj["kind"]`` (API list items carry none).

        An object that cannot be read raises :class:`ConversionError` when :attr:`strict`;
        otherwise it is left out with a warning naming it and the field — one object never
        fails the whole cluster. An unreadable PDB is replaced by one that protects every pod
        of its namespace (nothing there is planned for eviction).
        """
        try:
            if not isinstance(obj, dict):
                raise ConversionError(where, "", f"expected an object, got {type(obj).__name__}")
            kind = kind or obj.get("kind")
            if not isinstance(kind, str) or not kind:
                raise ConversionError(where, "kind", "missing")
        except ConversionError as exc:
            if self.strict:
                raise
            self._left_out(obj if isinstance(obj, dict) else {}, "", exc)
            return
        try:
            self._add(obj, where, kind)
        except ConversionError as exc:
            if self.strict:
                raise
            self._left_out(obj, kind, exc)

    def _left_out(self, obj: JsonObj, kind: str, exc: ConversionError) -> None:
        meta, spec = obj.get("metadata"), obj.get("spec")
        meta = meta if isinstance(meta, dict) else {}
        name = meta.get("name") if isinstance(meta.get("name"), str) else ""
        namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) else ""
        what = "left out"
        if kind == "Node" and name:
            self.skipped_nodes.add(name)
            what = "left out, with the pods bound to it"
        elif kind == "Pod":
            node = spec.get("nodeName") if isinstance(spec, dict) else None
            if isinstance(node, str) and node:
                self.hidden_usage.add(node)
                what = f"left out; node {node} takes no new pods in defrag's plans"
        elif kind == "PodDisruptionBudget":
            self.pdbs.append(PodDisruptionBudget(namespace or "default", name or "?"))
            what = f"replaced by a budget that protects every pod of namespace {namespace!r}"
        self.warnings.append(ShapeWarning(exc.obj, exc.path, f"{exc.message}; {what}", True))

    def _add(self, obj: JsonObj, where: str, kind: str) -> None:
        if kind == "Node":
            self.nodes.append(node_from_json(obj, where, self.warnings))
        elif kind == "Pod":
            found: list[ShapeWarning] = []
            pod, explicit, memory = _pod(obj, where, found)
            self.warnings += found
            if not any(w.leave_out for w in found):
                self.pods.append((pod, explicit))
                if memory:
                    self.share_memory[pod.key] = memory
        elif kind == "PodDisruptionBudget":
            pdb = pdb_from_json(obj, where)
            if pdb is not None:
                self.pdbs.append(pdb)
        elif kind == "PriorityClass":
            self.priority_classes.append(priority_class_from_json(obj, where))
        # Other kinds (Services, Events, …) in a ``kubectl get`` list are ignored.

    def extend(self, other: ClusterParts) -> None:
        self.nodes += other.nodes
        self.pods += other.pods
        self.pdbs += other.pdbs
        self.priority_classes += other.priority_classes
        self.warnings += other.warnings
        self.share_memory.update(other.share_memory)
        self.skipped_nodes.update(other.skipped_nodes)
        self.hidden_usage.update(other.hidden_usage)

    def build(self, lenient: bool = False) -> Cluster:
        """The Cluster. ``lenient`` (the live API, listed kind by kind, so not atomic) drops pods
        bound to a node the node list did not have (recorded in :attr:`dropped`), and when the
        ``defrag.io/gpu-indices`` annotations conflict, ignores them all (slots assumed)."""
        values, default = priority_values(self.priority_classes)
        gpu_memory = {n.name: n.gpu_memory_mib for n in self.nodes}
        largest = max(gpu_memory.values(), default=0)
        pods = [
            resolve_pod(
                pod, explicit, self.share_memory.get(pod.key), values, default, gpu_memory, largest
            )
            for pod, explicit in self.pods
        ]
        self.dropped = []
        warnings = [str(w) for w in self.warnings]
        for pod in [p for p in pods if p.node in self.skipped_nodes]:
            warnings.append(skipped_warning(pod))
        pods = [p for p in pods if p.node not in self.skipped_nodes]
        nodes = [
            replace(n, taints=(*n.taints, UNREADABLE_TAINT)) if n.name in self.hidden_usage else n
            for n in self.nodes
        ]
        if not lenient:
            return Cluster.build(nodes, pods, self.pdbs, values, warnings=warnings)
        names = {n.name for n in self.nodes}
        self.dropped = [p.key for p in pods if p.node is not None and p.node not in names]
        pods = [p for p in pods if p.node is None or p.node in names]
        warnings += [dropped_warning(k) for k in self.dropped]
        cluster, _assumed = build_lenient(nodes, pods, self.pdbs, values, warnings, self.dropped)
        return cluster


def priority_values(classes: Iterable[PriorityClass]) -> tuple[dict[str, int], int]:
    """PriorityClass name → value, and the global default's value (0 without one)."""
    listed = list(classes)
    values = {pc.name: pc.value for pc in listed}
    return values, next((pc.value for pc in listed if pc.global_default), 0)


def resolve_pod(
    pod: Pod,
    explicit: bool,
    memory: int | None,
    values: Mapping[str, int],
    default: int,
    gpu_memory: Mapping[str, int],
    largest: int,
) -> Pod:
    """The pod with its priority resolved from its class (unless ``spec.priority`` was set) and
    a share asked in GPU memory (``memory``, MiB) sized against its GPUs."""
    if not explicit:
        value = values.get(pod.priority_class, default) if pod.priority_class else default
        if value != pod.priority:
            pod = replace(pod, priority=value)
    if memory:
        # A share asked in GPU memory: sized against its node's GPUs, or (pending) against the
        # largest GPUs, where it is smallest; the gpu-memory filter still demands the memory.
        of = gpu_memory.get(pod.node, 0) if pod.node else largest
        pod = replace(pod, gpu_milli=share_for_memory(memory, of, pod.gpu_milli))
    return pod


def skipped_warning(pod: Pod) -> str:
    return f"Pod {pod.key}: spec.nodeName: node {pod.node} was left out; so is it"


def dropped_warning(key: str) -> str:
    return f"Pod {key}: spec.nodeName: no such node; left out"


def build_lenient(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    pdbs: Sequence[PodDisruptionBudget],
    values: Mapping[str, int],
    warnings: list[str],
    dropped: list[str],
) -> tuple[Cluster, bool]:
    """``Cluster.build``; when ``defrag.io/gpu-indices`` annotations conflict, again with them
    all ignored (slots assumed), leaving out (into ``dropped`` and ``warnings``) a pod that
    still does not fit its node. The flag says whether the slots were assumed."""
    try:
        return Cluster.build(nodes, pods, pdbs, values, warnings=warnings), False
    except ModelError:
        assumed = [replace(p, gpu_indices=()) if p.gpu_indices else p for p in pods]

        def misfit(pod: Pod, exc: ModelError) -> None:
            dropped.append(f"{pod.key}: {exc}")
            warnings.append(f"Pod {pod.key}: spec.nodeName: {exc}; left out")

        cluster = Cluster.build(nodes, assumed, pdbs, values, on_misfit=misfit, warnings=warnings)
        return cluster, True


class Piece(NamedTuple):
    """What one object adds to a :class:`ClusterParts` (one object's conversion)."""

    nodes: tuple[Node, ...] = ()
    pods: tuple[tuple[Pod, bool], ...] = ()
    pdbs: tuple[PodDisruptionBudget, ...] = ()
    priority_classes: tuple[Any, ...] = ()
    warnings: tuple[ShapeWarning, ...] = ()
    share_memory: tuple[tuple[str, int], ...] = ()
    skipped_nodes: tuple[str, ...] = ()
    hidden_usage: tuple[str, ...] = ()


def convert(kind: str, obj: Mapping[str, Any], where: str) -> Piece:
    """One object as :meth:`ClusterParts.add` converts it (leniently: an unreadable object is
    a warning, as in a snapshot)."""
    parts = ClusterParts()
    parts.add(obj, where, kind=kind)
    return Piece(
        tuple(parts.nodes),
        tuple(parts.pods),
        tuple(parts.pdbs),
        tuple(parts.priority_classes),
        tuple(parts.warnings),
        tuple(parts.share_memory.items()),
        tuple(parts.skipped_nodes),
        tuple(parts.hidden_usage),
    )


def cluster_from_items(
    items: Iterable[object], source: str = "items", strict: bool = False
) -> Cluster:
    """A Cluster from the items of a v1 List (each with its ``kind``)."""
    parts = ClusterParts(strict=strict)
    for i, obj in enumerate(items):
        parts.add(obj, describe(obj, f"{source}[{i}]"))
    try:
        return parts.build()
    except ModelError as exc:
        raise ConversionError(source, "", str(exc)) from exc


# --- Node ------------------------------------------------------------------------------------


def node_from_json(
    obj: JsonObj, where: str = "node", warnings: list[ShapeWarning] | None = None
) -> Node:
    """The Node; what cannot be modelled of its GPUs is appended to ``warnings``."""
    warn = [] if warnings is None else warnings
    meta = _mapping(obj, "metadata", where)
    name = _name(meta, where)
    who = f"Node {name}"
    spec = _mapping(obj, "spec", who)
    status = _mapping(obj, "status", who)
    alloc = status.get("allocatable")
    alloc_path = "status.allocatable"
    if not alloc:
        alloc, alloc_path = status.get("capacity"), "status.capacity"
    if not isinstance(alloc, dict):
        raise ConversionError(who, "status.allocatable", "missing (and no status.capacity)")
    labels = _str_map(meta, "labels", who)
    annotations = _str_map(meta, "annotations", who)
    cpu = _quantity(alloc, "cpu", f"{alloc_path}.cpu", who, units.cpu_milli, required=True)
    mem = _quantity(alloc, "memory", f"{alloc_path}.memory", who, units.memory_mib, required=True)
    pods = (
        _quantity(alloc, "pods", f"{alloc_path}.pods", who, units.count) if "pods" in alloc else 110
    )
    counts = {
        res: _quantity(alloc, res, f'{alloc_path}["{res}"]', who, units.count)
        for res in alloc
        if res == GPU_RESOURCE
        or is_pool_resource(res)
        or is_unknown_accelerator(res)
        or res.startswith("koordinator.sh/gpu")
    }
    label_path = "metadata.labels"
    if GPU_COUNT_LABEL in labels:
        _int_text(labels[GPU_COUNT_LABEL], f'{label_path}["{GPU_COUNT_LABEL}"]', who)
    shape = node_gpus(who, alloc_path, counts, labels, annotations, warn)
    gpus = shape.num_gpu
    gpu_mem = 0
    if GPU_MEMORY_LABEL in labels:
        gpu_mem = _int_text(labels[GPU_MEMORY_LABEL], f'{label_path}["{GPU_MEMORY_LABEL}"]', who)
    elif shape.gpu_memory_mib:
        gpu_mem = shape.gpu_memory_mib
    domains: tuple[tuple[int, ...], ...] = ()
    if NVLINK_DOMAINS_ANNOTATION in annotations and gpus:
        path = f'metadata.annotations["{NVLINK_DOMAINS_ANNOTATION}"]'
        domains = _nvlink_domains(annotations[NVLINK_DOMAINS_ANNOTATION], gpus, path, who)
    return Node(
        name=name,
        cpu_milli=cpu,
        memory_mib=mem,
        num_gpu=gpus,
        gpu_model=labels.get(GPU_PRODUCT_LABEL, "") if gpus or shape.pools else "",
        gpu_memory_mib=gpu_mem,
        nvlink_domains=domains,
        taints=_taints(spec.get("taints"), who),
        unschedulable=bool(spec.get("unschedulable", False)),
        labels=labels,
        annotations=annotations,
        pools=shape.pools,
        max_pods=pods,
    )


def _nvlink_domains(text: str, gpus: int, path: str, who: str) -> tuple[tuple[int, ...], ...]:
    """``"0-3,4-7"`` → ((0,1,2,3),(4,5,6,7)). Indices ≥ allocatable GPUs (a GPU the device plugin
    withdrew) are dropped; every allocatable GPU must be in exactly one domain."""
    domains: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for part in text.split(","):
        group = tuple(i for i in _index_range(part, path, who) if i < gpus)
        if seen.intersection(group):
            raise ConversionError(who, path, f"GPU {min(seen.intersection(group))} in two domains")
        seen.update(group)
        if group:
            domains.append(group)
    missing = sorted(set(range(gpus)) - seen)
    if missing:
        raise ConversionError(who, path, f"GPU(s) {missing} are in no NVLink domain of {text!r}")
    return tuple(domains)


def _index_range(part: str, path: str, who: str) -> range:
    text = part.strip()
    lo, sep, hi = text.partition("-")
    try:
        start = int(lo)
        stop = int(hi) if sep else start
    except ValueError:
        raise ConversionError(who, path, f"{text!r} is not a GPU index or range a-b") from None
    if start < 0 or stop < start:
        raise ConversionError(who, path, f"{text!r} is not a GPU index or range a-b")
    if stop > MAX_GPU_INDEX:
        raise ConversionError(who, path, f"{text!r}: GPU indices stop at {MAX_GPU_INDEX}")
    return range(start, stop + 1)


def _taints(raw: object, who: str) -> tuple[Taint, ...]:
    out = []
    for i, t in enumerate(_list(raw, who, "spec.taints")):
        path = f"spec.taints[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("key"), str):
            raise ConversionError(who, f"{path}.key", "missing")
        effect = t.get("effect")
        if effect not in TAINT_EFFECTS:
            raise ConversionError(who, f"{path}.effect", f"unknown effect {effect!r}")
        out.append(Taint(key=t["key"], effect=effect, value=str(t.get("value") or "")))
    return tuple(out)


# --- Pod -------------------------------------------------------------------------------------


def pod_from_json(
    obj: JsonObj, where: str = "pod", warnings: list[ShapeWarning] | None = None
) -> tuple[Pod, bool]:
    """The Pod, and whether ``spec.priority`` was set (else its class decides, see ClusterParts).
    What cannot be modelled of its GPU request is appended to ``warnings``."""
    pod, explicit, memory = _pod(obj, where, [] if warnings is None else warnings)
    if memory:  # a share asked in GPU memory, with no node to size it against: a whole GPU
        pod = replace(pod, gpu_milli=share_for_memory(memory, 0))
    return pod, explicit


def _pod(obj: JsonObj, where: str, warn: list[ShapeWarning]) -> tuple[Pod, bool, int]:
    """(pod, explicit priority, GPU memory its share is asked in — 0 when not so asked)."""
    meta = _mapping(obj, "metadata", where)
    name = _name(meta, where)
    namespace = meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise ConversionError(f"Pod {name}", "metadata.namespace", "expected a string")
    who = f"Pod {namespace}/{name}"
    spec = _mapping(obj, "spec", who)
    status = _obj(obj.get("status"), who, "status")
    labels = _str_map(meta, "labels", who)
    annotations = _str_map(meta, "annotations", who)
    node = spec.get("nodeName") or None
    if node is not None and not isinstance(node, str):
        raise ConversionError(who, "spec.nodeName", f"expected a string, got {node!r}")
    shape = _shape(spec, namespace, annotations, node is not None, who, warn)
    num_gpu, gpu_milli, gpu_memory = shape.num_gpu, shape.gpu_milli, shape.gpu_memory_mib

    priority = spec.get("priority")
    explicit = priority is not None
    if explicit and not _int32(priority):
        raise ConversionError(who, "spec.priority", f"expected a 32-bit integer, got {priority!r}")

    gpu_indices: tuple[int, ...] = ()
    if GPU_INDICES_ANNOTATION in annotations and node is not None and num_gpu:
        path = f'metadata.annotations["{GPU_INDICES_ANNOTATION}"]'
        indices = [
            i
            for part in annotations[GPU_INDICES_ANNOTATION].split(",")
            if part.strip()
            for i in _index_range(part, path, who)
        ]
        if len(set(indices)) != len(indices):
            raise ConversionError(who, path, "a GPU index appears twice")
        gpu_indices = tuple(sorted(indices))

    owner = _owner(meta, who)
    created = _time(meta.get("creationTimestamp"), "metadata.creationTimestamp", who)
    deleting = _time(meta.get("deletionTimestamp"), "metadata.deletionTimestamp", who)
    phase = status.get("phase") or "Pending"
    pending_since, pending_reason = _pending(status, who)
    scheduled_at = _scheduled(status, who) if node is not None else None
    if pending_since is None and node is None and phase == "Pending":
        pending_since = created
    if namespace == KAI_RESERVATION_NAMESPACE and EVICTABLE_ANNOTATION not in annotations:
        # KAI's GPU reservation pods hold GPUs for fractional pods: never defrag's to move.
        annotations = {**annotations, EVICTABLE_ANNOTATION: "false"}

    pod = Pod(
        name=name,
        namespace=namespace,
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        cpu_milli=shape.cpu_milli,
        memory_mib=shape.memory_mib,
        gpu_models=shape.gpu_models,
        gpu_memory_mib=gpu_memory,
        priority=priority if isinstance(priority, int) else 0,
        priority_class=str(spec.get("priorityClassName") or labels.get(PRIORITY_CLASS_LABEL) or ""),
        qos=str(status.get("qosClass") or ""),
        owner=owner,
        gang=_gang(labels, annotations, owner),
        phase=str(phase),
        node=node,
        gpu_indices=gpu_indices,
        created_at=created,
        pending_since=pending_since,
        pending_reason=pending_reason,
        scheduled_at=scheduled_at,
        tolerations=shape.tolerations,
        uid=str(meta.get("uid") or ""),
        labels=labels,
        annotations=annotations,
        node_selector=shape.node_selector,
        affinity=shape.affinity,
        scheduling_gates=shape.gates,
        gated=bool(shape.gates),
        pool=shape.pool,
        pool_units=shape.pool_units,
        deleting_since=deleting,
    )
    return pod, explicit, shape.share_memory_mib


class _Shape(NamedTuple):
    """What a pod's spec and annotations say it asks for and where it may run: the same for
    every pod of one template (a Job's, a ReplicaSet's), so made once per template."""

    num_gpu: int
    gpu_milli: int
    gpu_memory_mib: int
    share_memory_mib: int
    cpu_milli: int
    memory_mib: int
    pool: str
    pool_units: int
    gpu_models: frozenset[str]
    tolerations: tuple[Toleration, ...]
    node_selector: Mapping[str, str]
    affinity: NodeSelector | None
    gates: tuple[str, ...]


_SPEC_FIELDS = (
    "containers",
    "initContainers",
    "overhead",
    "resourceClaims",
    "nodeSelector",
    "affinity",
    "tolerations",
    "schedulingGates",
)
"""The ``spec`` fields :class:`_Shape` is made of."""
_CONTAINER_FIELDS = ("resources", "restartPolicy")
"""What :func:`_pod_requests` reads of a container."""
SHAPES_KEPT = 4096
_shapes: dict[str, _Shape] = {}


def _keyed(field: str, value: object) -> object:
    """``value`` as the shape cache keys it: a container by what is read of it only. A pod's
    containers carry what differs from pod to pod of one template — the API server mounts each
    pod's own service-account token volume (``kube-api-access-<random>``) into every container
    — so keyed whole, every pod an extender is asked about (ExtenderArgs carries the whole
    pod) would be a new entry, and the cache would fill and empty over and over."""
    if field not in ("containers", "initContainers") or not isinstance(value, list):
        return value
    return [[c.get(k) for k in _CONTAINER_FIELDS] if isinstance(c, dict) else c for c in value]


def _shape(
    spec: JsonObj,
    namespace: str,
    annotations: Mapping[str, str],
    bound: bool,
    who: str,
    warn: list[ShapeWarning],
) -> _Shape:
    """The pod's :class:`_Shape`: looked up by the JSON it is made of, else made. One that
    warned (the warning names the pod) is made for each pod and not kept."""
    key = repr((namespace, bound, annotations, [_keyed(f, spec.get(f)) for f in _SPEC_FIELDS]))
    shape = _shapes.get(key)
    if shape is not None:
        return shape
    found: list[ShapeWarning] = []
    requests = _pod_requests(spec, who)
    gpu_request = requests.get(GPU_RESOURCE, Decimal(0))
    if gpu_request != gpu_request.to_integral_value():
        raise ConversionError(
            who,
            "spec.containers[*].resources",
            f"{GPU_RESOURCE} request {gpu_request} is fractional",
        )
    claims = _list(spec.get("resourceClaims"), who, "spec.resourceClaims")
    gpus = pod_gpus(who, namespace, requests, annotations, bool(claims), bound, found)
    num_gpu, gpu_milli = gpus.num_gpu, gpus.gpu_milli
    if GPU_MILLI_ANNOTATION in annotations:
        path = f'metadata.annotations["{GPU_MILLI_ANNOTATION}"]'
        gpu_milli = _int_text(annotations[GPU_MILLI_ANNOTATION], path, who)
        if not 1 <= gpu_milli <= GPU_MILLI:
            raise ConversionError(who, path, f"{gpu_milli} is outside 1..{GPU_MILLI}")
        if gpu_milli < GPU_MILLI:
            if num_gpu > 1:
                raise ConversionError(
                    who, path, f"a GPU share needs one GPU, but the pod requests {num_gpu}"
                )
            num_gpu = 1
    gpu_memory = gpus.gpu_memory_mib
    if GPU_MEMORY_ANNOTATION in annotations:
        path = f'metadata.annotations["{GPU_MEMORY_ANNOTATION}"]'
        gpu_memory = _convert(annotations[GPU_MEMORY_ANNOTATION], units.memory_mib, path, who)
    gates = tuple(
        str(g.get("name") or "") if isinstance(g, dict) else str(g)
        for g in _list(spec.get("schedulingGates"), who, "spec.schedulingGates")
    )
    shape = _Shape(
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        gpu_memory_mib=gpu_memory,
        share_memory_mib=gpus.share_memory_mib if GPU_MILLI_ANNOTATION not in annotations else 0,
        cpu_milli=_ceil(requests["cpu"] * 1000),
        memory_mib=_ceil(requests["memory"] / 2**20),
        pool=gpus.pool,
        pool_units=gpus.pool_units,
        gpu_models=_gpu_models(spec, who),
        tolerations=_tolerations(spec.get("tolerations"), who),
        node_selector=_str_map(spec, "nodeSelector", who, "spec.nodeSelector"),
        affinity=_node_affinity(spec, who),
        gates=gates,
    )
    warn += found
    if not found:
        if len(_shapes) >= SHAPES_KEPT:
            _shapes.clear()
        _shapes[key] = shape
    return shape


_POD_RESOURCES = ("cpu", "memory")


def _pod_requests(spec: JsonObj, who: str) -> dict[str, Decimal]:
    """The pod's effective requests, as the scheduler computes them (KEP-753 sidecars included):
    max(sum of app containers + sidecars, each init container + the sidecars started before it),
    plus ``spec.overhead``. Every resource named; ``cpu`` and ``memory`` always present."""
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise ConversionError(who, "spec.containers", "missing or empty")
    app: dict[str, Decimal] = dict.fromkeys(_POD_RESOURCES, Decimal(0))
    for i, c in enumerate(containers):
        for res, value in _container_requests(c, f"spec.containers[{i}]", who).items():
            app[res] = app.get(res, Decimal(0)) + value
    init_peak: dict[str, Decimal] = {}
    sidecars: dict[str, Decimal] = {}
    inits = _list(spec.get("initContainers") or [], who, "spec.initContainers")
    for i, c in enumerate(inits):
        req = _container_requests(c, f"spec.initContainers[{i}]", who)
        sidecar = c.get("restartPolicy") == "Always"  # c is an object: checked above
        for res in {*req, *sidecars}:
            peak = sidecars.get(res, Decimal(0)) + req.get(res, Decimal(0))
            init_peak[res] = max(init_peak.get(res, Decimal(0)), peak)
            if sidecar:
                sidecars[res] = sidecars.get(res, Decimal(0)) + req.get(res, Decimal(0))
    overhead = _obj(spec.get("overhead"), who, "spec.overhead")
    out = {}
    for res in {*app, *sidecars, *init_peak}:
        total = max(
            app.get(res, Decimal(0)) + sidecars.get(res, Decimal(0)),
            init_peak.get(res, Decimal(0)),
        )
        if res in overhead:
            total += _quantity(overhead, res, f"spec.overhead.{res}", who, units.parse_quantity)
        out[res] = total
    return out


def _container_requests(c: object, path: str, who: str) -> dict[str, Decimal]:
    if not isinstance(c, dict):
        raise ConversionError(who, path, "expected an object")
    resources = _obj(c.get("resources"), who, f"{path}.resources")
    requests = _obj(resources.get("requests"), who, f"{path}.resources.requests")
    limits = _obj(resources.get("limits"), who, f"{path}.resources.limits")
    out = {}
    for res in {*requests, *limits}:
        # Kubernetes defaults a missing request to the limit (always so for extended resources).
        if res in requests:
            out[res] = _quantity(
                requests, res, f"{path}.resources.requests.{res}", who, units.parse_quantity
            )
        else:
            out[res] = _quantity(
                limits, res, f"{path}.resources.limits.{res}", who, units.parse_quantity
            )
    return out


def _gpu_models(spec: JsonObj, who: str) -> frozenset[str]:
    """Allowed GPU models from ``nodeSelector`` and the required node affinity; empty = any."""
    selector = _obj(spec.get("nodeSelector"), who, "spec.nodeSelector")
    models: set[str] | None = None
    if GPU_PRODUCT_LABEL in selector:
        models = {str(selector[GPU_PRODUCT_LABEL])}
    base = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    affinity = _obj(spec.get("affinity"), who, "spec.affinity")
    node_affinity = _obj(affinity.get("nodeAffinity"), who, "spec.affinity.nodeAffinity")
    required = _obj(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"), who, base)
    terms = _list(required.get("nodeSelectorTerms"), who, f"{base}.nodeSelectorTerms")
    term_models: set[str] = set()
    for t, term in enumerate(terms):
        path = f"{base}.nodeSelectorTerms[{t}]"
        exprs = _list(
            _obj(term, who, path).get("matchExpressions"), who, f"{path}.matchExpressions"
        )
        found = [
            e
            for e in exprs
            if isinstance(e, dict)
            and e.get("key") == GPU_PRODUCT_LABEL
            and e.get("operator") == "In"
        ]
        if not found:
            return frozenset(models or ())  # a term without a model constraint admits any model
        for e in found:
            term_models.update(str(v) for v in _list(e.get("values"), who, f"{path}.values"))
    if terms:
        models = term_models if models is None else models & term_models
    return frozenset(models or ())


def _node_affinity(spec: JsonObj, who: str) -> NodeSelector | None:
    """The required node affinity (``requiredDuringSchedulingIgnoredDuringExecution``) with every
    operator and ``matchFields``; None when the pod has none."""
    base = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    affinity = _obj(spec.get("affinity"), who, "spec.affinity")
    node_affinity = _obj(affinity.get("nodeAffinity"), who, "spec.affinity.nodeAffinity")
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return None
    if not isinstance(required, dict):
        raise ConversionError(who, base, "expected an object")
    terms = []
    raw_terms = _list(required.get("nodeSelectorTerms"), who, f"{base}.nodeSelectorTerms")
    for t, term in enumerate(raw_terms):
        path = f"{base}.nodeSelectorTerms[{t}]"
        if not isinstance(term, dict):
            raise ConversionError(who, path, "expected an object")
        exprs = _requirements(term.get("matchExpressions"), f"{path}.matchExpressions", who)
        fields = _requirements(term.get("matchFields"), f"{path}.matchFields", who)
        for i, r in enumerate(fields):
            if r.key != NODE_NAME_FIELD or r.operator not in ("In", "NotIn"):
                raise ConversionError(
                    who,
                    f"{path}.matchFields[{i}]",
                    f"only {NODE_NAME_FIELD} with In or NotIn is supported, got {r}",
                )
        terms.append(NodeSelectorTerm(exprs, fields))
    return NodeSelector(tuple(terms))


def _requirements(
    raw: object, path: str, who: str, operators: frozenset[str] = OPERATORS
) -> tuple[Requirement, ...]:
    out = []
    for i, e in enumerate(_list(raw, who, path)):
        where = f"{path}[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("key"), str):
            raise ConversionError(who, f"{where}.key", "missing")
        op = e.get("operator")
        if not isinstance(op, str) or op not in operators:
            raise ConversionError(who, f"{where}.operator", f"unknown operator {op!r}")
        values = tuple(str(v) for v in _list(e.get("values"), who, f"{where}.values"))
        if op in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
            raise ConversionError(who, f"{where}.values", f"{op} needs one integer value")
        out.append(Requirement(e["key"], op, values))
    return tuple(out)


def _owner(meta: JsonObj, who: str) -> OwnerRef | None:
    refs = _list(meta.get("ownerReferences") or [], who, "metadata.ownerReferences")
    chosen: OwnerRef | None = None
    for i, ref in enumerate(refs):
        if not isinstance(ref, dict) or not ref.get("kind") or not ref.get("name"):
            raise ConversionError(who, f"metadata.ownerReferences[{i}]", "needs kind and name")
        for key in ("kind", "name", "apiVersion", "uid"):
            if key in ref and not isinstance(ref[key], str):
                raise ConversionError(
                    who, f"metadata.ownerReferences[{i}].{key}", "expected a string"
                )
        owner = OwnerRef(
            kind=ref["kind"],
            name=ref["name"],
            controller=ref.get("controller") is True,
            api_version=ref.get("apiVersion", ""),
            uid=ref.get("uid", ""),
        )
        if owner.controller:
            return owner
        chosen = chosen or owner
    return chosen


def _gang(
    labels: Mapping[str, str], annotations: Mapping[str, str], owner: OwnerRef | None
) -> str | None:
    for label in (*GANG_LABELS, *EXTRA_GANG_LABELS):
        if labels.get(label):
            return labels[label]
    for key in GANG_ANNOTATIONS:
        if annotations.get(key):
            return annotations[key]
    if owner is not None and owner.controller and owner.kind in GANG_OWNER_KINDS:
        return f"{owner.kind.lower()}/{owner.name}"
    return None


def _pending(status: JsonObj, who: str) -> tuple[datetime | None, str]:
    conditions = _list(status.get("conditions") or [], who, "status.conditions")
    for i, cond in enumerate(conditions):
        if isinstance(cond, dict) and cond.get("type") == "PodScheduled":
            if cond.get("status") == "False":
                path = f"status.conditions[{i}].lastTransitionTime"
                return _time(cond.get("lastTransitionTime"), path, who), str(
                    cond.get("reason") or ""
                )
            return None, ""
    return None, ""


def _scheduled(status: JsonObj, who: str) -> datetime | None:
    """The bind time: the ``PodScheduled`` condition's ``lastTransitionTime`` when its status is
    True (k8s.io/api core/v1 types.go: ``PodScheduled`` "represents status of the scheduling
    process for this pod", ``PodCondition.LastTransitionTime``)."""
    conditions = _list(status.get("conditions") or [], who, "status.conditions")
    for i, cond in enumerate(conditions):
        if isinstance(cond, dict) and cond.get("type") == "PodScheduled":
            if cond.get("status") != "True":
                return None
            path = f"status.conditions[{i}].lastTransitionTime"
            return _time(cond.get("lastTransitionTime"), path, who)
    return None


def _tolerations(raw: object, who: str) -> tuple[Toleration, ...]:
    out = []
    for i, t in enumerate(_list(raw, who, "spec.tolerations")):
        if not isinstance(t, dict):
            raise ConversionError(who, f"spec.tolerations[{i}]", "expected an object")
        operator = t.get("operator") or "Equal"
        if operator not in ("Equal", "Exists"):
            raise ConversionError(
                who, f"spec.tolerations[{i}].operator", f"unknown operator {operator!r}"
            )
        out.append(
            Toleration(
                key=str(t.get("key") or ""),
                operator=operator,
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
        )
    return tuple(out)


def _ceil(value: Decimal) -> int:
    return min(int(value.to_integral_value(rounding=ROUND_CEILING)), MAX_QUANTITY)


# --- PodDisruptionBudget, PriorityClass ------------------------------------------------------


def pdb_from_json(obj: JsonObj, where: str = "pdb") -> PodDisruptionBudget | None:
    """The PDB; None for one with no selector (policy/v1: a null selector selects no pod)."""
    meta = _mapping(obj, "metadata", where)
    name = _name(meta, where)
    namespace = str(meta.get("namespace") or "default")
    who = f"PodDisruptionBudget {namespace}/{name}"
    spec = _mapping(obj, "spec", who)
    selector = spec.get("selector")
    if selector is None:
        return None
    if not isinstance(selector, dict):
        raise ConversionError(who, "spec.selector", "expected an object")
    match_labels = _str_map(selector, "matchLabels", who, "spec.selector.matchLabels")
    exprs = _requirements(
        selector.get("matchExpressions"),
        "spec.selector.matchExpressions",
        who,
        SELECTOR_OPERATORS,
    )
    status = _obj(obj.get("status"), who, "status")
    allowed = status.get("disruptionsAllowed", 0)
    if not isinstance(allowed, int) or isinstance(allowed, bool) or allowed < 0:
        raise ConversionError(
            who, "status.disruptionsAllowed", f"expected a non-negative integer, got {allowed!r}"
        )
    return PodDisruptionBudget(
        namespace=namespace,
        name=name,
        match_labels=match_labels,
        match_expressions=exprs,
        disruptions_allowed=allowed,
    )


def priority_class_from_json(obj: JsonObj, where: str = "priorityclass") -> PriorityClass:
    meta = _mapping(obj, "metadata", where)
    name = _name(meta, where)
    who = f"PriorityClass {name}"
    value = obj.get("value")
    if not _int32(value):
        raise ConversionError(who, "value", f"expected a 32-bit integer, got {value!r}")
    return PriorityClass(name=name, value=value, global_default=bool(obj.get("globalDefault")))


def paused_gc() -> AbstractContextManager[None]:
    """Pause the cyclic garbage collector while a snapshot's hundreds of thousands of acyclic
    objects are made; it would walk them again and again (a third of the CPU at 40,000 pods).
    The model's one collector policy (:func:`defrag.model.gc_policy.gc_deferred`), paused."""
    return gc_deferred(None)


# --- helpers ---------------------------------------------------------------------------------


def describe(obj: object, fallback: str) -> str:
    """``Kind ns/name`` when the object says so, else its list position."""
    if isinstance(obj, dict):
        meta = obj.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("name"), str):
            ns = meta.get("namespace")
            ident = f"{ns}/{meta['name']}" if ns else meta["name"]
            return f"{obj.get('kind') or 'object'} {ident} ({fallback})"
    return fallback


def _mapping(obj: JsonObj, key: str, who: str) -> JsonObj:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConversionError(who, key, f"expected an object, got {type(value).__name__}")
    return value


def _int32(value: object) -> TypeGuard[int]:
    """An int32, as Pod ``spec.priority`` and PriorityClass ``value`` are in the API."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**31) <= value < 2**31


def _obj(value: object, who: str, path: str) -> JsonObj:
    """A JSON object field: None (or empty) is ``{}``; anything else but an object is the
    object's mistake."""
    if value is None or value == "" or value == [] or value is False:
        return {}
    if not isinstance(value, dict):
        raise ConversionError(who, path, f"expected an object, got {type(value).__name__}")
    return value


def _list(value: object, who: str, path: str) -> list[Any]:
    """A JSON array field: None is empty; anything else but a list is the object's mistake."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConversionError(who, path, "expected a list")
    return value


def _name(meta: JsonObj, where: str) -> str:
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ConversionError(where, "metadata.name", "missing")
    return name


def _str_map(obj: JsonObj, key: str, who: str, path: str | None = None) -> dict[str, str]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConversionError(who, path or f"metadata.{key}", "expected an object")
    for v in value.values():
        if type(v) is not str:
            return {str(k): str(v) for k, v in value.items()}
    return value  # JSON keys are strings: the parsed map is used as it is, not copied


def _int_text(text: str, path: str, who: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise ConversionError(who, path, f"{text!r} is not an integer") from None


@lru_cache(maxsize=4096)
def _cached(fn: Any, value: str | int | float) -> Any:
    return fn(value)


def _convert(value: object, fn: Any, path: str, who: str) -> Any:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ConversionError(who, path, f"not a quantity: {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConversionError(who, path, f"not a finite quantity: {value!r}")
    try:
        result = _cached(fn, value)
    except QuantityError as exc:
        raise ConversionError(who, path, str(exc)) from None
    if result < 0:
        raise ConversionError(who, path, f"negative quantity {value!r}")
    # A quantity Kubernetes accepts (``1E`` CPUs) may exceed what an int64 sum holds: capped.
    return min(result, MAX_QUANTITY) if isinstance(result, int) else result


def _quantity(obj: JsonObj, key: str, path: str, who: str, fn: Any, required: bool = False) -> Any:
    if key not in obj:
        if required:
            raise ConversionError(who, path, "missing")
        return fn(0)
    return _convert(obj[key], fn, path, who)


def _time(value: object, path: str, who: str) -> datetime | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConversionError(who, path, f"expected an RFC 3339 time, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ConversionError(who, path, f"{value!r} is not an RFC 3339 time") from None
    return utc(parsed)


def items_of(document: object, where: str) -> Sequence[object]:
    """The items of a ``v1 List`` (or any ``…List``), or a single object as a one-item list."""
    if not isinstance(document, dict):
        raise ConversionError(where, "", "expected a Kubernetes object or List")
    if "items" in document:
        return _list(document["items"], where, "items")
    return [document]
