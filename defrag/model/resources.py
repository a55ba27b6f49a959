"""Frozen nodes, GPUs and pods: the objects the whole of defrag reasons about."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from defrag.model.selectors import NodeSelector, labels_match
from defrag.model.units import GPU_MILLI

EVICTABLE_ANNOTATION = "defrag.io/evictable"
CHECKPOINT_ANNOTATION = "defrag.io/last-checkpoint"
CHECKPOINT_SUPPORT_ANNOTATION = "defrag.io/checkpoint"
"""Set by a workload (on its pod template) to ``supported``: defrag asks it for a checkpoint
before evicting it and waits for ``defrag.io/last-checkpoint`` (docs/daemon.md)."""
CHECKPOINT_SUPPORTED = "supported"
GPU_INDICES_ANNOTATION = "defrag.io/gpu-indices"
NVLINK_DOMAINS_ANNOTATION = "defrag.io/nvlink-domains"
RESERVED_FOR_ANNOTATION = "defrag.io/reserved-for"
"""On a node: who may be scheduled there. Comma-separated holders, each ``<namespace>/<pod>``
(the pod a make-room plan freed the node for) or ``owner:<namespace>/<Kind>/<name>`` (any pod of
that controller: the replacement of a pod a repack moves there). See :func:`reservation_admits`."""
OWNER_HOLDER_PREFIX = "owner:"
DRAIN_TAINT_KEY = "defrag.io/draining"
GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource of whole NVIDIA GPUs (NVIDIA k8s-device-plugin)."""

GANG_LABELS = ("job-name", "training.kubeflow.org/job-name", "volcano.sh/job-name")

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration. An empty key with operator Exists tolerates every taint."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """A pod's ``metadata.ownerReferences`` entry: its controlling one, else the first (then
    ``controller`` is False, and nothing has promised to recreate the pod)."""

    kind: str
    name: str
    controller: bool = True
    api_version: str = ""
    """As the reference gives it (``apps/v1``); "" where the source has none (trace pods)."""
    uid: str = ""
    """The owner's UID the reference names; "" where the source has none."""

    @property
    def group(self) -> str:
        """The API group of ``api_version`` ("" for the core group, and when unknown)."""
        return self.api_version.rpartition("/")[0]


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    model: str
    memory_mib: int
    domain: int


