"""The peers' rules on hand-worked GPU clusters: descheduler HighNodeUtilization /
LowNodeUtilization (kubernetes-sigs/descheduler ``pkg/framework/plugins/nodeutilization/``) and
KAI-Scheduler's consolidation (``pkg/scheduler/actions/consolidation/``) with its binpack score
(``pkg/scheduler/plugins/nodeplacement/pack.go``), as the timeline runs them. Upstream's own test
tables are in ``tests/conformance/test_{descheduler,kai}_conformance.py``."""

from __future__ import annotations

import numpy as np
import pytest

from defrag.model.resources import Node, OwnerRef, Pod
from defrag.model.workload import WorkloadMix
from defrag.scoring.policies import make_policy
from defrag.sim.defragmenters import DEFRAGMENTERS, make_defragmenter
from defrag.sim.descheduler import (
    DefaultEvictor,
    HighNodeUtilization,
    LowNodeUtilization,
    eviction_order,
)
from defrag.sim.hooks import REQUEUE
from defrag.sim.kai import KaiBinpack, KaiConsolidation, kai_priority, sim_priority
from defrag.sim.state import SimState
from defrag.sim.trace import QOS_PRIORITY


def cluster(names: str, gpus: int = 4, policy: str | None = None) -> SimState:
    nodes = [
        Node(n, cpu_milli=32_000, memory_mib=65_536, num_gpu=gpus, gpu_model="G2") for n in names
    ]
    mix = WorkloadMix.default()
    pol = KaiBinpack() if policy is None else make_policy(policy, mix=mix)
    return SimState.new(nodes, pol, "test", mix)


def put(
    state: SimState, name: str, row: int, gpus: int, qos: str = "BE", *, mem: int = 1024,
    since: float = 0.0, priority: int | None = None, owner: str | None = "ReplicaSet",
) -> Pod:  # fmt: skip
    prio = QOS_PRIORITY[qos] if priority is None else priority
    pod = Pod(
        name, num_gpu=gpus, cpu_milli=1000, memory_mib=mem, qos=qos, priority=prio,
        owner=OwnerRef(owner, name) if owner else None,
    )  # fmt: skip
    free = [
        g for g in range(int(state.arrays.gpu_total[row])) if state.arrays.gpu_free[row, g] == 1000
    ]
    state.place(pod, row, tuple(free[:gpus]), since)
    return pod


# --- descheduler ---------------------------------------------------------------------------------


def test_hnu_evicts_lowest_priority_first_from_the_least_used_node_and_stops_on_headroom() -> None:
    # 4-GPU nodes, threshold nvidia.com/gpu 50%: a 25% (1 GPU) and b 50% (2 GPUs) are
    # underutilized (≤ 50), c 75% is the destination. Order by usage sum (memory in bytes
    # dominates): a (1 GiB + 1 GiB) before b (4 GiB). On a: "a-be" (priority 0) goes first;
    # c's pooled GPU headroom is 4 − 3 = 1, minus a-be's 1 GPU = 0: eviction stops there,
    # before "a-ls" (priority 3) and before any pod of b.
    state = cluster("abc")
    put(state, "a-be", 0, 1, "BE")
    put(state, "a-ls", 0, 0, "LS")
    put(state, "b-pair", 1, 2, "Burstable", mem=4096)
    put(state, "c-three", 2, 3, "Burstable")
    hnu = HighNodeUtilization({"gpu": 50.0})
    low, dest, _ = hnu.classify(state)
    assert (low, dest) == ([0, 1], [2])
    moves = hnu.on_tick(state, 0.0)
    assert [(m.pod_id, m.target_row) for m in moves] == [("default/a-be", REQUEUE)]


@pytest.mark.parametrize(
    ("used", "number_of_nodes", "evicts"),
    [
        ((1, 1), 0, False),  # every node underutilized: "All nodes are underutilized"
        ((3, 3), 0, False),  # none underutilized
        ((1, 3), 1, False),  # underutilized nodes (1) ≤ numberOfNodes (1)
        ((1, 3), 0, True),
    ],
)
def test_hnu_does_nothing_when_its_conditions_say_so(
    used: tuple[int, int], number_of_nodes: int, evicts: bool
) -> None:
    state = cluster("ab")
    for row, k in enumerate(used):
        put(state, f"p{row}", row, k)
    moves = HighNodeUtilization({"gpu": 50.0}, number_of_nodes=number_of_nodes).on_tick(state, 0.0)
    assert bool(moves) is evicts


