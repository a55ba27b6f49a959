"""Answers reused by pod shape: the same findings and starved groups as asking for every pod.

The starvation detector diagnoses each shape of pending pod once per snapshot and profile
(``Diagnoser``, shared by the rules of one cycle); the planner asks whether a pod could ever
fit once per shape (``starved_groups``), and so does the fragmentation rule for the sizes that
matter (``sizes_that_matter``). The reference is the same code asked for every pod:
``repeatable`` patched to say no (the path the ``random`` policy takes). Random clusters with
many pods of a few shapes that differ in their identity (name, namespace, priority, labels,
owner, times) and some in their shape (GPUs, shares, CPU, model, selector, tolerations).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from unittest.mock import patch

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from defrag.detectors.fragmentation.core import FragmentationParams, sizes_that_matter
from defrag.detectors.starvation import core
from defrag.detectors.starvation.core import Diagnoser, StarvationParams, detect_starvation
from defrag.model.cluster import Cluster
from defrag.model.resources import OwnerRef, Pod, Taint, Toleration
from defrag.plan import shape
from defrag.plan.config import PlanOptions
from defrag.plan.planner import starved_groups
from defrag.plan.shape import IDENTITY, repeatable, shape_of
from defrag.plan.waiting import Waiting
from defrag.scoring.policies import POLICY_NAMES, make_policy
from defrag.scoring.profile import ProfileConfig
from defrag.scoring.satisfiable import empty_nodes, largest_gpu_node, satisfiable
from tests.test_plan_drains import clusters
from tests.test_plan_support import NOW

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SHIPPED = (
    StarvationParams("high-priority-starved", min_priority=1000, for_s=900.0),
    StarvationParams("fragmented-starved", any_priority=True, reasons=frozenset({"fragmented"})),
    StarvationParams(
        "unsatisfiable-pending", any_priority=True, reasons=frozenset({"unsatisfiable"})
    ),
)
"""The shipped starvation rules (rules/starvation.yaml), in file order."""


@st.composite
def shapes(draw: st.DrawFn) -> Pod:
    """A pending pod's shape (its identity is drawn per pod)."""
    kind = draw(st.sampled_from(["whole", "whole", "share", "cpu", "huge", "model", "picky"]))
    base = Pod("shape", cpu_milli=draw(st.sampled_from([1000, 4000, 200_000])), memory_mib=1024)
    if kind == "whole":
        return replace(base, num_gpu=draw(st.sampled_from([1, 2, 4, 8])))
    if kind == "share":
        return replace(base, num_gpu=1, gpu_milli=draw(st.sampled_from([300, 500])))
    if kind == "huge":
        return replace(base, num_gpu=16)
    if kind == "model":
        return replace(
            base, num_gpu=1, gpu_models=frozenset({draw(st.sampled_from(["A100", "H100"]))})
        )
    if kind == "picky":
        return replace(
            base, num_gpu=2, node_selector={"zone": draw(st.sampled_from(["a", "b"]))},
            tolerations=(Toleration("gpu", "Exists"),),
        )  # fmt: skip
    return base


@st.composite
def with_pending(draw: st.DrawFn) -> Cluster:
    """A random cluster (some nodes labelled, one tainted) with 1–24 pending pods of 1–4
    shapes, each pod with its own identity."""
    c = draw(clusters())
    nodes = list(c.nodes)
    for i, n in enumerate(nodes):
        labels = {"zone": "a" if i % 2 else "b"}
        taints = (Taint("gpu", "x", "NoSchedule"),) if i == 0 and draw(st.booleans()) else ()
        nodes[i] = replace(n, labels=labels, taints=taints)
    kinds = draw(st.lists(shapes(), min_size=1, max_size=4))
    pods = list(c.pods.values())
    for i in range(draw(st.integers(1, 24))):
        hours = draw(st.sampled_from([0.1, 1.0, 5.0]))
        pods.append(
            replace(
                draw(st.sampled_from(kinds)),
                name=f"wait-{i}",
                namespace=draw(st.sampled_from(["default", "team-a", "team-b"])),
                priority=draw(st.sampled_from([0, 100, 1000])),
                priority_class=draw(st.sampled_from(["", "training-high"])),
                owner=OwnerRef("Job", f"job-{i % 3}"),
                labels={"job-name": f"job-{i % 3}"} if draw(st.booleans()) else {},
                uid=f"uid-{i}",
                created_at=NOW - timedelta(hours=hours),
                pending_since=NOW - timedelta(hours=hours),
            )
        )
    return Cluster.build(nodes, pods, priority_classes={"training-high": 1000})


