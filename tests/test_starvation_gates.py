"""Starvation's two non-starving shapes: pods held by scheduling gates, and pods no node could
ever hold (``unsatisfiable``).

A gated pod is never reported and never given room, whichever cluster source says it is gated:
the Kubernetes API (``spec.schedulingGates``) or kube-state-metrics
(``kube_pod_status_reason{reason="SchedulingGated"}``). A pod larger than any node — in GPUs,
GPU model, node selector, CPU or memory — is its own finding kind with its own alert, never
``fragmented``, never make-room, and adds no size to the fragmentation findings.

The kube-state-metrics series are shaped as kubernetes/kube-state-metrics writes them:
``internal/store/pod.go`` (``wrapPodFunc`` adds ``namespace``, ``pod``, ``uid`` to every pod
family; ``createPodStatusReasonFamilyGenerator``: at v2.19.0 (2ef24549) one row per known
reason for every pod, valued 0 or 1; at v2.20.0 only the reason set, valued 1 — its
``pod_test.go`` case ``kube_pod_status_reason{namespace="ns4",pod="pod4",
reason="SchedulingGated",uid="uid4"} 1`` for a pod whose PodScheduled condition has the reason
``SchedulingGated``), ``internal/store/node.go`` (``kube_node_status_allocatable`` with
``node``, ``resource``, ``unit``), and docs/metrics/workload/pod-metrics.md (label sets).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from defrag.adapters.ksm_cluster import cluster_from_kube_state
from defrag.alerting import ALERTS
from defrag.decide import starved_pods
from defrag.detection import run_detection
from defrag.detectors.fragmentation.core import FragmentationParams, detect_fragmentation
from defrag.detectors.rulemodel import GATED_QUERY, KubeStateQueries
from defrag.detectors.starvation.core import StarvationParams, detect_starvation, diagnose
from defrag.model.cluster import Cluster
from defrag.model.resources import Node, Pod, Taint, Toleration
from defrag.plan import PlanOptions, make_plan
from defrag.plan.planner import starved_groups
from defrag.ports import Sample
from defrag.rules import load_rules
from defrag.scoring.policies.reserve_binpack import ReserveBinpack
from defrag.scoring.profile import ScoringProfile
from defrag.scoring.satisfiable import empty_nodes, satisfiable
from tests.test_plan_support import fill

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SHIPPED = load_rules([ROOT / "rules" / "starvation.yaml"])
ANY = StarvationParams(for_s=60, any_priority=True)
GATE = "kueue.x-k8s.io/admission"  # kubernetes-sigs/kueue pkg/controller/jobs/pod/constants


def node(name: str, gpus: int = 8, model: str = "H100", **kw: object) -> Node:
    return Node(name, 64_000, 512_000, num_gpu=gpus, gpu_model=model, **kw)  # type: ignore[arg-type]


def running(name: str, on: str, gpus: int) -> Pod:
    return Pod(name, "ml", num_gpu=gpus, node=on, phase="Running")


def pending(name: str, gpus: int, priority: int = 2000, minutes: float = 60, **kw: object) -> Pod:
    since = NOW - timedelta(minutes=minutes)
    return Pod(name, "ml", num_gpu=gpus, priority=priority, pending_since=since, **kw)  # type: ignore[arg-type]


def scattered(*extra: Pod, nodes: tuple[Node, ...] = ()) -> Cluster:
    """Three 8-GPU H100 nodes with 3, 3 and 2 GPUs free (8 in total, at most 3 on one)."""
    base = [running("a", "n1", 5), running("b", "n2", 5), running("c", "n3", 6)]
    return Cluster.build(nodes or (node("n1"), node("n2"), node("n3")), [*base, *extra])


# --- could any node ever hold it ------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "ever", "said"),
    [
        (pending("p", 8), True, ""),  # a whole node's worth: fits once a node is emptied
        (pending("p", 16), False, "asks 16 GPUs, the largest node has 8"),
        (pending("p", 4, gpu_models=frozenset({"A100"})), False, "gpu model not allowed"),
        (pending("p", 4, node_selector={"pool": "nowhere"}), False, "node selector"),
        (pending("p", 1, memory_mib=600_000), False, "insufficient memory"),
        (pending("p", 1, cpu_milli=65_000), False, "insufficient cpu"),
        (pending("p", 4, gpu_memory_mib=200_000), False, "insufficient gpu memory"),
    ],
)
def test_could_any_node_ever_hold_it(pod: Pod, ever: bool, said: str) -> None:
    status = satisfiable(pod, empty_nodes(scattered(pod)))
    assert status.ok is ever
    assert said in str(status)
    if not ever:
        assert "even with every node empty, 0/3 nodes fit" in str(status)


def test_a_cordon_or_a_node_condition_is_not_forever_but_a_dedicated_taint_is() -> None:
    big = Node("big", 64_000, 512_000, num_gpu=16, gpu_model="H100", unschedulable=True)
    job = pending("job", 16)
    # the only 16-GPU node is cordoned (maintenance): the job waits, it is not unsatisfiable
    assert satisfiable(
        job, empty_nodes(scattered(job, nodes=(node("n1"), node("n2"), node("n3"), big)))
    ).ok
    # ... or NotReady (the node lifecycle controller's taint, kubernetes/api core/v1
    # well_known_taints.go): a condition, gone when the node is back
    not_ready = replace(
        big, unschedulable=False, taints=(Taint("node.kubernetes.io/not-ready", "NoExecute"),)
    )
    assert satisfiable(job, empty_nodes(Cluster.build([not_ready], [job]))).ok
    # a taint that dedicates the node to others is the node's for good
    dedicated = replace(
        big, unschedulable=False, taints=(Taint("dedicated", "NoSchedule", "infer"),)
    )
    assert not satisfiable(job, empty_nodes(Cluster.build([dedicated], [job]))).ok
    tolerant = replace(job, tolerations=(Toleration("dedicated", "Equal", "infer", "NoSchedule"),))
    assert satisfiable(tolerant, empty_nodes(Cluster.build([dedicated], [tolerant]))).ok


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        (pending("p", 16), "unsatisfiable"),  # before: "insufficient-gpus" or "fragmented"
        (pending("p", 4, gpu_models=frozenset({"A100"})), "unsatisfiable"),  # was "constrained"
        (pending("p", 4), "fragmented"),  # 8 free in total, at most 3 on a node
        (pending("p", 2), "placeable"),
    ],
)
def test_diagnosis_tells_unsatisfiable_first(pod: Pod, reason: str) -> None:
    cluster = scattered(pod)
    assert diagnose(pod, cluster, ReserveBinpack()).reason == reason
    # the simulator diagnoses on its node arrays: the same answer
    assert diagnose(pod, cluster.arrays, ReserveBinpack()).reason == reason


def test_insufficient_gpus_is_still_told_when_a_node_could_hold_it_empty() -> None:
    full = Cluster.build(
        [node("n1"), node("n2")], [running("a", "n1", 6), running("b", "n2", 6), pending("p", 8)]
    )
    assert diagnose(full.pods["ml/p"], full, ReserveBinpack()).reason == "insufficient-gpus"


# --- the finding: its own kind and alert, never make-room --------------------------------------


def test_unsatisfiable_finding_is_its_own_kind_with_its_own_alert() -> None:
    cluster = scattered(pending("huge", 16), pending("job", 4))
    params = replace(ANY, action="make-room")
    findings = detect_starvation(cluster, params, NOW, profile=ScoringProfile.default(cluster))
    by_pod = {f.subject: f for f in findings}
    huge, job = by_pod["pod/ml/huge"], by_pod["pod/ml/job"]
    assert (huge.kind, huge.evidence["reason"], huge.labels["reason"]) == (
        "unsatisfiable",
        "unsatisfiable",
        "unsatisfiable",
    )
    assert huge.action == "alert"  # the rule's make-room is not for it
    assert "asks 16 GPUs, the largest node has 8" in huge.summary
    assert "fragmented" not in huge.summary
    assert ALERTS.spec(huge).name == "GPUJobUnsatisfiable"  # type: ignore[union-attr]
    assert (job.kind, job.action, ALERTS.spec(job).name) == (  # type: ignore[union-attr]
        "starvation",
        "make-room",
        "GPUJobStarved",
    )
    # the decision makes room for the starving pod only
    assert starved_pods(findings, frozenset({"make-room", "make-room-now"})) == {"ml/job"}


def test_a_rule_without_the_reason_does_not_report_it() -> None:
    cluster = scattered(pending("huge", 16, priority=0, minutes=300))
    fragmented_only = replace(ANY, reasons=frozenset({"fragmented"}))
    profile = ScoringProfile.default(cluster)
    assert detect_starvation(cluster, fragmented_only, NOW, profile=profile) == []


def test_shipped_rules_report_an_oversized_pod_once_never_fragmented() -> None:
    for priority, rule, severity in (
        (2000, "high-priority-starved", "critical"),
        (0, "unsatisfiable-pending", "warning"),
    ):
        cluster = scattered(pending("huge", 16, priority=priority, minutes=300))
        report = run_detection(SHIPPED, None, cluster, NOW, profile=ScoringProfile.default(cluster))
        [finding] = report.findings
        assert (finding.kind, finding.labels["rule"], finding.severity) == (
            "unsatisfiable",
            rule,
            severity,
        )
        assert finding.action == "alert"


def two_nodes(*extra: Pod) -> Cluster:
    """Two 8-GPU nodes with 2 one-GPU pods each (of a Deployment: movable)."""
    return Cluster.build((node("n1"), node("n2")), [*fill("n1", 2), *fill("n2", 2), *extra])


def test_planner_makes_no_room_for_an_unsatisfiable_pod() -> None:
    huge = pending("huge", 16)
    cluster = two_nodes(huge)
    plan = make_plan(cluster, "make-room", now=NOW)
    # no evictions and nothing blocked: a blocked-only plan would raise DefragPlanBlocked
    assert plan.steps == () and plan.blocked == () and plan.targets == ()
    # the same pod at 8 GPUs gets its room (the planner would act on a satisfiable one)
    assert make_plan(two_nodes(replace(huge, num_gpu=8)), "make-room", now=NOW).steps


def test_a_gang_with_an_unsatisfiable_member_gets_no_room() -> None:
    ok = pending("w0", 8, gang="job-a")
    never = pending("w1", 16, gang="job-a")
    assert make_plan(two_nodes(ok, never), "make-room", now=NOW).steps == ()
    assert make_plan(two_nodes(ok), "make-room", now=NOW).steps  # alone, it gets room


# --- fragmentation: only sizes some node could hold -------------------------------------------

FRAG = FragmentationParams(sizes=(8,), node_stranded_min_gpus=2, cluster_stranded_min_gpus=8)


def test_an_oversized_pod_adds_no_fragmentation_size() -> None:
    cluster = scattered(pending("huge", 16))
    profile = ScoringProfile.default(cluster)
    findings = detect_fragmentation(cluster, FRAG, NOW, profile=profile)
    whole = next(f for f in findings if f.subject == "cluster")
    assert whole.evidence["sizes"] == [8]
    assert "16-GPU" not in whole.summary and "16" not in whole.evidence["stranded"]
    # the rule's own size larger than every node: no cluster finding for it either
    only16 = replace(FRAG, sizes=(16,), min_whole_free_nodes=0)
    assert [f.subject for f in detect_fragmentation(cluster, only16, NOW, profile=profile)] == []


def test_a_pod_no_node_could_hold_by_model_adds_no_size() -> None:
    cluster = scattered(pending("a100", 6, gpu_models=frozenset({"A100"})))
    params = replace(FRAG, sizes=(), min_whole_free_nodes=0)
    assert detect_fragmentation(cluster, params, NOW, profile=ScoringProfile.default(cluster)) == []
    # the same shape on H100s matters: 8 free GPUs, none usable by a 6-GPU job
    h100 = scattered(pending("h100", 6))
    found = detect_fragmentation(h100, params, NOW, profile=ScoringProfile.default(h100))
    assert "cluster" in {f.subject for f in found}


# --- gated pods, from the API and from kube-state-metrics -------------------------------------


def test_a_pod_gated_by_either_source_is_neither_starving_nor_given_room() -> None:
    from_api = pending("job", 8, scheduling_gates=(GATE,), gated=True)
    from_ksm = pending("job", 8, gated=True)  # the reason only: no gate names
    for job in (from_api, from_ksm):
        assert job.is_gated
        cluster = two_nodes(job)
        profile = ScoringProfile.default(cluster)
        assert detect_starvation(cluster, ANY, NOW + timedelta(hours=5), profile=profile) == []
        report = run_detection(SHIPPED, None, cluster, NOW + timedelta(hours=5), profile=profile)
        assert report.findings == ()
        assert make_plan(cluster, "make-room", now=NOW).steps == ()
    # the same pod without a gate starves and gets room (the test could fail)
    assert make_plan(two_nodes(pending("job", 8)), "make-room", now=NOW).steps


TARGET_SCRAPE = {"job": "kube-state-metrics", "instance": "10.0.3.7:8080"}


def ksm(labels: dict[str, str], value: float) -> Sample:
    return Sample({**labels, **TARGET_SCRAPE}, ((NOW.timestamp(), value),))


def pod_labels(name: str) -> dict[str, str]:
    return {"namespace": "ml", "pod": name, "uid": f"0f3c-{name}"}


class KubeStateMetrics:
    """Answers each of the shipped queries with the series kube-state-metrics exports (the
    PromQL itself is not evaluated: the reader must cope with the rows a query lets through)."""

    def __init__(self, reasons: list[Sample]) -> None:
        pods = {"a": ("n1", 2), "b": ("n2", 2), "held": ("", 8), "free": ("", 8)}
        self.answers: dict[str, list[Sample]] = {
            "allocatable": [
                ksm({"node": n, "resource": "nvidia_com_gpu", "unit": "integer"}, 8)
                for n in ("n1", "n2")
            ],
            "gpu_requests": [
                ksm(
                    {
                        **pod_labels(p),
                        "container": "main",
                        "node": on,
                        "resource": "nvidia_com_gpu",
                        "unit": "integer",
                    },
                    gpus,
                )
                for p, (on, gpus) in pods.items()
            ],
            "phase": [
                ksm({**pod_labels(p), "phase": "Running" if on else "Pending"}, 1)
                for p, (on, _) in pods.items()
            ],
            "info": [
                ksm(
                    {
                        **pod_labels(p),
                        "node": on,
                        "priority_class": "high-priority",
                        "host_ip": "",
                        "pod_ip": "",
                        "created_by_kind": "<none>",
                        "created_by_name": "<none>",
                        "host_network": "false",
                    },
                    1,
                )
                for p, (on, _) in pods.items()
            ],
            "gated": reasons,
        }
        self.pending = [
            Sample(
                {**pod_labels(p), "phase": "Pending", **TARGET_SCRAPE},
                tuple((NOW.timestamp() - 60.0 * i, 1.0) for i in range(180, -1, -1)),
            )
            for p in ("held", "free")
        ]
        self.queries = KubeStateQueries(
            allocatable="allocatable", gpu_requests="gpu_requests", phase="phase",
            pending="pending", info="info", gated="gated",
        )  # fmt: skip

    def instant(self, query: str, at: datetime | None = None) -> list[Sample]:
        return self.answers[query]

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Sample]:
        assert query == "pending"
        return self.pending


KNOWN_REASONS = (  # internal/store/pod.go podStatusReasons at v2.19.0
    "Evicted", "NodeAffinity", "NodeLost", "PreemptionByScheduler", "SchedulingGated",
    "Shutdown", "TerminationByKubelet", "UnexpectedAdmissionError",
)  # fmt: skip


def reasons_v2_20() -> list[Sample]:
    """v2.20: only the reason that is set."""
    return [ksm({**pod_labels("held"), "reason": "SchedulingGated"}, 1)]


def reasons_v2_19() -> list[Sample]:
    """v2.19: every known reason for every pod, 0 or 1 (what a query without ``== 1`` gets)."""
    return [
        ksm({**pod_labels(p), "reason": r}, 1 if (p, r) == ("held", "SchedulingGated") else 0)
        for p in ("a", "b", "held", "free")
        for r in KNOWN_REASONS
    ]


@pytest.mark.parametrize("reasons", [reasons_v2_20, reasons_v2_19])
def test_kube_state_metrics_reason_gates_the_pod(reasons: object) -> None:
    source = KubeStateMetrics(reasons())  # type: ignore[operator]
    cluster = cluster_from_kube_state(source.queries, source, NOW)
    held, free = cluster.pods["ml/held"], cluster.pods["ml/free"]
    assert held.gated and held.is_gated and held.scheduling_gates == ()
    assert not free.gated and not cluster.pods["ml/a"].gated
    # both wait 3 h for 8 GPUs with 6 + 6 free: only the ungated one is starving
    profile = ScoringProfile.default(cluster)
    findings = detect_starvation(cluster, ANY, NOW, profile=profile)
    assert [(f.subject, f.evidence["reason"]) for f in findings] == [("pod/ml/free", "fragmented")]
    groups = starved_groups(cluster, NOW, PlanOptions())
    assert [[p.key for p in g] for g in groups] == [["ml/free"]]


def test_the_shipped_queries_read_the_gates() -> None:
    for loaded in load_rules([ROOT / "rules"]):
        queries = getattr(loaded.rule, "queries", None)
        if isinstance(queries, KubeStateQueries):
            assert queries.gated == GATED_QUERY, loaded.rule.name
    assert GATED_QUERY == 'kube_pod_status_reason{reason="SchedulingGated"} == 1'
