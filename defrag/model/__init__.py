"""The cluster model: frozen nodes, GPUs and pods, and an immutable cluster with numpy views."""

from defrag.model.arrays import NodeArrays
from defrag.model.cluster import Cluster, ModelError, PodDisruptionBudget, occupies
from defrag.model.resources import Gpu, Node, OwnerRef, Pod, Taint, Toleration
from defrag.model.status import Status
from defrag.model.workload import Shape, WorkloadMix

__all__ = [
    "Cluster",
    "Gpu",
    "ModelError",
    "Node",
    "NodeArrays",
    "OwnerRef",
    "Pod",
    "PodDisruptionBudget",
    "Shape",
    "Status",
    "Taint",
    "Toleration",
    "WorkloadMix",
    "occupies",
]
