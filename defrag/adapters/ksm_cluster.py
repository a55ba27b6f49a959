"""A cluster source from kube-state-metrics: a GPU-only cluster read from Prometheus.

:func:`cluster_from_kube_state` is what a cluster rule (starvation, fragmentation) reads when
there is no snapshot and the rule carries kube-state-metrics ``queries``
(:class:`~defrag.detectors.rulemodel.KubeStateQueries`); :mod:`defrag.detection` builds it once
per set of queries per cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import numpy as np

from defrag.adapters.gpu_shapes import KSM_GPU, ksm_kind
from defrag.detect.series import trailing_run_start
from defrag.detectors.registry import MissingInput
from defrag.detectors.rulemodel import KubeStateQueries
from defrag.model.cluster import Cluster, ModelError
from defrag.model.resources import Node, Pod
from defrag.ports import MetricsSource


def cluster_from_kube_state(
    queries: KubeStateQueries, metrics: MetricsSource, now: datetime
) -> Cluster:
    """A GPU-only cluster from kube-state-metrics at ``now``: nodes with their allocatable GPUs,
    pods bound or pending with their GPU requests, priority class and (from the ``pending``
    range over ``lookback``) since when they are pending. CPU and memory are not modelled.

    Pods whose requests do not fit what their node has left (scrapes a moment apart) are left
    out rather than failing the cycle. ``resource`` labels of MIG profiles and renamed
    time-sliced replicas are pools, unknown accelerators warnings (``Cluster.warnings``); a
    time-sliced ``nvidia.com/gpu`` or a HAMi split count cannot be told apart here (no labels,
    no annotations) and reads as whole GPUs (docs/kubernetes.md).
    """
    warnings: list[str] = []
    whole: dict[str, int] = {}
    pools: dict[str, dict[str, int]] = {}
    allocatable = metrics.instant(queries.allocatable, now)
    if not allocatable:
        raise MissingInput(
            f"queries.allocatable ({queries.allocatable}) returns no series: is "
            "kube-state-metrics scraped?"
        )
    for s in allocatable:
        name, res = s.labels.get("node", ""), s.labels.get("resource", KSM_GPU)
        if not name or s.last is None or s.last <= 0:
            continue
        kind = ksm_kind(res)
        if kind == "gpu":
            whole[name] = int(s.last)
        elif kind == "pool":
            pools.setdefault(name, {})[res] = int(s.last)
        elif kind == "unknown":
            warnings.append(
                f"Node {name}: kube_node_status_allocatable{{resource={res!r}}}: {int(s.last)} "
                "unit(s) of an accelerator defrag does not model; left out"
            )
    nodes = {
        name: Node(name, 0, 0, num_gpu=whole.get(name, 0), pools=pools.get(name, {}))
        for name in {*whole, *pools}
    }
    if not nodes and not warnings:
        raise MissingInput(
            f"queries.allocatable ({queries.allocatable}) returns {len(allocatable)} series, "
            "none with a node label and a GPU"
        )
    requests: dict[str, float] = {}
    pool_requests: dict[str, tuple[str, float]] = {}
    unmodelled: set[str] = set()
    req_node: dict[str, str] = {}
    for s in metrics.instant(queries.gpu_requests, now):
        key, res = _pod_key(s.labels), s.labels.get("resource", KSM_GPU)
        if not key or not s.last:
            continue
        kind = ksm_kind(res)
        if kind == "gpu":
            requests[key] = requests.get(key, 0.0) + s.last
        elif kind == "pool":
            first, units = pool_requests.get(key, (res, 0.0))
            pool_requests[key] = (first, units + s.last if first == res else units)
        elif kind == "unknown":
            unmodelled.add(key)
            warnings.append(
                f"Pod {key}: kube_pod_container_resource_requests{{resource={res!r}}}: an "
                "accelerator defrag does not model; counted for nothing"
            )
            continue
        else:
            continue
        req_node.setdefault(key, s.labels.get("node", ""))
    phases = {
        key: s.labels.get("phase", "")
        for s in metrics.instant(queries.phase, now)
        if (key := _pod_key(s.labels)) and s.last
    }
    info = {
        key: s.labels for s in metrics.instant(queries.info, now) if (key := _pod_key(s.labels))
    }
    since: dict[str, datetime] = {}
    start = now - timedelta(seconds=queries.lookback)
    for s in metrics.range(queries.pending, start, now, queries.step):
        key = _pod_key(s.labels)
        points = np.asarray(s.points, dtype=float).reshape(-1, 2)
        if not key or len(points) == 0 or points[-1, 0] < now.timestamp() - 2 * queries.step:
            continue  # not pending any more
        began = trailing_run_start(points[:, 0], points[:, 1] > 0)
        if began is not None:
            since[key] = datetime.fromtimestamp(began, UTC)
    pods = []
    for key in sorted({*requests, *pool_requests}):
        gpus = requests.get(key, 0.0)
        pool, units = pool_requests.get(key, ("", 0.0))
        phase = phases.get(key, "Pending" if key in since else "")
        if phase not in ("Pending", "Running") or (phase == "Pending" and key in unmodelled):
            continue
        labels = info.get(key, {})
        node = labels.get("node") or req_node.get(key) or None
        namespace, _, name = key.partition("/")
        pods.append(
            Pod(
                name,
                namespace,
                num_gpu=round(gpus),
                pool=pool if units else "",
                pool_units=round(units),
                priority_class=labels.get("priority_class", ""),
                phase=phase,
                node=node if node in nodes else None,
                pending_since=since.get(key) if phase == "Pending" else None,
            )
        )
    cluster = Cluster.build(nodes.values(), warnings=warnings)
    for pod in pods:
        try:
            cluster = cluster.with_pod_added(pod)
        except ModelError:
            continue
    return cluster


def _pod_key(labels: Mapping[str, str]) -> str:
    pod = labels.get("pod", "")
    return f"{labels.get('namespace', '')}/{pod}" if pod else ""
