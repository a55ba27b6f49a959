"""Filters, the policies and the scheduler, table-driven with the arithmetic in comments."""

from __future__ import annotations

import numpy as np
import pytest

from defrag.model import Cluster, Node, Pod
from defrag.model.resources import Taint, Toleration
from defrag.model.workload import Shape, WorkloadMix
from defrag.scoring.filters import R_CPU, R_GPU, R_MODEL, R_TAINT, R_TOPOLOGY
from defrag.scoring.framework import Placement, Unschedulable
from defrag.scoring.policies import POLICY_NAMES, UnknownPolicy, make_policy
from defrag.scoring.policies.reserve_binpack import ReserveBinpack
from defrag.scoring.scheduler import explain, schedule, select


def worked_example() -> Cluster:
    """docs/concepts.md's worked example: node-1 has 1 of 8 GPUs free, node-2 8, node-3 4."""
    nodes = [Node(f"node-{i}", 64000, 512000, 8, "A100") for i in (1, 2, 3)]
    pods = [
        Pod("seven", num_gpu=7, node="node-1", phase="Running"),
        Pod("four", num_gpu=4, node="node-3", phase="Running"),
    ]
    return Cluster.build(nodes, pods)


@pytest.mark.parametrize(
    ("gpus", "expected_node", "expected_scores"),
    [
        # R=1 < T=8. node-1: F=1 → (1 − (1−1)/8)·100 = 100;
        # node-3: F=4 → int((1 − 3/8)·100) = int(62.5) = 62; node-2: F=T → 0.
        (1, "node-1", {"node-1": 100, "node-2": 0, "node-3": 62}),
        # R=8 ≥ T: node-2 entirely free → 100; node-1 and node-3 are filtered (F < R).
        (8, "node-2", {"node-1": None, "node-2": 100.0, "node-3": None}),
        # R=4 < T: node-3 F=4 → (1 − 0/8)·100 = 100; node-2 F=T → 0; node-1 filtered.
        (4, "node-3", {"node-1": None, "node-2": 0.0, "node-3": 100.0}),
    ],
)
def test_reserve_binpack_worked_example(
    gpus: int, expected_node: str, expected_scores: dict[str, float | None]
) -> None:
    cluster = worked_example()
    pod = Pod("new", num_gpu=gpus)
    placement = schedule(pod, cluster, ReserveBinpack())
    assert isinstance(placement, Placement)
    assert placement.node == expected_node
    verdicts = {v.node: v for v in explain(pod, cluster, ReserveBinpack())}
    for node, score in expected_scores.items():
        assert verdicts[node].score == score
        if score is None:
            assert verdicts[node].reasons == (R_GPU,)


def tie_cluster() -> Cluster:
    """a-big: 1 of 8 GPUs free; b-small: 1 of 2 free; c-small: 1 of 2 free; d-four: 2 of 4."""
    nodes = [
        Node("a-big", 64000, 512000, 8, "A100"),
        Node("b-small", 64000, 512000, 2, "A100"),
        Node("c-small", 64000, 512000, 2, "A100"),
        Node("d-four", 64000, 512000, 4, "A100"),
    ]
    pods = [
        Pod("seven", num_gpu=7, node="a-big", phase="Running"),
        Pod("one-b", num_gpu=1, node="b-small", phase="Running"),
        Pod("one-c", num_gpu=1, node="c-small", phase="Running"),
        Pod("two-d", num_gpu=2, node="d-four", phase="Running"),
    ]
    return Cluster.build(nodes, pods)


@pytest.mark.parametrize(
    ("pod", "expected_node", "expected_scores"),
    [
        # R=1: a-big F=1 → (1 − 0/8)·100 = 100; b-small and c-small F=1 → (1 − 0/2)·100 = 100;
        # d-four F=2 → (1 − 1/4)·100 = 75. Three tie at 100: the fewest GPUs (2) wins, and of
        # b-small and c-small the first name. Name order alone would take a-big.
        (Pod("new", num_gpu=1), "b-small", {"a-big": 100, "b-small": 100, "d-four": 75}),
        # R=2: only d-four fits (F=2 → (1 − 0/4)·100 = 100): no tie, the score decides.
        (Pod("new", num_gpu=2), "d-four", {"a-big": None, "b-small": None, "d-four": 100}),
        # a 0.5-GPU share: a-big → int((1 − 0.5/8)·100) = 93, the small nodes
        # → int((1 − 0.5/2)·100) = 75, d-four → int((1 − 1.5/4)·100) = 62: a-big, no tie.
        (Pod("new", num_gpu=1, gpu_milli=500), "a-big", {"a-big": 93, "b-small": 75}),
    ],
)
def test_reserve_binpack_ties_go_to_the_smallest_node(
    pod: Pod, expected_node: str, expected_scores: dict[str, int | None]
) -> None:
    cluster = tie_cluster()
    placement = schedule(pod, cluster, ReserveBinpack())
    assert isinstance(placement, Placement)
    assert placement.node == expected_node
    verdicts = {v.node: v.score for v in explain(pod, cluster, ReserveBinpack())}
    for node, score in expected_scores.items():
        assert verdicts[node] == score