@pytest.mark.parametrize(
    ("pod", "evictor", "ok"),
    [
        (Pod("owned", owner=OwnerRef("ReplicaSet", "r")), DefaultEvictor(), True),
        # defaultevictor.go 238-243: no ownerRefs, protected (EvictFailedBarePods off)
        (Pod("bare"), DefaultEvictor(), False),
        (Pod("bare-failed", phase="Failed"), DefaultEvictor(evict_failed_bare_pods=True), True),
        (Pod("bare-sim"), DefaultEvictor(bare_pods_owned=True), True),  # the timeline's reading
        (Pod("ds", owner=OwnerRef("DaemonSet", "agent")), DefaultEvictor(), False),
        (Pod("static", owner=OwnerRef("Node", "n1")), DefaultEvictor(), False),
        (Pod("mirror", owner=OwnerRef("ReplicaSet", "r"),
             annotations={"kubernetes.io/config.mirror": "x"}), DefaultEvictor(), False),
        (Pod("crit", owner=OwnerRef("ReplicaSet", "r"), priority=2_000_000_000),
         DefaultEvictor(), False),
        (Pod("crit2", owner=OwnerRef("ReplicaSet", "r"), priority_class="system-node-critical"),
         DefaultEvictor(), False),
        # defaultevictor.go 470-472: the evict annotation wins over every protection
        (Pod("forced", annotations={"descheduler.alpha.kubernetes.io/evict": ""}),
         DefaultEvictor(), True),
    ],
)  # fmt: skip
def test_default_evictor_filter(pod: Pod, evictor: DefaultEvictor, ok: bool) -> None:
    status = evictor.filter(pod)
    assert status.ok is ok and (ok or status.reasons)


def test_eviction_order_is_priority_then_qos_tier() -> None:
    pods = [
        Pod("g", priority=1, qos="Guaranteed"),
        Pod("be", priority=1, qos="BE"),
        Pod("hi", priority=5, qos="BE"),
        Pod("lo", priority=0, qos="LS"),
    ]
    assert [p.name for p in eviction_order(pods)] == ["lo", "be", "g", "hi"]


def test_lnu_evicts_from_nodes_above_target_until_they_are_not() -> None:
    # thresholds 20 / targets 50 (nvidia.com/gpu): a 0% is underutilized, b 100% above target.
    # b's four 1-GPU pods go lowest priority first: after p0, b is at 75% (still above 50);
    # after p1 it is at 50%: not above the target, eviction stops.
    state = cluster("ab")
    for k, qos in enumerate(("BE", "Burstable", "Guaranteed", "LS")):
        put(state, f"p{k}", 1, 1, qos)
    moves = LowNodeUtilization({"gpu": 20.0}, {"gpu": 50.0}).on_tick(state, 0.0)
    assert [m.pod_id for m in moves] == ["default/p0", "default/p1"]


# --- KAI -----------------------------------------------------------------------------------------


def test_kai_binpack_scores_the_node_with_fewest_free_gpus_highest() -> None:
    # free GPUs 1, 3, 4 → 100 × (1 − (free − 1) / (4 − 1)) = 100, 33.3, 0
    state = cluster("abc")
    put(state, "x", 0, 3)
    put(state, "y", 1, 1)
    scores = KaiBinpack().score(Pod("p", num_gpu=1), state.arrays, np.ones(3, dtype=bool))
    assert scores == pytest.approx([100.0, 100.0 / 3, 0.0])


def kai_cluster(n1_free: int) -> tuple[SimState, Pod]:
    """n0: "old" (since 0) and "young" (since 5), 1-GPU batch pods (preemptible); n1: serving
    pods (not preemptible) leaving ``n1_free`` GPUs. A 4-GPU training pod waits."""
    state = cluster("ab")
    put(state, "old", 0, 1, "BE", since=0.0, owner=None)
    put(state, "young", 0, 1, "BE", since=5.0, owner=None)
    for k in range(4 - n1_free):
        put(state, f"serve{k}", 1, 1, "LS", owner=None)
    return state, Pod("train", num_gpu=4, cpu_milli=1000, qos="Burstable", priority=1)


def test_kai_accepts_the_first_victim_set_whose_victims_all_fit_again() -> None:
    # Victims in reverse job order (all `train` 50, created together: by name, last first):
    # young, then old. Scenario 1 {young}: n0 has 3 free — the 4-GPU job fits nowhere.
    # Scenario 2 {young, old} (both on n0): allocated in job order — old → n1 (binpack: 2 free
    # beats 4), train → n0, young → n1: accepted, both held for train.
    state, train = kai_cluster(n1_free=2)
    moves = KaiConsolidation(priority_of=sim_priority).session(state, [train])
    assert [(m.pod_id, m.source_row, m.target_row, m.for_pod) for m in moves] == [
        ("default/young", 0, 1, train.key),
        ("default/old", 0, 1, train.key),
    ]
    state.apply_moves(moves)  # valid moves
    assert state.arrays.free_whole_count()[0] == 4


