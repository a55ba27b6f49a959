"""SimState: placements, all-or-nothing moves, the Cluster view; the synthetic workload."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from defrag.model.resources import Node, Pod
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.scoring.fragmentation import fgd_node_fragmentation
from defrag.scoring.framework import Placement
from defrag.scoring.policies import make_policy
from defrag.scoring.scheduler import schedule
from defrag.sim.fill_hook import FillHook
from defrag.sim.hooks import Move, NoDefrag
from defrag.sim.state import InvalidMove, SimState
from defrag.sim.synthetic import WorkloadParams, synthetic_nodes, synthetic_pods
from defrag.sim.tracker import FragTracker

MIX = WorkloadMix.default()


def make_state() -> SimState:
    nodes = [
        Node("a", 16_000, 1024, num_gpu=4, gpu_model="T4"),
        Node("b", 16_000, 1024, num_gpu=4, gpu_model="T4"),
    ]
    mix = WorkloadMix.default()
    state = SimState.new(nodes, make_policy("best-fit"), "best-fit", mix)
    state.place(Pod("p", num_gpu=2, cpu_milli=1000), 0, (0, 1))
    state.place(Pod("q", num_gpu=1, gpu_milli=300, cpu_milli=500), 0, (2,))
    return state


def test_place_and_remove_keep_arrays_and_rows_consistent() -> None:
    s = make_state()
    assert list(s.arrays.gpu_free[0]) == [0, 0, 700, 1000]
    assert s.arrays.cpu_free[0] == 16_000 - 1500
    assert sorted(s.rows[0]) == ["default/p", "default/q"]
    # 2 GPUs + 0.3 GPU allocated = 2300 milli.
    assert s.allocated_gpu_milli() == 2300
    s.remove("default/q")
    assert list(s.arrays.gpu_free[0]) == [0, 0, 1000, 1000]
    assert sorted(s.rows[0]) == ["default/p"]


def test_moves_apply_in_order_and_count_as_migrations() -> None:
    s = make_state()
    applied = s.apply_moves([Move("default/p", 0, 1, (2, 3)), Move("default/q", 0, 1, (0,))])
    assert applied == 2 and s.migrations == 2
    assert list(s.arrays.gpu_free[0]) == [1000] * 4
    assert list(s.arrays.gpu_free[1]) == [700, 1000, 0, 0]
    assert s.placed["default/p"].row == 1


def test_a_pod_moves_to_other_gpus_of_its_own_node() -> None:
    # KAI moves a victim to another GPU of the same node (by_pod_solver.go): q leaves GPU 2
    # of node a for GPU 3; GPU 2 is whole again (1000 free), GPU 3 keeps 700.
    s = make_state()
    assert s.apply_moves([Move("default/q", 0, 0, (3,))]) == 1 and s.migrations == 1
    assert list(s.arrays.gpu_free[0]) == [0, 0, 1000, 700]
    assert s.placed["default/q"].gpus == (3,) and sorted(s.rows[0]) == ["default/p", "default/q"]


@pytest.mark.parametrize(
    ("moves", "reason"),
    [
        ([Move("default/nope", 0, 1, (0,))], "no such running pod"),
        ([Move("default/p", 1, 0, (0, 1))], "runs on row 0, not 1"),
        ([Move("default/p", 0, 0, (1, 0))], "row 0 is its own, on the same GPUs"),
        ([Move("default/p", 0, 2, (0, 1))], "bad target row 2"),
        ([Move("default/p", 0, 0, (2, 3))], "without enough free"),  # GPU 2 holds q's 300
        ([Move("default/p", 0, 1, (0,))], "1 GPU slot(s) given, the pod asks 2"),
        # The first move fills b's GPUs 0 and 1; the second asks GPU 1 again for q.
        ([Move("default/p", 0, 1, (0, 1)), Move("default/q", 0, 1, (1,))], "without enough free"),
    ],
)
def test_an_invalid_move_rolls_back_the_whole_batch(moves: list[Move], reason: str) -> None:
    s = make_state()
    before = s.arrays.gpu_free.copy(), s.arrays.cpu_free.copy()
    with pytest.raises(InvalidMove, match=reason.replace("(", r"\(").replace(")", r"\)")):
        s.apply_moves(moves)
    assert (s.arrays.gpu_free == before[0]).all() and (s.arrays.cpu_free == before[1]).all()
    assert s.migrations == 0 and s.placed["default/p"].row == 0


def test_to_cluster_binds_running_pods_and_keeps_pending_ones() -> None:
    s = make_state()
    s.pending["default/w"] = Pod("w", num_gpu=4)
    cluster = s.to_cluster()
    assert cluster.pods["default/p"].node == "a"
    assert cluster.pods["default/p"].gpu_indices == (0, 1)
    assert cluster.pods["default/w"].node is None
    assert (cluster.arrays.gpu_free == s.arrays.gpu_free).all()


def test_no_defrag_hook_and_planner_hook_loading() -> None:
    s = make_state()
    assert NoDefrag().on_window(s, 0.0) == ()
    hook = FillHook()
    assert hook.on_window(s, 0.0) == ()
    # node b holds one 1-GPU pod: moving it to a's whole free GPU frees b for a 4-GPU pod
    s.place(Pod("r", num_gpu=1, cpu_milli=500), 1, (0,))
    assert hook.on_unschedulable(s, Pod("big", num_gpu=4), 0.0) == (
        Move("default/r", source_row=1, target_row=0, gpus=(3,)),
    )
    # more than the whole cluster has free: no move is looked for
    assert hook.on_unschedulable(s, Pod("huge", num_gpu=8), 0.0) == ()


def test_synthetic_cluster_has_the_openb_mix() -> None:
    nodes = synthetic_nodes()
    gpus = Counter(n.num_gpu for n in nodes)
    # 150 nodes, 771 GPUs at scale 1: 77 eight-GPU nodes, 64 two-GPU nodes, ….
    assert (len(nodes), sum(n.num_gpu for n in nodes)) == (150, 771)
    assert gpus[8] == 68 + 5 + 4 and gpus[2] == 48 + 16
    assert len(synthetic_nodes(0.5)) < len(nodes) < len(synthetic_nodes(2.0))
    with pytest.raises(ValueError):
        synthetic_nodes(0)


def test_synthetic_pods_follow_the_parameters() -> None:
    pods = synthetic_pods(20_000, seed=3)
    assert pods == synthetic_pods(20_000, seed=3)
    kinds = Counter(
        "cpu" if p.num_gpu == 0 else "share" if p.is_sharing else str(p.num_gpu) for p in pods
    )
    # The default kind weights (13%, 38%, 48%, …) within ±1.5 points for 20,000 draws
    # (σ of a 40% share is √(.4 × .6 / 20000) ≈ 0.35 points).
    weights = WorkloadParams().kinds
    total = sum(weights.values())
    for kind in ("cpu", "share", "1"):
        assert abs(kinds[kind] / len(pods) - weights[kind] / total) < 0.015
    assert all(p.gpu_milli < 1000 for p in pods if p.is_sharing)
    assert {p.qos for p in pods} <= {"LS", "BE", "Burstable", "Guaranteed"}
    models = [p for p in pods if p.gpu_models]
    assert 0 < len(models) / sum(1 for p in pods if p.num_gpu) < 0.04
    assert np.isclose(
        sum(p.memory_mib for p in pods[:10]), sum(p.cpu_milli * 4096 // 1000 for p in pods[:10])
    )


def test_synthetic_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown pod kind"):
        WorkloadParams(kinds={"huge": 1.0})
    with pytest.raises(ValueError, match="n must be > 0"):
        synthetic_pods(0)


def test_frag_tracker_matches_a_full_recomputation() -> None:

    nodes = synthetic_nodes(0.3)
    pods = synthetic_pods(400, seed=1)
    mix = WorkloadMix.from_pods(pods)
    state = SimState.new(nodes, make_policy("best-fit"), "best-fit", mix)
    tracker = FragTracker(state.arrays, mix)

    for pod in pods:
        result = schedule(pod, state.arrays, state.policy)
        if isinstance(result, Placement):
            state.place(pod, result.row, result.gpus)
            tracker.update([result.row])
    full = fgd_node_fragmentation(state.arrays, mix)
    assert np.allclose(tracker.node_frag, full)
    assert tracker.total == pytest.approx(float(full.sum()))


def test_kept_sums_follow_every_place_and_remove() -> None:
    # The node arrays keep each node's free share and whole free GPUs as the simulator places
    # and removes pods; after any sequence they equal the sums computed from gpu_free.
    nodes = synthetic_nodes(0.1)
    state = SimState.new(nodes, make_policy("least-allocated"), "least-allocated", MIX)
    rng = np.random.default_rng(3)
    running: list[str] = []
    for i, shape in enumerate(synthetic_pods(300, seed=4)):
        if running and rng.random() < 0.4:
            state.remove(running.pop(int(rng.integers(len(running)))))
        pod = replace(shape, name=f"p{i}")
        placed = state.schedule(pod)
        if placed is not None:
            state.place(pod, placed.row, placed.gpus)
            running.append(pod.key)
        a = state.arrays
        assert (a.free_share() == a.gpu_free.sum(axis=1)).all()
        assert (a.free_whole_count() == (a.gpu_free >= GPU_MILLI).sum(axis=1)).all()
    assert 0 < len(running) < 300
    with pytest.raises(ValueError, match="read-only"):
        state.arrays.free_share()[0] = 0