def test_select_without_a_tie_order_takes_the_first_name() -> None:
    # the same 100–100–100–75 scores as above: no tie order → row 0 (a-big); the order
    # −GPUs (−8, −2, −2, −4) → row 1 (b-small), the first of the two 2-GPU nodes.
    scores = np.array([100.0, 100.0, 100.0, 75.0])
    feasible = np.ones(4, dtype=bool)
    assert select(scores, feasible) == 0
    assert select(scores, feasible, np.array([-8.0, -2.0, -2.0, -4.0])) == 1
    # an infeasible row never wins a tie: b-small filtered → c-small
    feasible[1] = False
    assert select(scores, feasible, np.array([-8.0, -2.0, -2.0, -4.0])) == 2
    assert select(scores, np.zeros(4, dtype=bool), np.zeros(4)) is None


def test_reserve_binpack_sharing_counts_share() -> None:
    # node-1 free share 1.0 GPU, node-3 4.0. A 0.5-GPU pod: node-1 → int((1 − (1 − 0.5)/8)·100)
    # = int(93.75) = 93, node-3 → int((1 − (4 − 0.5)/8)·100) = int(56.25) = 56, node-2 (free) → 0.
    scores = {
        v.node: v.score
        for v in explain(Pod("s", num_gpu=1, gpu_milli=500), worked_example(), ReserveBinpack())
    }
    assert scores == {"node-1": 93, "node-2": 0, "node-3": 56}


def test_reserve_binpack_small_and_cpu_only_pods_on_a_half_shared_gpu() -> None:
    cluster = Cluster.build(
        [Node("n", 8000, 8000, 1, "T4")], [Pod("a", num_gpu=1, gpu_milli=200, node="n")]
    )
    pol = make_policy("reserve-binpack")
    # R = 0.5 < T = 1 → small job: F = 0.8 → (1 − (0.8 − 0.5)/1)·100 = 70 exactly (integer
    # arithmetic: 100·(1000 − 300) // 1000 = 70; floats would give 69.999… → 69)
    assert schedule(Pod("s", num_gpu=1, gpu_milli=500), cluster, pol).score == 70  # type: ignore[union-attr]
    # CPU-only pod on a GPU node: R = 0 < T, F = 0.8 → (1 − 0.8/1)·100 = 20
    assert schedule(Pod("c"), cluster, pol).score == pytest.approx(20.0)  # type: ignore[union-attr]


def test_reserve_binpack_whole_node_branch() -> None:
    # R ≥ T: F = T → 100, otherwise 20. The filters never let R whole GPUs onto a node with
    # F < R, so the 20 is read from the score function itself (as the extender and `explain`
    # would if a filter were relaxed): node-1 of the worked example, T = 8, F = 1, R = 8 → 20;
    # node-2, F = T = 8 → 100.
    cluster = worked_example()
    scores = make_policy("reserve-binpack").score(
        Pod("big", num_gpu=8), cluster.arrays, cluster.arrays.gpu_total > 0
    )
    a = cluster.arrays.index
    assert (scores[a["node-1"]], scores[a["node-2"]]) == (20.0, 100.0)


def nvlink_node(busy: tuple[int, ...]) -> Cluster:
    node = Node("nv", 64000, 512000, 8, "H100", nvlink_domains=((0, 1, 2, 3), (4, 5, 6, 7)))
    pods = [Pod(f"b{i}", num_gpu=1, node="nv", gpu_indices=(i,)) for i in busy]
    return Cluster.build([node], pods)