def test_kai_rejects_a_scenario_when_a_victim_cannot_be_placed_again() -> None:
    # n1 has 1 free GPU: 2 + 1 = 3 idle GPUs < 4: not enough allocatable GPUs, no scenario.
    state, train = kai_cluster(n1_free=1)
    assert KaiConsolidation(priority_of=sim_priority).session(state, [train]) == []
    # n1 full, node c with 2 free GPUs but no free CPU: 2 + 2 = 4 idle GPUs, so scenarios are
    # tried; {young, old} empties n0 for the job, but neither victim fits anywhere again
    # (allPodsReallocated fails): rejected, nothing moves.
    state, train = kai_cluster(n1_free=0)
    state = _with_cpu_bound_node(state)
    assert int(state.arrays.free_whole_count().sum()) == 4
    assert KaiConsolidation(priority_of=sim_priority).session(state, [train]) == []


def _with_cpu_bound_node(state: SimState) -> SimState:
    """``state`` plus node c: 2 GPUs held by serving pods, 2 free, every CPU requested."""
    c = Node("c", cpu_milli=32_000, memory_mib=65_536, num_gpu=4, gpu_model="G2")
    fresh = SimState.new([*state.nodes, c], state.policy, "test", state.mix)
    for p in state.placed.values():
        fresh.place(p.pod, p.row, p.gpus, p.since)
    put(fresh, "c-serve0", 2, 1, "LS", owner=None)
    put(fresh, "c-serve1", 2, 1, "LS", owner=None)
    fresh.place(Pod("c-cpu", cpu_milli=30_000, qos="LS", priority=3), 2, ())
    return fresh


def test_kai_reads_trace_pods_as_the_pod_grouper_would() -> None:
    # deployment_grouper.go 48: a Deployment's pods are `inference` (125, not preemptible);
    # default_grouper.go 66: the rest `train` (50). Trace pods have no owner: serving pods
    # (LS, at most one GPU) read as Deployment pods.
    assert sim_priority(Pod("t", num_gpu=2, qos="LS")) == 50  # training
    assert sim_priority(Pod("b", num_gpu=1, qos="BE")) == 50  # batch
    assert sim_priority(Pod("s", num_gpu=1, qos="LS")) == 125  # serving
    assert kai_priority(Pod("s", num_gpu=1, qos="LS")) == 50  # no owner, no class: train
    assert sim_priority(Pod("c", num_gpu=1, qos="LS", priority_class="build", priority=7)) == 100
    state, _ = kai_cluster(n1_free=2)
    serving = Pod("serve-big", num_gpu=1, gpu_milli=1000, cpu_milli=40_000, qos="LS", priority=3)
    assert KaiConsolidation(priority_of=sim_priority).session(state, [serving]) == []


def test_kai_counts_the_free_part_of_shared_gpus_as_idle() -> None:
    # node_info.go 592-609: idle = whole idle GPUs + the free part of shared GPUs. Node a: two
    # 0.5-GPU batch pods on GPUs 0 and 1 of a 2-GPU node → 0 whole idle GPUs, 0.5 + 0.5 = 1 idle
    # GPU: a 1-GPU job is consolidated — one share joins the other, the job takes the GPU freed.
    nodes = [Node("a", cpu_milli=32_000, memory_mib=65_536, num_gpu=2, gpu_model="G2")]
    state = SimState.new(nodes, KaiBinpack(), "test", WorkloadMix.default())
    for k in range(2):
        state.place(Pod(f"half{k}", num_gpu=1, gpu_milli=500, cpu_milli=100, qos="BE"), 0, (k,))
    moves = KaiConsolidation(priority_of=sim_priority).session(
        state, [Pod("one", num_gpu=1, qos="BE")]
    )
    assert [(m.pod_id, m.source_row, m.target_row, m.gpus) for m in moves] == [
        ("default/half1", 0, 0, (0,))
    ]
    state.apply_moves(moves)
    assert list(state.arrays.gpu_free[0]) == [0, 1000]


def test_every_defragmenter_has_its_scheduler() -> None:
    expect = {
        "none": "least-allocated",
        "defrag": "least-allocated",
        "defrag-blind": "reserve-binpack",
        "defrag-extender": "reserve-binpack",
        "defrag-proposed": "least-allocated",
        "descheduler-hnu": "most-allocated",
        "descheduler-hnu-readme": "most-allocated",
        "descheduler-hnu-gpu50": "most-allocated",
        "descheduler-hnu-lenient": "most-allocated",
        "descheduler-lnu": "least-allocated",
        "kai-consolidation": "kai-binpack",
    }
    for name in DEFRAGMENTERS:
        hook, sched = make_defragmenter(name, "least-allocated", "timeline")
        assert (sched if isinstance(sched, str) else sched.name) == expect[name]
        assert (hook is None) is (name == "none")
    with pytest.raises(ValueError, match="timeline protocol only"):
        make_defragmenter("descheduler-hnu", "fgd", "fill")
    with pytest.raises(ValueError, match="unknown defragmenter"):
        make_defragmenter("bogus", "fgd", "timeline")