def _findings(c: Cluster, policy: str) -> list[object]:
    profile = ProfileConfig(policy).for_cluster(c)
    return [f for params in SHIPPED for f in detect_starvation(c, params, NOW, profile=profile)]


@SETTINGS
@given(with_pending(), st.sampled_from(POLICY_NAMES))
def test_starvation_findings_by_shape_are_the_ones_asked_per_pod(c: Cluster, policy: str) -> None:
    reused = _findings(c, policy)
    with patch.object(core, "repeatable", lambda _policy: False):
        asked = _findings(c, policy)
    assert reused == asked


@SETTINGS
@given(with_pending(), st.sampled_from([p for p in POLICY_NAMES if p != "random"]))
def test_each_diagnosis_is_the_pods_own(c: Cluster, policy: str) -> None:
    """Pod by pod, whichever pod of its shape was diagnosed first."""
    profile = ProfileConfig(policy).for_cluster(c)
    diagnoser = Diagnoser(c, profile.policy)
    for pod in c.pending_pods():
        assert diagnoser(pod) == core.diagnose(pod, c, profile.policy)


@SETTINGS
@given(with_pending(), st.integers(0, 1000))
def test_starved_groups_by_shape_are_the_ones_asked_per_pod(c: Cluster, priority: int) -> None:
    options = PlanOptions(starved_priority=priority)
    reused = starved_groups(c, NOW, options)
    with (
        patch("defrag.plan.planner.waiting", Waiting),  # nothing kept from the call above
        patch("defrag.plan.waiting.shape_of", lambda pod: object()),  # no two pods alike
    ):
        asked = starved_groups(c, NOW, options)
    assert reused == asked


@SETTINGS
@given(with_pending(), st.sampled_from([(8,), (1, 2, 4, 8), (3,), (16, 2)]), st.booleans())
def test_sizes_that_matter_by_shape_are_the_ones_asked_per_pod(
    c: Cluster, sizes: tuple[int, ...], waiting_too: bool
) -> None:
    """The fragmentation rule's sizes: whether each pending pod could ever fit, asked once per
    shape (and shared with the planner), against ``satisfiable`` asked for every pod."""
    params = FragmentationParams(sizes=sizes, include_waiting=waiting_too)
    reused = sizes_that_matter(c, params)
    empty = empty_nodes(c)
    wanted = set(sizes)
    if waiting_too:
        wanted |= {
            p.num_gpu
            for p in c.pending_pods()
            if p.num_gpu and not p.is_sharing and satisfiable(p, empty).ok
        }
    largest = largest_gpu_node(c.arrays)
    assert reused == tuple(sorted(k for k in wanted if k <= largest))


def test_identity_is_left_out_and_the_rest_is_shape() -> None:
    """Two pods differing in identity alone have one shape; any other field tells them
    apart (so a field added to Pod counts as shape until shown otherwise)."""
    a = Pod("a", namespace="x", num_gpu=2, node_selector={"zone": "a"})
    b = replace(
        a, name="b", namespace="y", uid="u", labels={"l": "1"}, annotations={"a": "1"},
        owner=OwnerRef("Job", "j"), gang="g", priority=5, priority_class="p", qos="Burstable",
        created_at=NOW, pending_since=NOW, pending_reason="Unschedulable", scheduled_at=NOW,
    )  # fmt: skip
    assert shape_of(a) == shape_of(b)
    assert shape.IDENTITY == IDENTITY
    others = [
        replace(a, num_gpu=4),
        replace(a, gpu_milli=500),
        replace(a, cpu_milli=1),
        replace(a, memory_mib=1),
        replace(a, gpu_models=frozenset({"H100"})),
        replace(a, gpu_memory_mib=1),
        replace(a, tolerations=(Toleration("k", "Exists"),)),
        replace(a, node_selector={"zone": "b"}),
        replace(a, pool="nvidia.com/mig-1g.10gb", pool_units=1),
        replace(a, scheduling_gates=("kueue",)),
    ]
    assert len({shape_of(p) for p in others} | {shape_of(a)}) == len(others) + 1


def test_a_random_policy_is_asked_for_every_pod() -> None:
    """Its scores are draws: each ask moves its generator, which the planner reads next."""
    assert not repeatable(make_policy("random"))
    assert all(repeatable(make_policy(p)) for p in POLICY_NAMES if p != "random")