@pytest.mark.parametrize(
    ("busy", "gpus", "expected"),
    [
        # free {2,3,4,5}: 4 free GPUs, but no domain holds 4 → filtered by topology
        ((0, 1, 6, 7), 4, None),
        # free {4,5,6,7}: domain 1 is whole → placed there
        ((0, 1, 2, 3), 4, (4, 5, 6, 7)),
        # free {1,2,3,4,5,6,7}: a 2-GPU pod takes the fullest domain that fits: domain 0 (3 free)
        ((0,), 2, (1, 2)),
        # 8-GPU pod needs ⌈8/4⌉ = 2 entirely free domains
        ((), 8, (0, 1, 2, 3, 4, 5, 6, 7)),
        # 6 free GPUs but only one whole domain → an 8-GPU pod... and a 5-GPU pod needs 2 domains
        ((0, 1), 5, None),
    ],
)
def test_nvlink_topology(
    busy: tuple[int, ...], gpus: int, expected: tuple[int, ...] | None
) -> None:
    result = schedule(Pod("t", num_gpu=gpus), nvlink_node(busy), ReserveBinpack())
    if expected is None:
        assert isinstance(result, Unschedulable)
        assert result.reasons == {R_TOPOLOGY: 1}
        assert "nvlink" in result.summary
    else:
        assert isinstance(result, Placement)
        assert result.gpus == expected


def test_filters_name_each_reason() -> None:
    nodes = [
        Node("cpu-poor", 100, 1000, 8, "A100"),
        Node("t4", 64000, 1000, 8, "T4"),
        Node("tainted", 64000, 1000, 8, "A100", taints=(Taint("dedicated", "NoSchedule", "x"),)),
    ]
    pod = Pod("p", num_gpu=1, cpu_milli=1000, gpu_models=frozenset({"A100"}))
    verdicts = {v.node: v.reasons for v in explain(pod, Cluster.build(nodes), ReserveBinpack())}
    assert verdicts == {"cpu-poor": (R_CPU,), "t4": (R_MODEL,), "tainted": (R_TAINT,)}
    tolerant = Pod(
        "q",
        num_gpu=1,
        gpu_models=frozenset({"A100"}),
        tolerations=(Toleration("dedicated", "Exists"),),
    )
    assert schedule(tolerant, Cluster.build(nodes), ReserveBinpack()).node == "cpu-poor"  # type: ignore[union-attr]


def test_exclude_keeps_a_node_out_of_reach() -> None:
    cluster = worked_example()
    exclude = cluster.arrays.gpu_total < 0  # all False
    exclude[cluster.arrays.index["node-1"]] = True
    placement = schedule(Pod("x", num_gpu=1), cluster, ReserveBinpack(), exclude=exclude)
    assert isinstance(placement, Placement) and placement.node == "node-3"


def small_cluster() -> Cluster:
    """Three 4-GPU nodes: a holds a 0.5-GPU pod on GPU 0, b holds 2 whole GPUs, c is idle."""
    nodes = [Node(n, 32000, 100000, 4, "V100") for n in "abc"]
    pods = [
        Pod("share", num_gpu=1, gpu_milli=500, cpu_milli=4000, node="a"),
        Pod("two", num_gpu=2, cpu_milli=8000, node="b"),
    ]
    return Cluster.build(nodes, pods)


