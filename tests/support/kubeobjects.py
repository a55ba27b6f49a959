"""Real-shaped Kubernetes JSON objects (as ``kubectl get -o json`` / the API server return them).

Tests, the emulated API server, the fixture generator and the benchmark build objects here, so
every object has the fields a real cluster fills in (uid, resourceVersion, conditions, …).
"""

from __future__ import annotations

import uuid
from typing import Any

CREATED = "2026-11-01T08:00:00Z"


def _uid(kind: str, ns: str, name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{kind}/{ns}/{name}"))


def node(
    name: str,
    gpus: int = 8,
    *,
    cpu: str = "96",
    memory: str = "1031800Mi",
    product: str = "NVIDIA-A100-SXM4-80GB",
    gpu_memory_mib: int = 81920,
    nvlink: str | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    all_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "p4d.24xlarge",
    }
    if gpus:
        all_labels.update(
            {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": str(gpu_memory_mib),
                "nvidia.com/gpu.count": str(gpus),
            }
        )
    all_labels.update(labels or {})
    annotations = {"node.alpha.kubernetes.io/ttl": "0"}
    if nvlink is not None:
        annotations["defrag.io/nvlink-domains"] = nvlink
    resources = {
        "cpu": cpu,
        "ephemeral-storage": "7804Gi",
        "hugepages-1Gi": "0",
        "memory": memory,
        "pods": "110",
    }
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {"podCIDR": "10.244.1.0/24", "providerID": f"aws:///us-east-1a/{name}"}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": _uid("Node", "", name),
            "resourceVersion": "1000",
            "creationTimestamp": CREATED,
            "labels": all_labels,
            "annotations": annotations,
        },
        "spec": spec,
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": "2026-11-29T12:00:00Z",
                    "lastTransitionTime": CREATED,
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": _uid("boot", "", name),
                "containerRuntimeVersion": "containerd://1.7.22",
                "kernelVersion": "5.15.0-1066-aws",
                "kubeProxyVersion": "v1.31.2",
                "kubeletVersion": "v1.31.2",
                "machineID": _uid("machine", "", name).replace("-", ""),
                "operatingSystem": "linux",
                "osImage": "Ubuntu 22.04.5 LTS",
                "systemUUID": _uid("system", "", name),
            },
        },
    }


def pod(
    name: str,
    namespace: str = "default",
    gpus: int = 0,
    *,
    node_name: str | None = None,
    cpu: str = "4",
    memory: str = "32Gi",
    priority: int | None = 0,
    priority_class: str | None = None,
    owner: tuple[str, str] | None = ("ReplicaSet", "serve-7d9f"),
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    phase: str | None = None,
    created: str = CREATED,
    pending_reason: str = "Unschedulable",
    pending_message: str = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    init_containers: list[dict[str, Any]] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    limits: dict[str, str] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    requests = {"cpu": cpu, "memory": memory, **limits}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": _uid("Pod", namespace, name),
        "resourceVersion": "2000",
        "creationTimestamp": created,
        "labels": {"app": name.rsplit("-", 1)[0], **(labels or {})},
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "batch/v1" if owner[0] == "Job" else "apps/v1",
                "kind": owner[0],
                "name": owner[1],
                "uid": _uid(owner[0], namespace, owner[1]),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "resources": {"requests": requests, "limits": limits}
                if limits
                else {"requests": requests},
            }
        ],
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
        "tolerations": tolerations
        if tolerations is not None
        else [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if priority is not None:
        spec["priority"] = priority
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node_name:
        spec["nodeName"] = node_name
    status: dict[str, Any]
    if node_name:
        status = {
            "phase": phase or "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": created},
                {"type": "Ready", "status": "True", "lastTransitionTime": created},
            ],
            "hostIP": "10.0.0.1",
            "podIP": "10.244.1.5",
            "startTime": created,
            "qosClass": "Burstable",
        }
    else:
        status = {
            "phase": phase or "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "lastProbeTime": None,
                    "lastTransitionTime": created,
                    "reason": pending_reason,
                    "message": pending_message,
                }
            ],
            "qosClass": "Burstable",
        }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def pdb(
    name: str,
    namespace: str = "default",
    *,
    match_labels: dict[str, str] | None = None,
    match_expressions: list[dict[str, Any]] | None = None,
    disruptions_allowed: int = 0,
    min_available: int = 1,
) -> dict[str, Any]:
    selector: dict[str, Any] = {}
    if match_labels is not None:
        selector["matchLabels"] = match_labels
    if match_expressions is not None:
        selector["matchExpressions"] = match_expressions
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": _uid("PodDisruptionBudget", namespace, name),
            "resourceVersion": "3000",
            "creationTimestamp": CREATED,
            "generation": 1,
        },
        "spec": {"minAvailable": min_available, "selector": selector},
        "status": {
            "currentHealthy": min_available + disruptions_allowed,
            "desiredHealthy": min_available,
            "disruptionsAllowed": disruptions_allowed,
            "expectedPods": min_available + disruptions_allowed,
            "observedGeneration": 1,
        },
    }


def priority_class(name: str, value: int, global_default: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": name,
            "uid": _uid("PriorityClass", "", name),
            "resourceVersion": "100",
            "creationTimestamp": CREATED,
        },
        "value": value,
        "globalDefault": global_default,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": f"{name} workloads",
    }


def as_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``v1 List`` as ``kubectl get nodes,pods,pdb -A -o json`` prints it."""
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}
