"""Builders shared by the planner tests (no tests here)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta

from defrag.model.cluster import Cluster, PodDisruptionBudget
from defrag.model.resources import Node, OwnerRef, Pod

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def gpu_node(name: str, gpus: int = 8, cpu: int = 64_000, domains: tuple = ()) -> Node:
    return Node(
        name, cpu_milli=cpu, memory_mib=512_000, num_gpu=gpus, gpu_model="A100",
        nvlink_domains=domains,
    )  # fmt: skip


def running(
    name: str,
    node: str,
    gpus: int = 1,
    *,
    gpu_milli: int = 1000,
    priority: int = 0,
    hours: float = 2.0,
    namespace: str = "default",
    owner: OwnerRef | None = OwnerRef("ReplicaSet", "rs"),
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    gang: str | None = None,
    cpu: int = 1000,
) -> Pod:
    return Pod(
        name, namespace=namespace, num_gpu=gpus, gpu_milli=gpu_milli, cpu_milli=cpu,
        priority=priority, owner=owner, node=node, phase="Running",
        created_at=NOW - timedelta(hours=hours), labels=dict(labels or {}),
        annotations=dict(annotations or {}), gang=gang,
    )  # fmt: skip


def pending(
    name: str, gpus: int, *, priority: int = 100, namespace: str = "default",
    gang: str | None = None, cpu: int = 1000,
) -> Pod:  # fmt: skip
    return Pod(
        name, namespace=namespace, num_gpu=gpus, cpu_milli=cpu, priority=priority,
        owner=OwnerRef("Job", name), created_at=NOW - timedelta(hours=1),
        pending_since=NOW - timedelta(hours=1), gang=gang,
    )  # fmt: skip


def cluster(
    nodes: Iterable[Node], pods: Iterable[Pod], pdbs: Iterable[PodDisruptionBudget] = ()
) -> Cluster:
    return Cluster.build(list(nodes), list(pods), list(pdbs))


def fill(node: str, used: int, *, prefix: str = "", **kw: object) -> list[Pod]:
    """``used`` one-GPU pods on ``node``."""
    return [running(f"{prefix or node}-p{i}", node, 1, **kw) for i in range(used)]  # type: ignore[arg-type]
