"""A cluster source from kube-state-metrics: a GPU-only cluster read from Prometheus.

:func:`cluster_from_kube_state` is what a cluster rule (starvation, fragmentation) reads when
there is no snapshot and the rule carries kube-state-metrics ``queries``
(:class:`~defrag.detectors.rulemodel.KubeStateQueries`); :mod:`defrag.detection` builds it once
per set of queries per cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np

from defrag.adapters.gpu_shapes import KSM_GPU, ksm_kind
from defrag.detect.kube_state import label, pod_key, scrape_targets
from defrag.detect.series import trailing_run_start
from defrag.detectors.registry import MissingInput
from defrag.detectors.rulemodel import KubeStateQueries
from defrag.model.cluster import Cluster, ModelError
from defrag.model.resources import Node, Pod
from defrag.ports import MetricsSource, Sample


def cluster_from_kube_state(
    queries: KubeStateQueries, metrics: MetricsSource, now: datetime
) -> Cluster:
    """A GPU-only cluster from kube-state-metrics at ``now``: nodes with their allocatable GPUs,
    pods bound or pending with their GPU requests, priority class, whether scheduling gates hold
    them (``gated``: ``kube_pod_status_reason{reason="SchedulingGated"}``) and (from the
    ``pending`` range over ``lookback``) since when they are pending. CPU and memory are not
    modelled.

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
        name, res = label(s.labels, "node"), label(s.labels, "resource") or KSM_GPU
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
    requests_series = metrics.instant(queries.gpu_requests, now)
    phase_series = metrics.instant(queries.phase, now)
    info_series = metrics.instant(queries.info, now)
    gated_series = metrics.instant(queries.gated, now)
    start = now - timedelta(seconds=queries.lookback)
    pending_series = metrics.range(queries.pending, start, now, queries.step)
    every = [requests_series, phase_series, info_series, pending_series, gated_series]
    targets = scrape_targets(
        (s.labels for series in every for s in series), (s.labels for s in allocatable)
    )
    _check_attributable(queries, requests_series, targets)
    requests: dict[str, float] = {}
    pool_requests: dict[str, tuple[str, float]] = {}
    unmodelled: set[str] = set()
    req_node: dict[str, str] = {}
    for s in requests_series:
        key, res = pod_key(s.labels, targets), label(s.labels, "resource") or KSM_GPU
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
        req_node.setdefault(key, label(s.labels, "node"))
    phases = {
        key: label(s.labels, "phase")
        for s in phase_series
        if (key := pod_key(s.labels, targets)) and s.last
    }
    info = {
        key: {"node": label(s.labels, "node"), "priority_class": label(s.labels, "priority_class")}
        for s in info_series
        if (key := pod_key(s.labels, targets))
    }
    # 2.19 writes a 0 row for every pod not gated: a query without `== 1` must not gate them
    gated = {key for s in gated_series if (key := pod_key(s.labels, targets)) and s.last}
    since: dict[str, datetime] = {}
    for s in pending_series:
        key = pod_key(s.labels, targets)
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
                gated=phase == "Pending" and key in gated,
            )
        )
    cluster = Cluster.build(nodes.values(), warnings=warnings)
    for pod in pods:
        try:
            cluster = cluster.with_pod_added(pod)
        except ModelError:
            continue
    return cluster


def _check_attributable(
    queries: KubeStateQueries, requests: Sequence[Sample], targets: frozenset[str]
) -> None:
    """Raise :class:`MissingInput` when GPU requests exist but cannot be told apart by pod: every
    series names only the scrape target (the ``exported_*`` labels dropped), or one pod name
    carries several pod ``uid`` s (many pods collapsed into one name)."""
    asking = [s for s in requests if s.last]
    if not asking:
        return
    keys = [pod_key(s.labels, targets) for s in asking]
    if not any(keys):
        named = sorted(
            {f"{s.labels.get('namespace', '')}/{s.labels.get('pod', '')}" for s in asking}
        )
        raise MissingInput(
            f"queries.gpu_requests ({queries.gpu_requests}): no series names a pod other "
            f"than the scrape target's own ({', '.join(named[:3])}), so no pod can be attributed: "
            "scrape kube-state-metrics with honorLabels: true, or keep its exported_pod and "
            "exported_namespace labels"
        )
    uids: dict[str, set[str]] = {}
    for key, s in zip(keys, asking, strict=True):
        uid = label(s.labels, "uid")
        if key and uid:
            uids.setdefault(key, set()).add(uid)
    collapsed = sorted(k for k, u in uids.items() if len(u) > 1)
    if collapsed:
        raise MissingInput(
            f"queries.gpu_requests ({queries.gpu_requests}): {len(uids[collapsed[0]])} pods "
            f"(distinct uid) all carry the pod name {collapsed[0]}, so pods cannot be told "
            "apart: is kube-state-metrics scraped with honorLabels: false and its exported_pod "
            "label dropped? Scrape it with honorLabels: true"
        )
