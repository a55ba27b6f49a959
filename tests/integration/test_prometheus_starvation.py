"""Starvation and fragmentation from kube-state-metrics alone (no snapshot), real Prometheus.

Three 8-GPU nodes with 5, 5 and 6 GPUs requested (8 free, at most 3 on a node); pending 4-GPU
pods: ``urgent`` (high-priority, 30 min), ``batch`` (low priority, 5 h) and ``fresh``
(high-priority, 5 min, under the rule's 15 min ``for``); ``held`` (high-priority, 4 GPUs, 2 h)
held by a scheduling gate, and ``huge`` (high-priority, 16 GPUs, 2 h: larger than any node).
``kube_pod_status_reason`` is written as kube-state-metrics v2.19.0 writes it (internal/store/
pod.go, ``createPodStatusReasonFamilyGenerator`` at 2ef24549: one row per known reason for every
pod, 1 for the reason set, else 0), so the shipped ``== 1`` is what keeps the others ungated.
Beside them, shapes kube-state-metrics
names by its sanitised ``resource`` label (kube-state-metrics docs/metrics/workload/pod-metrics.md,
node-metrics.md): a MIG-mixed node ``n4`` (``nvidia_com_mig_1g_10gb``: 7, one slice used) and an
AMD node ``n5`` (``amd_com_gpu``: 8) with a pending AMD pod.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from defrag.adapters.ksm_cluster import cluster_from_kube_state
from defrag.adapters.prometheus import PrometheusSource
from defrag.detection import detect
from defrag.detectors.starvation.registration import StarvationRule
from defrag.model.workload import WorkloadMix
from defrag.rules import load_rules
from defrag.scoring.profile import ProfileConfig
from tests.support.prometheus import END, gauge_family, prometheus_server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STEP = 30.0
TIMES = np.arange(END.timestamp() - 6 * 3600, END.timestamp() + 1, STEP)

RUNNING = {"a": ("n1", 5), "b": ("n2", 5), "c": ("n3", 6)}
PENDING = {
    "urgent": ("high-priority", 30, 4),
    "batch": ("low", 300, 4),
    "fresh": ("high-priority", 5, 4),
    "held": ("high-priority", 120, 4),
    "huge": ("high-priority", 120, 16),
}
GATED = {"held"}
# internal/store/pod.go podStatusReasons at v2.19.0 (2ef24549)
REASONS = (
    "Evicted", "NodeAffinity", "NodeLost", "PreemptionByScheduler", "SchedulingGated",
    "Shutdown", "TerminationByKubelet", "UnexpectedAdmissionError",
)  # fmt: skip


def since(minutes: float) -> np.ndarray:
    first = END.timestamp() - minutes * 60
    return TIMES[first <= TIMES]


# What a ServiceMonitor target adds (prometheus-operator pkg/prometheus/promcfg.go lines
# 2135-2149 at 6adcebc5: namespace, service, pod, container; Prometheus adds job and instance).
# With honorLabels false (the kube-state-metrics chart's default: charts/kube-state-metrics/
# templates/servicemonitor.yaml lines 28-30 at 0027117e) a scraped label that collides becomes
# exported_<name> (Prometheus docs/configuration/configuration.md, honor_labels).
TARGET = {
    "namespace": "monitoring",
    "pod": "kube-state-metrics-6d5f8-x2x9q",
    "container": "kube-state-metrics",
    "service": "kube-state-metrics",
    "endpoint": "http",
    "job": "kube-state-metrics",
    "instance": "10.0.3.7:8080",
}
UIDS: dict[str, str] = {}


def scraped(labels: dict[str, str], mode: str) -> dict[str, str]:
    """The series as stored: ``honor`` (honorLabels true), ``exported`` (honorLabels false),
    ``dropped`` (honorLabels false and a metricRelabeling that drops exported_*)."""
    if labels.get("pod"):  # every kube_pod_* family carries the pod's uid
        labels = {**labels, "uid": UIDS.setdefault(labels["pod"], f"uid-{len(UIDS)}")}
    if mode == "honor":
        return labels
    out = {(f"exported_{k}" if k in TARGET else k): v for k, v in labels.items()} | TARGET
    if mode == "dropped":
        out = {k: v for k, v in out.items() if not k.startswith("exported_")}
    return out


def history(mode: str = "honor") -> str:
    ones = np.ones(len(TIMES))
    alloc = [
        ({"node": n, "resource": "nvidia_com_gpu", "unit": "integer"}, TIMES, ones * 8)
        for n in ("n1", "n2", "n3")
    ]
    alloc.append(
        ({"node": "n4", "resource": "nvidia_com_mig_1g_10gb", "unit": "integer"}, TIMES, ones * 7)
    )
    alloc.append(({"node": "n5", "resource": "amd_com_gpu", "unit": "integer"}, TIMES, ones * 8))
    requests, phase, info, reason = [], [], [], []
    for pod, node, res in (("mig", "n4", "nvidia_com_mig_1g_10gb"), ("rocm", "", "amd_com_gpu")):
        base = {"namespace": "ml", "pod": pod}
        labels = {**base, "container": "main", "node": node, "resource": res, "unit": "integer"}
        requests.append((labels, TIMES, ones))
        phase.append(({**base, "phase": "Running" if node else "Pending"}, TIMES, ones))
        info.append(({**base, "node": node, "priority_class": "high-priority"}, TIMES, ones))
    for pod, (node, gpus) in RUNNING.items():
        base = {"namespace": "ml", "pod": pod}
        requests.append(
            (
                {
                    **base,
                    "container": "main",
                    "node": node,
                    "resource": "nvidia_com_gpu",
                    "unit": "integer",
                },
                TIMES,
                ones * gpus,
            )
        )
        phase.append(({**base, "phase": "Running"}, TIMES, ones))
        info.append(({**base, "node": node, "priority_class": "low"}, TIMES, ones))
    for pod, (cls, minutes, gpus) in PENDING.items():
        base = {"namespace": "ml", "pod": pod}
        t = since(minutes)
        for why in REASONS:
            gated = why == "SchedulingGated" and pod in GATED
            reason.append(({**base, "reason": why}, t, np.full(len(t), 1.0 if gated else 0.0)))
        requests.append(
            (
                {
                    **base,
                    "container": "main",
                    "node": "",
                    "resource": "nvidia_com_gpu",
                    "unit": "integer",
                },
                t,
                np.full(len(t), gpus),
            )
        )
        phase.append(({**base, "phase": "Pending"}, t, np.ones(len(t))))
        info.append(({**base, "node": "", "priority_class": cls}, t, np.ones(len(t))))
    families = (
        ("kube_node_status_allocatable", alloc),
        ("kube_pod_container_resource_requests", requests),
        ("kube_pod_status_phase", phase),
        ("kube_pod_info", info),
        ("kube_pod_status_reason", reason),
    )
    return (
        "".join(
            gauge_family(name, [(scraped(labels, mode), t, v) for labels, t, v in series])
            for name, series in families
        )
        + "# EOF\n"
    )


@pytest.fixture(scope="module", params=["honor", "exported"])
def prom(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("ksm") / "ksm.om"
    path.write_text(history(request.param))
    with prometheus_server(path) as server:
        yield server.url


def test_cluster_from_kube_state_metrics(prom: str) -> None:
    rule = load_rules([ROOT / "rules" / "starvation.yaml"]).rules[0].rule
    assert isinstance(rule, StarvationRule) and rule.queries is not None
    source = PrometheusSource(prom, retries=0)
    cluster = cluster_from_kube_state(rule.queries, source, END)
    assert [n.name for n in cluster.nodes] == ["n1", "n2", "n3", "n4"]
    assert cluster.arrays.free_whole_count().tolist() == [3, 3, 2, 0]  # 8 − 5, 8 − 5, 8 − 6
    # the MIG slices are a pool of their own (6 of 7 free), never whole GPUs
    assert dict(cluster.node("n4").pools) == {"nvidia_com_mig_1g_10gb": 7}
    col = cluster.arrays.pool_index["nvidia_com_mig_1g_10gb"]
    assert int(cluster.arrays.pool_free[cluster.arrays.index["n4"], col]) == 6
    assert cluster.pods["ml/mig"].pool_units == 1 and cluster.pods["ml/mig"].num_gpu == 0
    # the AMD node and the pending AMD pod: one warning each, the pod left out
    assert "ml/rocm" not in cluster.pods
    assert [w.split(":")[0] for w in cluster.warnings] == ["Node n5", "Pod ml/rocm"]
    urgent = cluster.pods["ml/urgent"]
    assert urgent.node is None and urgent.num_gpu == 4 and urgent.priority_class == "high-priority"
    assert urgent.pending_since == END - timedelta(minutes=30)
    # kube_pod_status_reason{reason="SchedulingGated"} == 1: only the held pod is gated
    assert {key for key, pod in cluster.pods.items() if pod.gated} == {"ml/held"}


@pytest.mark.parametrize("policy", ["reserve-binpack", "fgd"])
def test_starvation_from_prometheus_alone_says_fragmented(prom: str, policy: str) -> None:
    rules = load_rules([ROOT / "rules" / "starvation.yaml", ROOT / "rules" / "fragmentation.yaml"])
    # the configured policy, bound to the cluster built from kube-state-metrics (not to the
    # empty default mix of the profile handed in): the rule itself names no policy
    profile = ProfileConfig(policy=policy).with_mix(WorkloadMix.default())
    findings = detect(rules, PrometheusSource(prom, retries=0), None, END, profile=profile)
    starving = [f for f in findings if f.kind == "starvation"]
    # urgent: high-priority past 15 min; batch is low priority but fragmented for 5 h, past
    # fragmented-starved's 30 min (any priority); fresh waits only 5 min
    assert [(f.subject, f.labels["rule"]) for f in starving] == [
        ("pod/ml/urgent", "high-priority-starved"),
        ("pod/ml/batch", "fragmented-starved"),
    ]
    assert starving[1].evidence["reason"] == "fragmented"
    assert starving[0].evidence["reason"] == "fragmented"
    assert "fragmented" in starving[0].summary and "8 GPU(s) free in total" in starving[0].summary
    assert starving[0].evidence["policy"] == policy
    # held (gated) is reported nowhere; huge is unsatisfiable, alerted but never make-room
    assert "pod/ml/held" not in {f.subject for f in findings}
    [huge] = [f for f in findings if f.kind == "unsatisfiable"]
    assert (huge.subject, huge.labels["rule"], huge.action) == (
        "pod/ml/huge",
        "high-priority-starved",
        "alert",
    )
    assert "asks 16 GPUs, the largest node has 8" in huge.summary
    frag = {f.subject: f for f in findings if f.kind == "fragmentation"}
    assert set(frag) == {"cluster", "node/n1", "node/n2", "node/n3"}
    # no "stranded for 16-GPU jobs": no node could hold one
    assert frag["cluster"].evidence["sizes"] == [4, 8]
    assert "16-GPU" not in frag["cluster"].summary


def test_pods_that_cannot_be_told_apart_make_the_rules_skipped(tmp_path: Path) -> None:
    """honorLabels false with exported_* dropped: every pod series names the kube-state-metrics
    pod. Before, starvation found nothing and fragmentation measured a cluster whose pods had
    collapsed into one; now both rules are skipped, saying why."""
    from defrag.detection import run_detection

    path = tmp_path / "ksm.om"
    path.write_text(history("dropped"))
    rules = load_rules([ROOT / "rules" / "starvation.yaml", ROOT / "rules" / "fragmentation.yaml"])
    profile = ProfileConfig().with_mix(WorkloadMix.default())
    with prometheus_server(path) as server:
        report = run_detection(
            rules, PrometheusSource(server.url, retries=0), None, END, profile=profile
        )
    assert report.findings == () and report.failures == ()
    assert set(report.skipped) == {r.rule.name for r in rules.enabled()}
    for why in report.skipped.values():
        assert "no series names a pod other than the scrape target" in why, why
        assert "monitoring/kube-state-metrics-6d5f8-x2x9q" in why and "honorLabels: true" in why
