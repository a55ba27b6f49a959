"""Starvation and fragmentation detectors on small clusters whose answers can be counted."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from defrag.detection import run_detection
from defrag.detectors.fragmentation.core import FragmentationParams, detect_fragmentation
from defrag.detectors.starvation.core import (
    StarvationParams,
    detect_starvation,
    diagnose,
    first_per_pod,
)
from defrag.model.cluster import Cluster
from defrag.model.resources import Node, Pod
from defrag.rules import load_rules
from defrag.scoring.policies.reserve_binpack import ReserveBinpack
from defrag.scoring.profile import ScoringProfile

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


STARVE = StarvationParams(for_s=900, min_priority=1000, action="make-room")


def node(name: str, gpus: int = 8) -> Node:
    return Node(name, cpu_milli=64000, memory_mib=512000, num_gpu=gpus, gpu_model="H100")


def running(name: str, on: str, gpus: int) -> Pod:
    return Pod(name, "ml", num_gpu=gpus, node=on, phase="Running")


def pending(name: str, gpus: int, priority: int = 0, minutes: float = 30, cls: str = "") -> Pod:
    return Pod(
        name,
        "ml",
        num_gpu=gpus,
        priority=priority,
        priority_class=cls,
        pending_since=NOW - timedelta(minutes=minutes),
    )


def scattered(*extra: Pod) -> Cluster:
    """Three 8-GPU nodes with 3, 3 and 2 GPUs free: 8 free in total, no 4 on one node."""
    pods = [running("a", "n1", 5), running("b", "n2", 5), running("c", "n3", 6), *extra]
    return Cluster.build([node("n1"), node("n2"), node("n3")], pods, priority_classes={"hi": 5000})


def test_diagnosis_of_more_than_a_node_holds() -> None:
    """10 GPUs > 8 on the largest node, even empty (the fragmented and placeable rows on this
    cluster are test_starvation_gates.py's)."""
    pod = pending("p", 10, 2000)
    cluster = scattered(pod)
    assert diagnose(pod, cluster, ReserveBinpack()).reason == "unsatisfiable"
    # the simulator diagnoses on its node arrays: the same answer
    assert diagnose(pod, cluster.arrays, ReserveBinpack()).reason == "unsatisfiable"


def test_starvation_finds_high_priority_past_for_only() -> None:
    cluster = scattered(
        pending("high-old", 4, priority=2000, minutes=30),
        pending("low-old", 4, priority=10, minutes=300),
        pending("high-new", 4, priority=2000, minutes=5),  # 5 min < 15 min `for`
        pending("by-class", 4, cls="hi", minutes=60),  # class value 5000 from the cluster
    )
    findings = detect_starvation(cluster, STARVE, NOW, profile=ScoringProfile.default(cluster))
    assert [f.subject for f in findings] == ["pod/ml/by-class", "pod/ml/high-old"]
    old = findings[1]
    assert old.evidence["reason"] == "fragmented"
    assert "fragmented" in old.summary and "8 GPU(s) free in total" in old.summary
    assert old.evidence["pending_s"] == 1800.0
    assert old.since == NOW - timedelta(minutes=30)
    assert old.labels == {
        "namespace": "ml",
        "pod": "high-old",
        "detector": "starvation",
        "rule": STARVE.name,
        "reason": "fragmented",
    }
    assert old.action == "make-room"
    assert findings[0].evidence["priority"] == 5000


def test_starvation_by_priority_class_name() -> None:
    cluster = scattered(pending("named", 4, cls="batch-urgent"))
    params = replace(STARVE, priority_classes=frozenset({"batch-urgent"}))
    assert [
        f.subject
        for f in detect_starvation(cluster, params, NOW, profile=ScoringProfile.default(cluster))
    ] == ["pod/ml/named"]
    assert detect_starvation(cluster, STARVE, NOW, profile=ScoringProfile.default(cluster)) == []


FRAG = FragmentationParams(
    action="repack", sizes=(8,), node_stranded_min_gpus=2, cluster_stranded_min_gpus=8
)


def test_fragmentation_nodes_and_cluster() -> None:
    findings = detect_fragmentation(
        scattered(), FRAG, NOW, profile=ScoringProfile.default(scattered())
    )
    by_subject = {f.subject: f for f in findings}
    assert sorted(by_subject) == ["cluster", "node/n1", "node/n2", "node/n3"]
    n3 = by_subject["node/n3"]
    assert n3.evidence["stranded"] == {"8": 2}  # 2 free, no 8-GPU job: both stranded
    assert n3.action == "repack" and n3.labels["node"] == "n3"
    cluster = by_subject["cluster"]
    # stranded for 8: 3 + 3 + 2 = 8 ≥ 8; whole free nodes 0 < 1 although 8 free GPUs fill 1
    assert cluster.evidence["stranded"] == {"8": 8}
    assert "8 free GPU(s) stranded" in cluster.summary and "0 whole free node(s)" in cluster.summary


@pytest.mark.parametrize(
    ("pods", "subjects"),
    [
        # one full node, one whole free node: nothing stranded, nothing partly used
        ([running("a", "n1", 8)], []),
        # 1 GPU free on n1: below the per-node minimum of 2; cluster has a whole free node
        ([running("a", "n1", 7)], []),
        # 4 free on n1: a 4-GPU job (the size waiting) uses them all, none stranded
        ([running("a", "n1", 4), pending("w", 4)], []),
        # 3 free on n1: stranded for 4-GPU jobs, 3 ≥ 2
        ([running("a", "n1", 5)], ["node/n1"]),
    ],
)
def test_fragmentation_thresholds(pods: list[Pod], subjects: list[str]) -> None:
    cluster = Cluster.build([node("n1"), node("n2")], pods)
    params = replace(FRAG, sizes=(4,), include_waiting=True)
    findings = detect_fragmentation(cluster, params, NOW, profile=ScoringProfile.default(cluster))
    assert [f.subject for f in findings] == subjects


def test_sizes_larger_than_a_node_are_skipped_for_that_node() -> None:
    # a 4-GPU node with 2 free: for 8-GPU jobs it is simply too small, not fragmented
    cluster = Cluster.build([node("small", 4), node("big")], [running("a", "small", 2)])
    assert detect_fragmentation(cluster, FRAG, NOW, profile=ScoringProfile.default(cluster)) == []


# --- the shipped rules together: high priority first, any priority when fragmented ---------------

SHIPPED = load_rules([Path(__file__).parent.parent / "rules" / "starvation.yaml"])


@pytest.mark.parametrize(
    ("pod", "rule", "reason"),
    [
        # scattered(): 3 + 3 + 2 = 8 GPUs free, at most 3 on one node
        (pending("p", 4, priority=2000), "high-priority-starved", "fragmented"),
        # high priority and fragmented: both rules match; reported once, by the first
        (pending("p", 4, priority=2000, minutes=300), "high-priority-starved", "fragmented"),
        # 10 GPUs, nodes of 8: no node could ever hold it (its own kind, never fragmented)
        (pending("p", 10, priority=2000), "high-priority-starved", "unsatisfiable"),
        # priority 0, no class (a cluster without PriorityClasses): fragmented only, ≥ 30 min
        (pending("p", 4, minutes=31), "fragmented-starved", "fragmented"),
        (pending("p", 4, minutes=29), None, None),  # under the rule's 30 min
        # priority 0 and larger than any node: the third rule warns, whatever the priority
        (pending("p", 10, minutes=300), "unsatisfiable-pending", "unsatisfiable"),
        (pending("p", 10, minutes=14), None, None),  # under that rule's 15 min
        (pending("p", 2, minutes=300), None, None),  # fits on n3: placeable
        (pending("p", 4, priority=-10, minutes=60), "fragmented-starved", "fragmented"),
    ],
)
def test_shipped_starvation_rules(pod: Pod, rule: str | None, reason: str | None) -> None:
    cluster = scattered(pod)
    profile = ScoringProfile.default(cluster)
    report = run_detection(SHIPPED, None, cluster, NOW, profile=profile)
    assert report.ran == ("high-priority-starved", "fragmented-starved", "unsatisfiable-pending")
    found = [(f.labels["rule"], f.evidence["reason"]) for f in report.findings]
    assert found == ([(rule, reason)] if rule else [])
    if rule == "fragmented-starved":
        [finding] = report.findings
        assert finding.severity == "warning" and finding.action == "make-room"
    for finding in report.findings:
        never = finding.evidence["reason"] == "unsatisfiable"
        assert finding.kind == ("unsatisfiable" if never else "starvation")
        if never:  # the rule's make-room is not this finding's: no room ever places it
            assert finding.action == "alert"


def test_first_per_pod_keeps_other_kinds_and_other_pods() -> None:
    cluster = scattered(pending("lo", 4, minutes=60), pending("hi", 4, priority=2000))
    profile = ScoringProfile.default(cluster)
    any_fragmented = StarvationParams(
        name="any", for_s=0, any_priority=True, reasons=frozenset({"fragmented"})
    )
    findings = [
        *detect_starvation(cluster, STARVE, NOW, profile=profile),  # hi
        *detect_starvation(cluster, any_fragmented, NOW, profile=profile),  # hi, lo
        *detect_fragmentation(cluster, FRAG, NOW, profile=profile),
        *detect_fragmentation(cluster, FRAG, NOW, profile=profile),  # other kinds: all kept
    ]
    kept = first_per_pod(findings)
    starving = [(f.subject, f.labels["rule"]) for f in kept if f.kind == "starvation"]
    assert starving == [("pod/ml/hi", STARVE.name), ("pod/ml/lo", "any")]
    assert len(kept) == len(findings) - 1
