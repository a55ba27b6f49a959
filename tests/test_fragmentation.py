"""Fragmentation metrics (docs/concepts.md) on hand-built clusters."""

from __future__ import annotations

import pytest

from defrag.model import Cluster, Node, Pod
from defrag.model.workload import WorkloadMix
from defrag.scoring.fragmentation import fragmentation_report, placeable_per_node


def scattered(free_per_node: list[int]) -> Cluster:
    """8-GPU nodes, each with the given number of GPUs free (the rest held by one pod)."""
    nodes, pods = [], []
    for i, free in enumerate(free_per_node):
        nodes.append(Node(f"n{i:02d}", 64000, 512000, 8, "A100"))
        if free < 8:
            pods.append(Pod(f"busy{i}", num_gpu=8 - free, node=f"n{i:02d}", phase="Running"))
    return Cluster.build(nodes, pods)


def test_seed_scenario_twenty_free_gpus_strand_eight_gpu_jobs() -> None:
    # 20 free GPUs, one or two per node: 6 nodes × 2 + 8 nodes × 1 = 20.
    rep = fragmentation_report(scattered([2] * 6 + [1] * 8), WorkloadMix.default())
    assert rep.free_gpus == 20
    assert rep.largest_placeable_job == 2 < 8
    assert rep.whole_free_nodes == 0
    # k=8: no node can take one → all 20 stranded. k=2: 6 jobs use 12, the 8 singles are stranded.
    assert rep.placeable == {1: 20, 2: 6, 4: 0, 8: 0}
    assert rep.stranded == {1: 0, 2: 8, 4: 20, 8: 20}
    assert rep.to_dict()["stranded"]["8"] == 20


def test_whole_free_node_counts() -> None:
    rep = fragmentation_report(scattered([8, 3, 0]), WorkloadMix.default())
    # n00 entirely free: one 8-GPU job; n01 3 free: one 2-GPU job and a stranded GPU.
    assert rep.whole_free_nodes == 1
    assert rep.largest_placeable_job == 8
    assert rep.placeable[8] == 1 and rep.stranded[8] == 3
    assert rep.placeable[2] == 4 + 1 and rep.stranded[2] == 1
    assert [n.free for n in rep.nodes] == [8, 3, 0]


@pytest.mark.parametrize(
    ("busy", "k", "jobs"),
    [
        # domains {0-3}, {4-7}: free {2,3,4,5,6,7} → k=4: domain 1 only → 1; k=2: 1 + 2 = 3
        ((0, 1), 4, 1),
        ((0, 1), 2, 3),
        # k=8 needs both domains whole → 0 with any GPU busy, 1 when idle
        ((0,), 8, 0),
        ((), 8, 1),
        # free {1,2,3,5,6,7}: k=4 fits in no domain (3 + 3) → 0
        ((0, 4), 4, 0),
    ],
)
def test_placeable_respects_nvlink(busy: tuple[int, ...], k: int, jobs: int) -> None:
    node = Node("nv", 64000, 512000, 8, "H100", nvlink_domains=((0, 1, 2, 3), (4, 5, 6, 7)))
    cluster = Cluster.build(
        [node], [Pod(f"b{i}", num_gpu=1, node="nv", gpu_indices=(i,)) for i in busy]
    )
    assert placeable_per_node(cluster.arrays, k)[0] == jobs


def test_fgd_measure_of_idle() -> None:
    # Default mix (whole 1/2/4/8-GPU jobs, 1/4 each). Node with 1 free GPU: 1-GPU jobs fit,
    # 2/4/8 do not → frag = 0.75 × 1 GPU. Free share 1 → 75% of idle.
    rep = fragmentation_report(scattered([1]), WorkloadMix.default())
    assert rep.fgd_fragmented_gpus == pytest.approx(0.75)
    assert rep.fgd_frag_pct_of_idle == pytest.approx(75.0)
