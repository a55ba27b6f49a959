"""Constraints as the scheduler reads them, in the one filter every part of defrag shares.

Semantics from ``k8s.io/component-helpers/scheduling/corev1/nodeaffinity`` and
``k8s.io/apimachinery/pkg/labels`` (selector.go): terms ORed, expressions ANDed; NotIn and
DoesNotExist match an absent label; Gt/Lt compare one integer and never match a label that is
not an integer; matchFields knows ``metadata.name``; an empty term matches nothing.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from defrag.detectors.starvation.core import StarvationParams, detect_starvation
from defrag.model.cluster import Cluster
from defrag.model.resources import Node, Pod, Taint, Toleration
from defrag.model.selectors import NodeSelector, NodeSelectorTerm, Requirement
from defrag.model.workload import WorkloadMix
from defrag.plan import make_plan
from defrag.scoring.filters import R_SELECTOR, R_TAINT, R_UNSCHEDULABLE
from defrag.scoring.fragmentation import fragmentation_report
from defrag.scoring.framework import Placement, Unschedulable
from defrag.scoring.policies.reserve_binpack import ReserveBinpack
from defrag.scoring.profile import ScoringProfile
from defrag.scoring.scheduler import explain, schedule
from tests.test_plan_support import NOW, fill, pending

LABELS = {
    "a100": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
             "node.kubernetes.io/instance-type": "p4d.24xlarge"},
    "h100": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
             "node.kubernetes.io/instance-type": "p5.48xlarge", "zone": "b"},
    "t4": {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.memory": "15360",
           "node.kubernetes.io/instance-type": "g4dn.12xlarge"},
}  # fmt: skip


def _cluster(**node_kw: object) -> Cluster:
    nodes = [
        Node(name, 64_000, 512_000, 8, labels["nvidia.com/gpu.product"], labels=labels)
        for name, labels in LABELS.items()
    ]
    return Cluster.build([replace(n, **node_kw) if n.name == "h100" else n for n in nodes])


def _term(*reqs: Requirement, fields: tuple[Requirement, ...] = ()) -> NodeSelectorTerm:
    return NodeSelectorTerm(tuple(reqs), fields)


def _pod(**kw: object) -> Pod:
    return Pod("p", num_gpu=1, **kw)  # type: ignore[arg-type]


def _affinity(*terms: NodeSelectorTerm) -> NodeSelector:
    return NodeSelector(terms)


R = Requirement
PRODUCT = "nvidia.com/gpu.product"


@pytest.mark.parametrize(
    ("pod", "admitted"),
    [
        (_pod(), {"a100", "h100", "t4"}),
        (_pod(node_selector={"node.kubernetes.io/instance-type": "p5.48xlarge"}), {"h100"}),
        (_pod(node_selector={"zone": "b", "node.kubernetes.io/instance-type": "p4d.24xlarge"}),
         set()),
        (_pod(affinity=_affinity(_term(R(PRODUCT, "In", ("Tesla-T4", "NVIDIA-A100-SXM4-80GB"))))),
         {"a100", "t4"}),
        (_pod(affinity=_affinity(_term(R(PRODUCT, "NotIn", ("Tesla-T4",))))), {"a100", "h100"}),
        (_pod(affinity=_affinity(_term(R("zone", "Exists")))), {"h100"}),
        # DoesNotExist (and NotIn) match where the label is absent
        (_pod(affinity=_affinity(_term(R("zone", "DoesNotExist")))), {"a100", "t4"}),
        (_pod(affinity=_affinity(_term(R("zone", "NotIn", ("b",))))), {"a100", "t4"}),
        # Gt 40000: 81920 > 40000 and 81559 > 40000, 15360 is not
        (_pod(affinity=_affinity(_term(R("nvidia.com/gpu.memory", "Gt", ("40000",))))),
         {"a100", "h100"}),
        # Lt 81600: 81559 < 81600 and 15360 < 81600, 81920 is not
        (_pod(affinity=_affinity(_term(R("nvidia.com/gpu.memory", "Lt", ("81600",))))),
         {"h100", "t4"}),
        # Gt on a label that is not an integer never matches
        (_pod(affinity=_affinity(_term(R(PRODUCT, "Gt", ("1",))))), set()),
        (_pod(affinity=_affinity(_term(fields=(R("metadata.name", "In", ("t4",)),)))), {"t4"}),
        (_pod(affinity=_affinity(_term(fields=(R("metadata.name", "NotIn", ("t4",)),)))),
         {"a100", "h100"}),
        # terms are ORed; expressions inside one term ANDed
        (_pod(affinity=_affinity(_term(R("zone", "Exists")),
                                 _term(R(PRODUCT, "In", ("Tesla-T4",))))),
         {"h100", "t4"}),
        (_pod(affinity=_affinity(_term(R("zone", "Exists"), R(PRODUCT, "In", ("Tesla-T4",))))),
         set()),
        # an empty term matches no node
        (_pod(affinity=_affinity(_term())), set()),
        # nodeSelector and affinity both apply
        (_pod(node_selector={"node.kubernetes.io/instance-type": "p4d.24xlarge"},
              affinity=_affinity(_term(R(PRODUCT, "NotIn", ("NVIDIA-A100-SXM4-80GB",))))), set()),
    ],
)  # fmt: skip
def test_selector_and_affinity(pod: Pod, admitted: set[str]) -> None:
    verdicts = {v.node: v for v in explain(pod, _cluster(), ReserveBinpack())}
    assert {n for n, v in verdicts.items() if v.score is not None} == admitted
    for name in set(LABELS) - admitted:
        assert verdicts[name].reasons == (R_SELECTOR,)
    placed = schedule(pod, _cluster(), ReserveBinpack())
    assert (placed.node if isinstance(placed, Placement) else None) in (admitted | {None})
    assert isinstance(placed, Placement) == bool(admitted)


@pytest.mark.parametrize(
    ("taint", "tolerations", "admitted"),
    [
        (Taint("gpu", "NoSchedule", "true"), (), False),
        (Taint("gpu", "NoExecute", "true"), (), False),
        (Taint("gpu", "PreferNoSchedule", "true"), (), True),
        (Taint("gpu", "NoSchedule", "true"), (Toleration("gpu", "Equal", "true"),), True),
        (Taint("gpu", "NoExecute", "true"), (Toleration("gpu", "Exists", "", "NoExecute"),), True),
        (Taint("gpu", "NoExecute", "true"), (Toleration("gpu", "Exists", "", "NoSchedule"),),
         False),
        (Taint("gpu", "NoSchedule", "true"), (Toleration("", "Exists"),), True),
    ],
)  # fmt: skip
def test_taints_and_tolerations(
    taint: Taint, tolerations: tuple[Toleration, ...], admitted: bool
) -> None:
    cluster = _cluster(taints=(taint,))
    pod = _pod(node_selector={"zone": "b"}, tolerations=tolerations)  # only h100 qualifies
    verdict = {v.node: v for v in explain(pod, cluster, ReserveBinpack())}["h100"]
    assert (verdict.score is not None) == admitted
    if not admitted:
        assert verdict.reasons == (R_TAINT,)


def test_cordoned_node_is_filtered() -> None:
    verdict = {v.node: v for v in explain(_pod(), _cluster(unschedulable=True), ReserveBinpack())}[
        "h100"
    ]
    assert verdict.reasons == (R_UNSCHEDULABLE,)
    # kube-scheduler's NodeUnschedulable filter: tolerating the cordon's taint
    # node.kubernetes.io/unschedulable:NoSchedule (here by Exists on every key) admits the node
    tolerant = _pod(tolerations=(Toleration("", "Exists"),))
    assert {v.node: v for v in explain(tolerant, _cluster(unschedulable=True), ReserveBinpack())}[
        "h100"
    ].score == 0


def test_make_room_never_frees_a_node_the_pod_excludes() -> None:
    # n-cheap has 1 evictable pod on it, n-dear 3: the cheapest room is n-cheap, but the pending
    # pod's nodeSelector names n-dear's instance type, so only n-dear may be freed.
    cheap = {"node.kubernetes.io/instance-type": "g5.48xlarge"}
    dear = {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    nodes = [
        Node("n-cheap", 64_000, 512_000, 8, "A100", labels=cheap),
        Node("n-dear", 64_000, 512_000, 8, "A100", labels=dear),
        Node("n-spare", 64_000, 512_000, 8, "A100", labels=cheap),
    ]
    job = replace(pending("job", 8, priority=1000), node_selector=dear)
    pods = [*fill("n-cheap", 1), *fill("n-dear", 3), *fill("n-spare", 4), job]
    plan = make_plan(Cluster.build(nodes, pods), "make-room", now=NOW)
    assert plan.steps
    assert {s.source for s in plan.steps} == {"n-dear"}


def test_make_room_gives_nothing_when_no_node_admits_the_pod() -> None:
    nodes = [Node(f"n{i}", 64_000, 512_000, 8, "A100") for i in range(2)]
    job = replace(pending("job", 8, priority=1000), node_selector={"zone": "nowhere"})
    cluster = Cluster.build(nodes, [*fill("n0", 2), *fill("n1", 2), job])
    plan = make_plan(cluster, "make-room", now=NOW)
    assert plan.steps == ()


def test_gated_pod_is_not_starving_and_gets_no_room() -> None:
    # Kueue gates its pods with kueue.x-k8s.io/admission until admitted
    # (kueue pkg/controller/jobs/pod/constants); the scheduler does not consider them.
    nodes = [Node(f"n{i}", 64_000, 512_000, 8, "A100") for i in range(2)]
    job = replace(pending("job", 8, priority=1000), scheduling_gates=("kueue.x-k8s.io/admission",))
    cluster = Cluster.build(nodes, [*fill("n0", 2), *fill("n1", 2), job])
    params = StarvationParams(for_s=60, min_priority=1000)
    assert (
        detect_starvation(
            cluster, params, NOW + timedelta(hours=5), profile=ScoringProfile.default(cluster)
        )
        == []
    )
    assert make_plan(cluster, "make-room", now=NOW).steps == ()
    free_job = replace(job, scheduling_gates=())
    ungated = Cluster.build(nodes, [*fill("n0", 2), *fill("n1", 2), free_job])
    assert (
        len(
            detect_starvation(
                ungated, params, NOW + timedelta(hours=5), profile=ScoringProfile.default(ungated)
            )
        )
        == 1
    )
    assert make_plan(ungated, "make-room", now=NOW).steps


def test_starvation_counts_free_gpus_only_where_the_pod_may_run() -> None:
    # 8 GPUs free in total, but 6 of them on a T4 node the pod's NotIn excludes: the pod is
    # short of GPUs (2 < 4 usable), not a victim of fragmentation.
    nodes = [
        Node("t4", 64_000, 512_000, 8, "Tesla-T4", labels={PRODUCT: "Tesla-T4"}),
        Node("a100", 64_000, 512_000, 8, "A100", labels={PRODUCT: "A100"}),
    ]
    job = replace(
        pending("job", 4, priority=1000),
        affinity=_affinity(_term(R(PRODUCT, "NotIn", ("Tesla-T4",)))),
    )
    cluster = Cluster.build(nodes, [*fill("t4", 2), *fill("a100", 6), job])
    (finding,) = detect_starvation(
        cluster,
        StarvationParams(for_s=60, min_priority=1000),
        NOW,
        profile=ScoringProfile.default(cluster),
    )
    assert finding.evidence["reason"] == "insufficient-gpus"
    assert finding.evidence["free_gpus"] == 2


# --- pools: MIG profiles and time-sliced replicas -------------------------------------------


def _pool_cluster() -> Cluster:
    nodes = [
        Node("mig-a", 64_000, 512_000, 0, "A100-MIG", pools={"nvidia.com/mig-1g.10gb": 7}),
        Node("mig-b", 64_000, 512_000, 0, "A100-MIG", pools={"nvidia.com/mig-1g.10gb": 7}),
        Node("shared", 64_000, 512_000, 0, "Tesla-T4-SHARED", pools={"nvidia.com/gpu": 16}),
        Node("whole", 64_000, 512_000, 8, "A100"),
    ]
    mig = [
        Pod(f"m{i}", pool="nvidia.com/mig-1g.10gb", pool_units=1, node="mig-a", phase="Running")
        for i in range(3)
    ]
    return Cluster.build(nodes, mig)


def test_mig_pod_goes_to_its_profile_and_packs() -> None:
    # seed rule on the profile's units, R = 1 < T = 7: mig-a F = 4 → int((1 − 3/7)·100) = 57;
    # mig-b F = T → 0 (keep whole free pools); the other nodes have no such profile.
    pod = Pod("new", pool="nvidia.com/mig-1g.10gb", pool_units=1)
    cluster = _pool_cluster()
    scores = {v.node: v.score for v in explain(pod, cluster, ReserveBinpack())}
    assert scores == {"mig-a": 57, "mig-b": 0, "shared": None, "whole": None}
    placed = schedule(pod, cluster, ReserveBinpack())
    assert isinstance(placed, Placement) and placed.node == "mig-a" and placed.gpus == ()
    bound = cluster.with_pod_added(replace(pod, node="mig-a", phase="Running"))
    col = bound.arrays.pool_index["nvidia.com/mig-1g.10gb"]
    assert int(bound.arrays.pool_free[bound.arrays.index["mig-a"], col]) == 3
    assert bound.with_pod_removed("default/new").same_state(cluster)


def test_whole_gpu_pod_may_use_time_sliced_replicas_as_kube_scheduler_would() -> None:
    # nvidia.com/gpu: 2 fits the "shared" node's 16 replicas and the whole node's 8 GPUs.
    # shared: seed rule on 16 units, F = T → 0; whole: R = 2 < 8, F = T → 0. The tie goes to
    # the node with the fewest GPUs: shared (0 whole GPUs, its 16 replicas are a pool) before
    # whole (8) — the first name too.
    pod = Pod("new", num_gpu=2)
    verdicts = {v.node: v for v in explain(pod, _pool_cluster(), ReserveBinpack())}
    assert verdicts["shared"].score == 0 and verdicts["whole"].score == 0
    assert verdicts["mig-a"].score is None
    placed = schedule(pod, _pool_cluster(), ReserveBinpack())
    assert isinstance(placed, Placement) and placed.node == "shared" and placed.gpus == ()


def test_pool_units_never_count_as_whole_gpus() -> None:
    rep = fragmentation_report(_pool_cluster(), WorkloadMix.default())
    assert rep.total_gpus == 8 and rep.free_gpus == 8 and rep.largest_placeable_job == 8
    pools = {p.resource: p for p in rep.pools}
    assert (pools["nvidia.com/mig-1g.10gb"].total, pools["nvidia.com/mig-1g.10gb"].free) == (14, 11)
    assert pools["nvidia.com/mig-1g.10gb"].largest_request == 7
    assert (pools["nvidia.com/gpu"].total, pools["nvidia.com/gpu"].free) == (16, 16)
    pod = Pod("big", num_gpu=8, gpu_models=frozenset({"A100"}))
    assert isinstance(schedule(pod, _pool_cluster(), ReserveBinpack()), Placement)
    mig = Pod("x", pool="nvidia.com/mig-7g.80gb", pool_units=1)
    assert isinstance(schedule(mig, _pool_cluster(), ReserveBinpack()), Unschedulable)