@pytest.mark.parametrize(
    ("policy", "pod", "node", "gpus"),
    [
        # least-allocated: mean free fraction after placement (cpu, mem, gpu).
        # 1 GPU, 4 CPU: a: (24/32 + 1 + 2.5/4)/3 = 0.79; b: (20/32 + 1 + 1/4)/3 = 0.625;
        # c: (28/32 + 1 + 3/4)/3 = 0.875 → c.
        ("least-allocated", Pod("x", num_gpu=1, cpu_milli=4000), "c", (0,)),
        # most-allocated is its mirror → b (fullest).
        ("most-allocated", Pod("x", num_gpu=1, cpu_milli=4000), "b", (2,)),
        # best-fit (paper: fixed specs 128 CPUs, 8 GPUs): leftover 0.5·(cpu−4)/128 + 0.5·(gpu−1)/8
        # a: 0.5·24/128 + 0.5·2.5/8 = 0.25 → raw 75; b: 0.5·20/128 + 0.5·1/8 = 0.1406 → 85;
        # c: 0.5·28/128 + 0.5·3/8 = 0.2969 → 70; min–max: b 100, a ⌊5·100/15⌋ = 33, c 0 → b.
        ("best-fit", Pod("x", num_gpu=1, cpu_milli=4000), "b", (2,)),
        # dot-product (paper: smallest demand·free wins, fixed specs): demand (4/128, 1/8);
        # a: 28/128·4/128 + 3.5/8·1/8 = 0.0615 → ⌊100·(1 − 0.0308)⌋ = 96; b: 24/128·4/128 +
        # 2/8·1/8 = 0.0371 → 98; c: 32/128·4/128 + 4/8·1/8 = 0.0703 → 96 → b.
        ("dot-product", Pod("x", num_gpu=1, cpu_milli=4000), "b", (2,)),
        # gpu-packing, 0.3-GPU pod: a takes its shared GPU (500 free): max(100 − ⌊50%⌋/10, 50) = 95;
        # b takes a whole GPU: max(50 − 1, 33) = 49; c is idle: max(33 − 4, 4) = 29 → a, GPU 0.
        ("gpu-packing", Pod("x", num_gpu=1, gpu_milli=300), "a", (0,)),
        # gpu-packing, whole GPU: a and b both take one entirely free GPU → 49; c idle → 29;
        # the tie goes to the first name, a, whose first free whole GPU is 1.
        ("gpu-packing", Pod("x", num_gpu=1), "a", (1,)),
        # gpu-clustering, 2-GPU pod: b hosts only 2-GPU pods → 75 + ⌊25·(8 − 2)/8⌋ = 93;
        # c (no GPU pod) → 25 + ⌊25·4/8⌋ = 37; a (share pods only) → 0 + ⌊25·4.5/8⌋ = 14 → b.
        ("gpu-clustering", Pod("x", num_gpu=2), "b", (2, 3)),
        # gpu-clustering, sharing pod: a hosts only sharing pods → 75 + 14 = 89 → a, best-fit GPU 0.
        ("gpu-clustering", Pod("x", num_gpu=1, gpu_milli=300), "a", (0,)),
        # reserve-binpack: 1 GPU → b: (1 − (2−1)/4)·100 = 75 beats a: (1 − (3.5−1)/4)·100 = 37.5.
        ("reserve-binpack", Pod("x", num_gpu=1), "b", (2,)),
    ],
)
def test_policy_choices(policy: str, pod: Pod, node: str, gpus: tuple[int, ...]) -> None:
    placement = schedule(pod, small_cluster(), make_policy(policy))
    assert isinstance(placement, Placement)
    assert (placement.node, placement.gpus) == (node, gpus)


def test_fgd_prefers_the_gpu_that_leaves_usable_share() -> None:
    # Mix: only 0.5-GPU pods. Free shares: a [500, 1000, 1000, 1000], b [0, 0, 1000, 1000],
    # c [1000]*4; no node is fragmented now (every GPU is 0 or ≥ 500).
    # A 0.3 pod on a's GPU 0 leaves 200 < 500 → Δfrag = +200, score ⌊100·sigmoid(−0.2)⌋ = 45;
    # on any whole GPU it leaves 700 ≥ 500 → Δ = 0, score ⌊100·sigmoid(0)⌋ = 50. Every node ties
    # at 50 (a, b, c) and the name breaks the tie: a, on its first GPU scoring 50: GPU 1.
    mix = WorkloadMix((Shape(0, 1, 500),), (1.0,))
    pol = make_policy("fgd", mix=mix)
    placement = schedule(Pod("x", num_gpu=1, gpu_milli=300), small_cluster(), pol)
    assert isinstance(placement, Placement)
    assert (placement.node, placement.gpus) == ("a", (1,))
    # A 0.5 pod on GPU 0 leaves 0 (nothing to fragment) and on a whole GPU leaves 500 (usable):
    # Δ = 0 both ways (score 50); the tie goes to the lowest GPU index → GPU 0.
    placement = schedule(Pod("y", num_gpu=1, gpu_milli=500), small_cluster(), pol)
    assert (placement.node, placement.gpus) == ("a", (0,))  # type: ignore[union-attr]


def test_random_is_seeded() -> None:
    def picks(seed: int) -> list[tuple[str, tuple[int, ...]]]:
        policy = make_policy("random", seed=seed)
        placed = [schedule(Pod("x", num_gpu=1), small_cluster(), policy) for _ in range(20)]
        return [(p.node, p.gpus) for p in placed if isinstance(p, Placement)]

    first = picks(7)
    assert len(first) == 20 and len(set(first)) > 1  # it does pick at random
    assert picks(7) == first  # the same seed, the same picks
    assert picks(8) != first


def test_unknown_policy() -> None:
    with pytest.raises(UnknownPolicy, match="known: reserve-binpack"):
        make_policy("nope")


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_places_and_explains(policy: str) -> None:
    cluster = worked_example()
    placement = schedule(Pod("x", num_gpu=8), cluster, make_policy(policy))
    # Only node-2 can take 8 GPUs, whatever the policy.
    assert isinstance(placement, Placement) and placement.node == "node-2"
