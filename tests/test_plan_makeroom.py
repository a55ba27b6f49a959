"""Make-room: the seed scenario, priorities, PDBs counted down, gangs, determinism."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from defrag.adapters.snapshot import load_snapshot
from defrag.model.cluster import Cluster, PodDisruptionBudget
from defrag.model.resources import OwnerRef
from defrag.plan import Constraints, EvictionBudget, MakeRoomMode, PlanOptions, make_plan
from defrag.plan.exact import exact_room
from tests.test_plan_support import NOW, cluster, fill, gpu_node, pending, running

SEED = Path(__file__).parent / "fixtures" / "snapshots" / "scattered_20.json"


@pytest.fixture(scope="module")
def seed() -> Cluster:
    return load_snapshot(SEED)


def test_seed_scenario_frees_a_node_for_the_8_gpu_job(seed: Cluster) -> None:
    plan = make_plan(seed, "make-room", now=NOW)
    assert plan.before["largest_placeable_job"] < 8
    assert plan.after["largest_placeable_job"] >= 8
    assert plan.after["free_gpus"] == plan.before["free_gpus"] == 20  # nothing lost, all moved
    job = seed.pods["research/llm-train-0"]
    for step in plan.steps:
        pod = seed.pods[step.pod]
        assert pod.priority < job.priority
        assert pod.owner is not None
        assert pod.annotations.get("defrag.io/evictable") != "false"
        assert not any(pdb.selects(pod) and pdb.disruptions_allowed == 0 for pdb in seed.pdbs)


@pytest.mark.parametrize("preempt", [False, True])
def test_seed_scenario_within_1_2x_of_the_exact_optimum(seed: Cluster, preempt: bool) -> None:
    job = seed.pods["research/llm-train-0"]
    plan = make_plan(
        seed,
        "make-room",
        now=NOW,
        options=PlanOptions(mode=MakeRoomMode.of(preempt=preempt, migrate_any_priority=True)),
    )
    best = exact_room(
        seed, size=8, cpu_milli=job.cpu_milli, memory_mib=job.memory_mib,
        below_priority=job.priority, preempt=preempt, now=NOW,
    )  # fmt: skip
    assert best.feasible
    assert len(plan.steps) <= 1.2 * best.evictions  # 3 ≤ 1.2 × 3: two 2-GPU pods and a 4-GPU one
    assert plan.cost <= 1.2 * best.cost


@pytest.mark.parametrize("migrate_any", [True, False])
def test_lower_priority_victims_are_preferred(migrate_any: bool) -> None:
    # n1: three priority-100 pods (as high as the job); n2: five priority-50 pods; n3: three
    # priority-0 pods, all 1 GPU, created 2 h ago (no checkpoint: 2 h of work lost each).
    # n1 costs 3 × (1 + 1 × 2) × (1 + 100/1000) = 9.9, n3 3 × (1 + 2) × 1 = 9: n3 wins; with
    # the strictly-lower rule (migrate_any off) n1 is not even a candidate.
    nodes = [gpu_node("n1"), gpu_node("n2"), gpu_node("n3")]
    pods = [
        *fill("n1", 3, priority=100),
        *fill("n2", 5, priority=50),
        *fill("n3", 3, priority=0),
        pending("job", 8, priority=100),
    ]
    options = PlanOptions(mode=MakeRoomMode.of(preempt=True, migrate_any_priority=migrate_any))
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW, options=options)
    moved = {s.pod for s in plan.steps}
    assert moved == {f"default/n3-p{i}" for i in range(3)}
    assert {s.kind for s in plan.steps} == {"migrate"}
    assert plan.after["largest_placeable_job"] == 8


def test_same_priority_pods_move_only_where_they_fit() -> None:
    # Both nodes hold four priority-100 pods, the job is priority 100. The strictly-lower rule
    # finds no victim; migrations of any priority move n1's four pods to n2's four free GPUs.
    nodes = [gpu_node("n1"), gpu_node("n2")]
    pods = [*fill("n1", 4, priority=100), *fill("n2", 4, priority=100), pending("job", 8)]
    strict = make_plan(cluster(nodes, pods), "make-room", now=NOW,
                       options=PlanOptions(mode=MakeRoomMode.LOWER_PRIORITY))  # fmt: skip
    assert strict.steps == ()
    assert {b.constraint for b in strict.blocked} == {"priority"}
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW)
    assert [(s.kind, s.source, s.target) for s in plan.steps] == [("migrate", "n1", "n2")] * 4


def test_pdb_exhausted_mid_plan_blocks_later_steps() -> None:
    # Two pending 8-GPU jobs; each node holds one pod of the same PDB (1 disruption allowed).
    pdb = PodDisruptionBudget("default", "web", {"app": "web"}, disruptions_allowed=1)
    nodes = [gpu_node(f"n{i}") for i in range(1, 4)]
    pods = [
        running("web-1", "n1", labels={"app": "web"}),
        running("web-2", "n2", labels={"app": "web"}),
        running("web-3", "n3", labels={"app": "web"}),
        pending("job-a", 8),
        pending("job-b", 8),
    ]
    plan = make_plan(cluster(nodes, pods, [pdb]), "make-room", now=NOW)
    web_steps = [s for s in plan.steps if "web" in s.pod]
    assert len(web_steps) == 1  # the PDB's single disruption, never two
    assert any(b.constraint == "pdb" for b in plan.blocked)
    assert len(plan.targets) == 1


def test_gang_victims_move_whole() -> None:
    # n1's cheapest victim is one of a 4-pod gang spread over n1..n4: all four must go.
    nodes = [gpu_node(f"n{i}") for i in range(1, 7)]
    gang = [running(f"g{i}", f"n{i}", 1, gang="train", hours=1) for i in range(1, 5)]
    pods = [*gang, *fill("n1", 6, prefix="a"), *fill("n2", 6, prefix="b"),
            *fill("n5", 7, prefix="c"), *fill("n6", 7, prefix="d"), pending("job", 8)]  # fmt: skip
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW)
    moved = {s.pod for s in plan.steps}
    members = {f"default/g{i}" for i in range(1, 5)}
    # n3 and n4 hold one gang member each: freeing one costs the whole gang (4 × 2 = 8),
    # still cheaper than moving n5's seven pods (7 × 3 = 21).
    assert moved == members
    for s in plan.steps:
        if s.pod in members:
            assert s.gang == "default/train"


def test_gang_with_a_protected_member_does_not_move() -> None:
    nodes = [gpu_node("n1"), gpu_node("n2"), gpu_node("n3")]
    gang = [
        running("g1", "n1", gang="train"),
        running("g2", "n2", gang="train", annotations={"defrag.io/evictable": "false"}),
    ]
    pods = [*gang, *fill("n1", 3), *fill("n2", 3), *fill("n3", 5), pending("job", 8)]
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW)
    assert "default/g1" not in {s.pod for s in plan.steps}


def test_pending_gang_is_given_room_whole_or_not_at_all() -> None:
    # Room for 3 of the 4 gang members exists (3 nodes can be freed); the 4th cannot fit.
    nodes = [gpu_node(f"n{i}") for i in range(1, 4)]
    pods = [*fill("n1", 1), *fill("n2", 1), *fill("n3", 1)]
    pods += [pending(f"w{i}", 8, gang="big") for i in range(4)]
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW)
    assert plan.steps == ()
    assert {b.pod for b in plan.blocked if b.constraint == "gang"} == {
        f"default/w{i}" for i in range(4)
    }


@pytest.mark.parametrize(
    ("swaps", "steps"),
    [
        # Preempting the 8-GPU "big" to run the 8-GPU job frees nothing (a swap: the
        # scheduler's own priority preemption does that): refused unless swaps are allowed.
        (False, []),
        (True, [("preempt", "default/big", None)]),
    ],
)
def test_preempts_only_what_cannot_move(swaps: bool, steps: list[tuple[str, str, None]]) -> None:
    # Every node is full but n1 holds a low-priority 8-GPU job: nowhere to move it.
    nodes = [gpu_node("n1"), gpu_node("n2")]
    pods = [running("big", "n1", 8, priority=0), *fill("n2", 8, priority=0), pending("job", 8)]
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW, options=PlanOptions(swaps=swaps))
    assert [(s.kind, s.pod, s.target) for s in plan.steps] == steps
    no_preempt = make_plan(
        cluster(nodes, pods),
        "make-room",
        now=NOW,
        options=PlanOptions(mode=MakeRoomMode.MIGRATE, swaps=True),
    )
    assert no_preempt.steps == ()


def test_plan_budget_limits_evictions() -> None:
    nodes = [gpu_node(f"n{i}") for i in range(1, 4)]
    pods = [*fill("n1", 4), *fill("n2", 4), *fill("n3", 2), pending("job", 8)]
    tight = make_plan(cluster(nodes, pods), "make-room", now=NOW,
                      constraints=Constraints(budget=EvictionBudget(1, None, None)))  # fmt: skip
    assert tight.steps == ()
    assert any(b.constraint == "budget-window" for b in tight.blocked)
    loose = make_plan(cluster(nodes, pods), "make-room", now=NOW,
                      constraints=Constraints(budget=EvictionBudget(2, None, None)))  # fmt: skip
    assert len(loose.steps) == 2  # n3's two pods move to n1 / n2


def test_plan_is_deterministic(seed: Cluster) -> None:
    first = make_plan(seed, "all", now=NOW).to_dict()
    second = make_plan(seed, "all", now=NOW).to_dict()
    assert first == second


def test_bare_and_daemonset_pods_stay() -> None:
    nodes = [gpu_node("n1"), gpu_node("n2")]
    pods = [
        running("bare", "n1", owner=None),
        running("ds", "n2", owner=OwnerRef("DaemonSet", "dcgm")),
        *fill("n2", 2),
        pending("job", 8),
    ]
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW)
    moved = {s.pod for s in plan.steps}
    assert "default/bare" not in moved and "default/ds" not in moved
    assert plan.steps == ()  # each node holds a pod that may not move
    assert {b.constraint for b in plan.blocked} >= {"bare-pod", "daemonset"}


DOMAINS = ((0, 1), (2, 3), (4, 5), (6, 7))  # four NVLink pairs


@pytest.mark.parametrize(
    "job,expected_moves",
    [
        # a 2-GPU job needs one whole pair: the pair holding one pod is freed, not the node
        (2, 1),
        # a 4-GPU job spans two whole pairs: two pods move
        (4, 2),
    ],
)
def test_nvlink_domains_are_freed_not_whole_nodes(job: int, expected_moves: int) -> None:
    # n1: one 1-GPU pod in each pair (GPUs 0, 2, 4, 6): 4 GPUs free but no pair whole.
    # n2 and n3: one GPU free each → the moved pods land there.
    nodes = [gpu_node("n1", domains=DOMAINS), gpu_node("n2", domains=DOMAINS), gpu_node("n3")]
    pods = [
        *[running(f"a{g}", "n1") for g in range(4)],
        *fill("n2", 7, prefix="b"),
        *fill("n3", 7, prefix="c"),
        pending("job", job),
    ]
    c = cluster(nodes, pods)
    c = Cluster.build(
        c.nodes,
        [
            *(replace(p, gpu_indices=(2 * int(p.name[1]),)) for p in pods if p.name[0] == "a"),
            *(p for p in pods if p.name[0] != "a"),
        ],
    )
    plan = make_plan(c, "make-room", now=NOW)
    assert len(plan.steps) == expected_moves
    assert {s.source for s in plan.steps} == {"n1"}
    assert plan.after["largest_placeable_job"] >= job


def test_a_pod_that_fits_keeps_its_room() -> None:
    # n1 is empty: job "a" (higher priority) fits there and is not a target. Job "b" needs
    # room too; n2's four pods must go to n3, never onto n1 (held for "a").
    nodes = [gpu_node("n1"), gpu_node("n2"), gpu_node("n3")]
    pods = [
        *fill("n2", 4),
        *fill("n3", 4),
        pending("a", 8, priority=200),
        pending("b", 8, priority=100),
    ]
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW)
    assert plan.targets == ("default/b (8 GPU)",)
    assert {(s.source, s.target) for s in plan.steps} == {("n2", "n3")}
    assert len(plan.steps) == 4


@pytest.mark.parametrize(
    ("only", "helped"),
    [
        (None, {"default/a", "default/b", "default/g-0", "default/g-1"}),  # every pending pod
        (frozenset({"default/b"}), {"default/b"}),  # the pod a starvation rule found
        (frozenset({"default/g-0"}), {"default/g-0", "default/g-1"}),  # a named pod's gang
        (frozenset(), set()),
    ],
)
def test_make_room_only_for_the_named_pods(only: frozenset[str] | None, helped: set[str]) -> None:
    # Four 8-GPU nodes, each with 6 GPUs held by priority-0 pods: 2 free per node, so no
    # 4-GPU pod fits anywhere until make-room moves pods off one node. Helping all four takes
    # preemptions of four 1-GPU pods per 4-GPU pod (a swap, and costlier than an hour's wait):
    # this test is about which pods get room, so swaps and the worth check are lifted.
    nodes = [gpu_node(f"n{i}") for i in range(4)]
    pods = [p for i in range(4) for p in fill(f"n{i}", 6)]
    waiting = [
        pending("a", 4, priority=500),
        pending("b", 4, priority=500),
        pending("g-0", 4, priority=500, gang="g"),
        pending("g-1", 4, priority=500, gang="g"),
    ]
    plan = make_plan(
        cluster(nodes, [*pods, *waiting]),
        "make-room",
        now=NOW,
        options=PlanOptions(only=only, swaps=True, room_worth=0.0),
        # 4 rooms × 4 preemptions = 16 evictions in one namespace: past the default budget
        constraints=Constraints(budget=EvictionBudget(50, None, None)),
    )
    targets = {t.split(" ")[0] for t in plan.targets}
    assert targets == helped
    assert {s.for_pod for s in plan.steps if s.for_pod} <= helped
