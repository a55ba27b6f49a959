"""The simulated cluster: the built-in fragmented cluster, evictions, the scheduler, the clock."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from defrag.adapters.simcluster import SIM_START, SimClock, SimCluster, fragmented_cluster
from defrag.model.resources import DRAIN_TAINT_KEY
from defrag.model.workload import WorkloadMix
from defrag.scoring.fragmentation import fragmentation_report


def make() -> SimCluster:
    return SimCluster(fragmented_cluster(), SimClock(speedup=0), schedule_delay_s=20)


def test_builtin_cluster_is_the_seed_scenario() -> None:
    cluster = make().snapshot()
    report = fragmentation_report(cluster, WorkloadMix.observed(cluster.pods.values()))
    # 12 × 8 GPUs; 8 nodes with 2 free and 4 with 1: 8×2 + 4×1 = 20 free, largest job 2.
    assert (report.total_gpus, report.free_gpus, report.largest_placeable_job) == (96, 20, 2)
    assert sorted(n.free for n in report.nodes) == [1] * 4 + [2] * 8
    assert cluster.pods["research/train-llm-0"].node is None  # the starving 8-GPU job


def test_eviction_replaces_the_pod_through_the_scheduler_off_the_tainted_node() -> None:
    sim = make()
    sim.taint_node("gpu-00", DRAIN_TAINT_KEY, "plan-1", "NoSchedule")
    assert sim.evict("inference", "embed-001").outcome == "evicted"
    pending = [p for p in sim.snapshot().pending_pods() if p.uid.startswith("sim-")]
    assert [p.name for p in pending] == ["embed-1-r0001"]  # a ReplicaSet's new name
    sim.clock.sleep(19)
    assert sim.snapshot().pods["inference/embed-1-r0001"].node is None  # not yet: 20 s delay
    sim.clock.sleep(1)
    placed = sim.snapshot().pods["inference/embed-1-r0001"]
    assert placed.node not in (None, "gpu-00") and placed.phase == "Running"


def test_pdb_blocks_with_429_then_counts_down_and_comes_back() -> None:
    sim = make()
    blocked = sim.evict("inference", "chat-003")  # PDB ledger: 0 disruptions allowed
    assert blocked.outcome == "blocked" and "disruption budget" in blocked.reason
    assert "inference/chat-003" in sim.snapshot().pods
    # A PDB with one disruption left: spent by one eviction, back once the replacement runs.
    from dataclasses import replace

    from defrag.model.cluster import Cluster

    state = sim.snapshot()
    sim._state = Cluster.build(  # test set-up: allow one disruption
        state.nodes,
        state.pods.values(),
        [replace(b, disruptions_allowed=1) for b in state.pdbs],
        state.priority_classes,
    )
    assert sim.evict("inference", "chat-003").outcome == "evicted"
    assert sim.snapshot().pdbs[0].disruptions_allowed == 0
    sim.clock.sleep(20)
    assert sim.snapshot().pdbs[0].disruptions_allowed == 1


@pytest.mark.parametrize(
    ("pod", "outcome", "replaced"),
    [
        ("chat-015", "evicted", False),  # bare pod: gone for good, nothing recreates it
        ("no-such-pod", "gone", False),
        ("chat-004", "evicted", True),
    ],
)
def test_only_controller_owned_pods_come_back(pod: str, outcome: str, replaced: bool) -> None:
    sim = make()
    assert sim.evict("inference", pod).outcome == outcome
    assert any(p.uid.startswith("sim-") for p in sim.snapshot().pods.values()) is replaced


def test_pending_pods_are_placed_once_room_appears() -> None:
    sim = make()
    for pod in [p for p in sim.snapshot().pods_on("gpu-06") if p.namespace == "inference"]:
        sim.evict(pod.namespace, pod.name)
    sim.clock.sleep(20)
    cluster = sim.snapshot()
    # gpu-06 emptied, its pods went elsewhere (2 + 2 + 1 + 1 GPUs into 19 free elsewhere), and
    # the 8-GPU training job took the whole node.
    assert cluster.pods["research/train-llm-0"].node == "gpu-06"


def test_node_annotations_merge_and_none_deletes() -> None:
    sim = make()
    sim.annotate_node("gpu-01", {"a": "1", "b": "2"})
    sim.annotate_node("gpu-01", {"a": None, "c": "3"})
    assert dict(sim.snapshot().node("gpu-01").annotations) == {"b": "2", "c": "3"}
    sim.untaint_node("gpu-01", DRAIN_TAINT_KEY)  # removing an absent taint is fine
    sim.event("Node", "", "gpu-01", "Test", "hello")
    assert sim.events[-1].reason == "Test" and sim.events[-1].at == SIM_START


def test_clock_runs_faster_and_sleep_skips_ahead() -> None:
    clock = SimClock(speedup=600)
    t0 = clock.now()
    time.sleep(0.05)  # 0.05 s real × 600 = 30 s simulated (at least)
    assert clock.now() - t0 >= timedelta(seconds=30)
    frozen = SimClock(speedup=0)
    frozen.sleep(90)
    frozen.advance_to(SIM_START + timedelta(seconds=60))  # never backwards
    assert frozen.now() == SIM_START + timedelta(seconds=90)
