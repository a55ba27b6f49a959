"""Repack: drains partly used nodes by gain per cost, within budgets; the exact check."""

from __future__ import annotations

import pytest

from defrag.model.workload import WorkloadMix
from defrag.plan import Constraints, EvictionBudget, make_plan
from defrag.plan.exact import exact_room
from defrag.scoring.profile import ProfileConfig
from tests.test_plan_support import NOW, cluster, fill, gpu_node, running


def spread() -> list:
    # Four 8-GPU nodes, each with two 1-GPU pods: 24 free GPUs, no whole node free.
    nodes = [gpu_node(f"n{i}") for i in range(1, 5)]
    pods = [p for i in range(1, 5) for p in fill(f"n{i}", 2)]
    return [nodes, pods]


DEFAULT_MIX = ProfileConfig().with_mix(WorkloadMix.default())


def test_repack_frees_whole_nodes_without_losing_pods() -> None:
    nodes, pods = spread()
    plan = make_plan(cluster(nodes, pods), "repack", now=NOW, profile=DEFAULT_MIX)
    assert plan.before["whole_free_nodes"] == 0
    assert plan.after["whole_free_nodes"] >= 1
    assert plan.after["free_gpus"] == plan.before["free_gpus"] == 24
    assert all(s.kind == "migrate" for s in plan.steps)
    assert plan.after["fgd_fragmented_gpus"] < plan.before["fgd_fragmented_gpus"]
    drained = {s.source for s in plan.steps}
    targets = {s.target for s in plan.steps}
    assert not drained & targets  # a node is drained or receives, never both


def test_repack_respects_the_plan_budget() -> None:
    nodes, pods = spread()
    plan = make_plan(
        cluster(nodes, pods), "repack", now=NOW,
        constraints=Constraints(budget=EvictionBudget(2, None, None)),
        profile=ProfileConfig().with_mix(WorkloadMix.default()),
    )  # fmt: skip
    assert 0 < len(plan.steps) <= 2


def test_repack_leaves_a_packed_cluster_alone() -> None:
    nodes = [gpu_node("n1"), gpu_node("n2")]
    pods = [*fill("n1", 8), *fill("n2", 8)]
    assert make_plan(cluster(nodes, pods), "repack", now=NOW).steps == ()


def test_repack_moves_no_protected_pod() -> None:
    nodes, pods = spread()
    pods = [
        *pods,
        running("keep", "n1", annotations={"defrag.io/evictable": "false"}),
        running("young", "n2", hours=0.01),
    ]
    plan = make_plan(cluster(nodes, pods), "repack", now=NOW)
    assert {"default/keep", "default/young"}.isdisjoint({s.pod for s in plan.steps})


def test_exact_room_counts_pdb_and_gang() -> None:
    # n1: 1 pod; n2: 2 pods; n1's pod belongs to a gang with a member on n3 → freeing n1
    # costs 2 evictions, freeing n2 costs 2 as well; a PDB forbids moving n2's pods → n1.
    from defrag.model.cluster import PodDisruptionBudget

    nodes = [gpu_node("n1"), gpu_node("n2"), gpu_node("n3")]
    pods = [
        running("g1", "n1", gang="j"),
        running("g2", "n3", gang="j"),
        running("w1", "n2", labels={"app": "w"}),
        running("w2", "n2", labels={"app": "w"}),
        *fill("n3", 3),
    ]
    pdb = PodDisruptionBudget("default", "w", {"app": "w"}, disruptions_allowed=0)
    best = exact_room(cluster(nodes, pods, [pdb]), size=8, now=NOW)
    assert best.feasible and best.rooms == ("n1",)
    assert {m[0] for m in best.moves} == {"default/g1", "default/g2"}
    # two evictions of 1 GPU × (5/60 batch restart + 2 h) = 2.083 each: 4.1667
    assert best.cost == pytest.approx(4.166666)
    blocked = exact_room(cluster(nodes, pods, [pdb]), size=8, now=NOW,
                         constraints=Constraints(budget=EvictionBudget(1, None, None)))  # fmt: skip
    assert not blocked.feasible
