"""A model :class:`~defrag.model.cluster.Cluster` (the simulator's view of its state) written back
as the Kubernetes v1 JSON an API server would serve for it: Nodes, Pods, their controllers.

The differential test (tests/test_one_decision.py) serves these objects with the API emulator
(tests/support/kubeapi.py) and reads them through the daemon's own snapshot source, so every
field below is one the converter (defrag/adapters/kube_convert.py) reads, in the shape the
upstream API gives it (k8s.io/api core/v1 types.go):

* Node ``status.allocatable``: ``cpu`` (milli-CPU ``"<n>m"``), ``memory`` (``"<n>Mi"``),
  ``pods`` and ``nvidia.com/gpu`` (NVIDIA device plugin); GPU Feature Discovery labels
  ``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory`` and ``nvidia.com/gpu.count``;
  ``defrag.io/nvlink-domains`` when the node has domains; ``spec.taints``,
  ``spec.unschedulable``.
* Pod ``spec.containers[0].resources``: ``cpu`` and ``memory`` requests, ``nvidia.com/gpu`` in
  requests and limits (an extended resource's request must equal its limit); a GPU share as
  ``defrag.io/gpu-milli`` with one ``nvidia.com/gpu``; the bound GPU slots as
  ``defrag.io/gpu-indices`` (kube_convert's conventions, docs/kubernetes.md).
* ``spec.priority`` (int32, as priority admission fills it in), ``spec.priorityClassName`` when
  the model names one; ``spec.nodeName`` on a bound pod; the default tolerations the
  DefaultTolerationSeconds admission plugin adds (not-ready, unreachable: NoExecute, 300 s).
* ``metadata``: ``uid``, ``creationTimestamp``, ``labels``, ``annotations`` (the model's, e.g.
  ``defrag.io/last-checkpoint``), ``ownerReferences`` with ``controller: true``, ``apiVersion``,
  ``kind``, ``name`` and the owner's ``uid`` (all four required by meta/v1 OwnerReference).
* ``status``: ``phase``; the ``PodScheduled`` condition — ``True`` with the bind time as its
  ``lastTransitionTime`` on a bound pod, ``False`` with reason ``Unschedulable`` and the time it
  became so on a pending one (kube_convert reads that as ``pending_since``); ``qosClass``.

Times are RFC 3339 with microseconds. The API server writes ``metav1.Time`` in whole seconds;
the simulator's clock is finer, and the same world must show the same times on both sides.

The controllers (ReplicaSet apps/v1, Job batch/v1) are the objects the emulator creates for a
pod's controlling reference (:meth:`tests.support.kubeapi.KubeApi.put`): name, namespace, the
UID the reference names, a Job's API default ``backoffLimit: 6``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from defrag.adapters.gpu_shapes import GPU_COUNT_LABEL, GPU_PRODUCT_LABEL
from defrag.adapters.kube_convert import GPU_MEMORY_LABEL, GPU_MILLI_ANNOTATION
from defrag.model.cluster import Cluster
from defrag.model.resources import (
    GPU_INDICES_ANNOTATION,
    GPU_RESOURCE,
    NVLINK_DOMAINS_ANNOTATION,
    Node,
    Pod,
)
from defrag.model.units import GPU_MILLI
from defrag.model.utc import utc

Obj = dict[str, Any]

UPSTREAM_QOS = "Burstable"
"""The ``status.qosClass`` the API server computes for these pods (requests without equal CPU
and memory limits: Burstable, core/v1 ``PodQOSClass``)."""

DEFAULT_TOLERATIONS = [
    {
        "key": key,
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    }
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
]


def uid(kind: str, namespace: str, name: str) -> str:
    """A stable UID for an object (the same world gets the same UIDs)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"defrag-sim/{kind}/{namespace}/{name}"))