@dataclass(frozen=True, slots=True)
class Node:
    """A node's capacity (allocatable) and scheduling attributes. GPUs on one node share a model."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_model: str = ""
    gpu_memory_mib: int = 0
    nvlink_domains: tuple[tuple[int, ...], ...] = ()
    """Groups of GPU indices linked by NVLink; empty means one domain holding every GPU."""
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)
    pools: Mapping[str, int] = field(default_factory=dict, hash=False)
    """GPU units that are not exclusive whole GPUs, by the resource a pod asks them with: MIG
    profiles (``nvidia.com/mig-1g.10gb``), time-sliced replicas (``nvidia.com/gpu.shared``, or
    ``nvidia.com/gpu`` itself when the device plugin does not rename them — then ``num_gpu`` is
    0). Pool units never count toward whole-GPU jobs."""
    max_pods: int = 110
    """How many pods the node runs at most: ``status.allocatable.pods`` (the kubelet's
    ``maxPods``, 110 by default and when not reported)."""

    @property
    def domains(self) -> tuple[tuple[int, ...], ...]:
        if self.nvlink_domains:
            return self.nvlink_domains
        return (tuple(range(self.num_gpu)),) if self.num_gpu else ()

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        domain_of = {i: d for d, group in enumerate(self.domains) for i in group}
        return tuple(
            Gpu(i, self.gpu_model, self.gpu_memory_mib, domain_of.get(i, 0))
            for i in range(self.num_gpu)
        )


PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod's resource shape, scheduling constraints, ownership and (when bound) placement.

    ``gpu_milli`` is the share of *each* requested GPU (1000 = whole GPUs); a GPU-sharing pod
    has ``num_gpu == 1`` and ``gpu_milli < 1000``.
    """

    name: str
    namespace: str = "default"
    num_gpu: int = 0
    gpu_milli: int = GPU_MILLI
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: frozenset[str] = frozenset()
    """Allowed GPU models; empty = any."""
    gpu_memory_mib: int = 0
    """GPU memory needed on each GPU; 0 = not asked."""
    priority: int = 0
    priority_class: str = ""
    qos: str = ""
    owner: OwnerRef | None = None
    gang: str | None = None
    phase: str = "Pending"
    node: str | None = None
    gpu_indices: tuple[int, ...] = ()
    created_at: datetime | None = None
    pending_since: datetime | None = None
    pending_reason: str = ""
    scheduled_at: datetime | None = None
    """When it was bound: the ``PodScheduled`` condition's ``lastTransitionTime`` while its
    status is True (None: not bound, or not known)."""
    tolerations: tuple[Toleration, ...] = ()
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    """``spec.nodeSelector``: labels every candidate node must carry."""
    affinity: NodeSelector | None = None
    """The required node affinity (``requiredDuringSchedulingIgnoredDuringExecution``)."""
    scheduling_gates: tuple[str, ...] = ()
    """``spec.schedulingGates``: while any remains, the scheduler does not consider the pod."""
    gated: bool = False
    """Held by scheduling gates, as the source tells it: ``spec.schedulingGates`` non-empty (the
    API), or the reason ``SchedulingGated`` (kube-state-metrics' ``kube_pod_status_reason``,
    which names no gate). A gated pod is not the scheduler's to place yet: never starving,
    never given room (read :attr:`is_gated`, which also holds for gates alone)."""
    pool: str = ""
    """A request of pool units (a MIG profile, ``nvidia.com/gpu.shared``); see ``Node.pools``."""
    pool_units: int = 0
    deleting_since: datetime | None = None
    """``metadata.deletionTimestamp``: set by the API server on a graceful delete (or an
    eviction); the pod is Terminating. It still holds its node's resources until it is gone,
    but it is already going: never a victim, never evicted, never pending."""

    @property
    def checkpoints_on_request(self) -> bool:
        """The workload answers a checkpoint request (``defrag.io/checkpoint: supported``)."""
        value = self.annotations.get(CHECKPOINT_SUPPORT_ANNOTATION, "")
        return value.strip().lower() == CHECKPOINT_SUPPORTED

    @property
    def terminating(self) -> bool:
        """Being deleted (``metadata.deletionTimestamp`` set): on its way out."""
        return self.deleting_since is not None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def gpu_demand_milli(self) -> int:
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0

    @property
    def is_sharing(self) -> bool:
        return self.num_gpu > 0 and self.gpu_milli < GPU_MILLI

    @property
    def is_gated(self) -> bool:
        """Held back by scheduling gates (Kueue admission, …): not schedulable yet."""
        return self.gated or bool(self.scheduling_gates)

    @property
    def uses_gpu(self) -> bool:
        """Asks for GPUs in any form: whole, a share, or pool units."""
        return self.num_gpu > 0 or self.pool_units > 0

    @property
    def has_node_constraints(self) -> bool:
        return bool(self.node_selector) or self.affinity is not None

    def constraint_key(self) -> tuple[object, ...]:
        """What decides which nodes the pod's selector and affinity admit (for caching)."""
        return (tuple(sorted(self.node_selector.items())), self.affinity)

    def admits_node(self, labels: Mapping[str, str], name: str) -> bool:
        """Whether ``nodeSelector`` and the required node affinity admit this node."""
        if not labels_match(self.node_selector, labels):
            return False
        return self.affinity is None or self.affinity.matches(labels, name)

    @property
    def is_daemonset(self) -> bool:
        return self.owner is not None and self.owner.kind == "DaemonSet"

    @property
    def gang_key(self) -> str | None:
        """Pods that must move together share this key (namespace-qualified)."""
        if self.gang:
            return f"{self.namespace}/{self.gang}"
        return None

    def tolerates_all(self, taints: tuple[Taint, ...]) -> bool:
        return all(
            taint.effect == "PreferNoSchedule" or any(t.tolerates(taint) for t in self.tolerations)
            for taint in taints
        )


def owner_holder(namespace: str, owner: OwnerRef) -> str:
    """The ``defrag.io/reserved-for`` holder naming every pod of ``owner`` in ``namespace``."""
    return f"{OWNER_HOLDER_PREFIX}{namespace}/{owner.kind}/{owner.name}"


def reservation_holders(value: str) -> tuple[str, ...]:
    """The holders a ``defrag.io/reserved-for`` value names (comma-separated, blanks dropped)."""
    return tuple(h for h in (part.strip() for part in value.split(",")) if h)


def reservation_admits(value: str, pod: Pod) -> bool:
    """Whether a node reserved with ``value`` admits ``pod``: it is a named pod, or its
    controlling owner is a named owner (same namespace, kind and name)."""
    for holder in reservation_holders(value):
        if holder.startswith(OWNER_HOLDER_PREFIX):
            if pod.owner is not None and holder == owner_holder(pod.namespace, pod.owner):
                return True
        elif holder == pod.key:
            return True
    return False