def rfc3339(at: datetime) -> str:
    return utc(at).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def kube_objects(cluster: Cluster, qos_class: Callable[[Pod], str] | None = None) -> list[Obj]:
    """Every node and pod of ``cluster`` as API objects. ``qos_class``: the ``status.qosClass``
    a pod shows (default :data:`UPSTREAM_QOS`, what the API server computes)."""
    qos = qos_class or (lambda _pod: UPSTREAM_QOS)
    nodes = [node_object(n) for n in cluster.nodes]
    return nodes + [pod_object(p, qos(p)) for p in cluster.pods.values()]


def node_object(node: Node) -> Obj:
    allocatable = {
        "cpu": f"{node.cpu_milli}m",
        "memory": f"{node.memory_mib}Mi",
        "pods": str(node.max_pods),
        "ephemeral-storage": "7804Gi",
    }
    labels = {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux"}
    if node.num_gpu:
        allocatable[GPU_RESOURCE] = str(node.num_gpu)
        labels |= {
            GPU_PRODUCT_LABEL: node.gpu_model,
            GPU_MEMORY_LABEL: str(node.gpu_memory_mib),
            GPU_COUNT_LABEL: str(node.num_gpu),
        }
    labels |= dict(node.labels)
    annotations = {"node.alpha.kubernetes.io/ttl": "0", **node.annotations}
    if node.nvlink_domains:
        annotations[NVLINK_DOMAINS_ANNOTATION] = ",".join(
            f"{min(d)}-{max(d)}" if list(d) == list(range(min(d), max(d) + 1)) else _indices(d)
            for d in node.nvlink_domains
        )
    spec: Obj = {"providerID": f"sim:///{node.name}"}
    if node.taints:
        spec["taints"] = [
            {"key": t.key, "effect": t.effect, **({"value": t.value} if t.value else {})}
            for t in node.taints
        ]
    if node.unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "uid": uid("Node", "", node.name),
            "creationTimestamp": "2025-12-01T00:00:00Z",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def pod_object(pod: Pod, qos_class: str = UPSTREAM_QOS) -> Obj:
    requests: dict[str, str] = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    limits: dict[str, str] = {}
    annotations = dict(pod.annotations)
    if pod.num_gpu:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(pod.num_gpu)
        if pod.gpu_milli < GPU_MILLI:
            annotations[GPU_MILLI_ANNOTATION] = str(pod.gpu_milli)
    if pod.node is not None and pod.gpu_indices:
        annotations[GPU_INDICES_ANNOTATION] = _indices(pod.gpu_indices)
    resources: Obj = {"requests": requests}
    if limits:
        resources["limits"] = limits
    meta: Obj = {
        "name": pod.name,
        "namespace": pod.namespace,
        "uid": pod.uid or uid("Pod", pod.namespace, pod.name),
        "labels": dict(pod.labels),
    }
    if pod.created_at is not None:
        meta["creationTimestamp"] = rfc3339(pod.created_at)
    if annotations:
        meta["annotations"] = annotations
    if pod.owner is not None:
        owner = pod.owner
        meta["ownerReferences"] = [
            {
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "name": owner.name,
                "uid": owner.uid or uid(owner.kind, pod.namespace, owner.name),
                "controller": owner.controller,
                "blockOwnerDeletion": True,
            }
        ]
    spec: Obj = {
        "containers": [{"name": "main", "image": "sim/workload:1", "resources": resources}],
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "tolerations": [dict(t) for t in DEFAULT_TOLERATIONS],
        "priority": pod.priority,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if pod.priority_class:
        spec["priorityClassName"] = pod.priority_class
    status: Obj = {"phase": pod.phase, "qosClass": qos_class}
    if pod.node is not None:
        spec["nodeName"] = pod.node
        bound = pod.scheduled_at or pod.created_at
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": rfc3339(bound) if bound is not None else None,
            }
        ]
    else:
        since = pod.pending_since or pod.created_at
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": rfc3339(since) if since is not None else None,
                "reason": pod.pending_reason or "Unschedulable",
                "message": "0/1 nodes are available: Insufficient nvidia.com/gpu.",
            }
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def _indices(indices: Iterable[int]) -> str:
    return ",".join(str(i) for i in indices)


__all__ = ["UPSTREAM_QOS", "kube_objects", "node_object", "pod_object", "rfc3339", "uid"]
