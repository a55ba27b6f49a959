"""The scoring kernel's shortcuts agree with the long way round: the per-node counts kept by
``allocate``/``release``, the fused feasible mask, the reasons skipped on request."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from defrag.model import Cluster, Node, Pod
from defrag.model.arrays import NodeArrays
from defrag.model.units import GPU_MILLI
from defrag.scoring.filters import feasible_mask, filter_masks
from defrag.scoring.framework import FreshScores, Placement, Unschedulable
from defrag.scoring.gpu_choice import NoGpuFit, whole_gpus
from defrag.scoring.policies import POLICY_NAMES, make_policy
from defrag.scoring.policies.base import safe_ratio
from defrag.scoring.scheduler import node_scores, schedule, select, tie_order
from tests.test_scoring_properties import SETTINGS, clusters, pods


@SETTINGS
@given(clusters(), st.lists(pods("p"), max_size=12))
def test_kept_counts_follow_every_allocate_and_release(cluster: Cluster, extra: list[Pod]) -> None:
    arrays = cluster.arrays.copy()
    placed: list[tuple[int, Pod, tuple[int, ...]]] = []
    policy = make_policy("random")
    for i, pod in enumerate(extra):
        found = schedule(pod, arrays, policy)
        if isinstance(found, Placement):
            arrays.allocate(found.row, pod, found.gpus)
            placed.append((found.row, pod, found.gpus))
        if placed and i % 3 == 2:
            row, gone, gpus = placed.pop(0)
            arrays.release(row, gone, gpus)
        # Recomputed from gpu_free: whole GPUs and the summed free share of every node.
        assert arrays.free_whole_count().tolist() == (arrays.gpu_free >= GPU_MILLI).sum(1).tolist()
        assert arrays.free_share().tolist() == arrays.gpu_free.sum(1).tolist()
        # The most free share on one GPU (a sharing pod's filter reads it).
        assert arrays.share_max.tolist() == arrays.gpu_free.max(1, initial=0).tolist()
        whole = arrays.gpu_free >= GPU_MILLI
        for dom in range(arrays.domain_size.shape[1]):
            in_dom = (whole & (arrays.gpu_domain == dom)).sum(1)
            assert arrays.domain_free()[:, dom].tolist() == in_dom.tolist()


def test_kept_counts_are_read_only_and_copied() -> None:
    # Two 4-GPU nodes; a copy's allocation leaves the original's counts alone.
    arrays = Cluster.build(
        [Node("a", 8000, 10**5, 4, "A100"), Node("b", 8000, 10**5, 4, "A100")]
    ).arrays
    copy = arrays.copy()
    copy.allocate(0, Pod("x", num_gpu=2), (0, 1))
    assert copy.free_whole_count().tolist() == [2, 4]
    assert arrays.free_whole_count().tolist() == [4, 4]
    assert copy.free_share().tolist() == [2000, 4000]
    assert not arrays.free_whole_count().flags.writeable


@SETTINGS
@given(clusters(), pods("new"), st.booleans())
def test_fused_mask_is_every_filter_anded(cluster: Cluster, pod: Pod, exclude_first: bool) -> None:
    arrays = cluster.arrays
    exclude = None
    if exclude_first:
        exclude = np.zeros(len(arrays), dtype=bool)
        exclude[0] = True
    expected = np.ones(len(arrays), dtype=bool)
    for _, mask in filter_masks(pod, arrays, exclude):
        expected &= mask
    assert feasible_mask(pod, arrays, exclude).tolist() == expected.tolist()


@SETTINGS
@given(clusters(), pods("new"), st.sampled_from(POLICY_NAMES))
def test_skipping_the_reasons_changes_only_the_reasons(
    cluster: Cluster, pod: Pod, policy: str
) -> None:
    with_why = schedule(pod, cluster, make_policy(policy, seed=3))
    without = schedule(pod, cluster, make_policy(policy, seed=3), why=False)
    if isinstance(with_why, Placement):
        assert without == with_why
    else:
        assert without == Unschedulable(pod.key, {}, len(cluster.arrays))
        assert sum(with_why.reasons.values()) == len(cluster.arrays)


def _allocation_reference(pod: Pod, arrays: NodeArrays, most: bool) -> list[float]:
    """The allocation scores the long way: every total converted and divided per pod, 0 where
    a node lacks the resource, then clipped to 0..100 (the formula before the kept totals)."""
    cpu = safe_ratio(
        (arrays.cpu_free - pod.cpu_milli).astype(float), arrays.cpu_total.astype(float)
    )
    mem = safe_ratio(
        (arrays.mem_free - pod.memory_mib).astype(float), arrays.mem_total.astype(float)
    )
    gpu_cap = (arrays.gpu_total * 1000).astype(float)
    gpu = safe_ratio((arrays.gpu_free.sum(1) - pod.gpu_demand_milli).astype(float), gpu_cap)
    free = cpu + mem + gpu
    counted = (1.0 + (arrays.mem_total > 0) + (gpu_cap > 0)).astype(float)
    value = (counted - free) / counted if most else free / counted
    return np.clip(value * 100.0, 0.0, 100.0).tolist()


@SETTINGS
@given(clusters(), clusters(), pods("new"), st.booleans())
def test_allocation_scores_match_the_long_way_bit_for_bit(
    first: Cluster, second: Cluster, pod: Pod, most: bool
) -> None:
    # One policy object scores two node sets in turn (its kept totals must follow the set);
    # the clusters include GPU-less nodes, where the GPU fraction is 0 and not counted.
    policy = make_policy("most-allocated" if most else "least-allocated")
    for arrays in (first.arrays, second.arrays, first.arrays.copy()):
        feasible = np.ones(len(arrays), dtype=bool)
        got = policy.score(pod, arrays, feasible).tolist()
        assert got == _allocation_reference(pod, arrays, most)  # == on floats: every bit


def test_a_sharing_pod_fits_by_the_most_free_gpu() -> None:
    # Node a: GPUs at 300 / 600 free (max 600); node b: one GPU at 1000. A 0.5-GPU pod fits
    # a (600 >= 500) and b; a 0.7-GPU pod fits only b (600 < 700).
    arrays = Cluster.build(
        [Node("a", 8000, 10**5, 2, "A100"), Node("b", 8000, 10**5, 1, "A100")]
    ).arrays.copy()
    arrays.allocate(0, Pod("x", num_gpu=1, gpu_milli=700), (0,))
    arrays.allocate(0, Pod("y", num_gpu=1, gpu_milli=400), (1,))
    assert arrays.share_max.tolist() == [600, 1000]
    half, most = Pod("h", num_gpu=1, gpu_milli=500), Pod("m", num_gpu=1, gpu_milli=700)
    assert feasible_mask(half, arrays).tolist() == [True, True]
    assert feasible_mask(most, arrays).tolist() == [False, True]


@pytest.mark.parametrize(
    ("taken", "k", "expected"),
    [
        ((), 2, (0, 1)),  # all free: the lowest indices
        ((0, 2), 3, (1, 3, 4)),  # around the taken ones
        ((0, 1, 2, 3, 4, 5), 2, (6, 7)),  # exactly enough
        ((0, 1, 2, 3, 4, 5), 3, "no NVLink domain with 3 free GPUs"),  # 2 free < 3
        ((), 9, "not enough entirely free NVLink domains"),  # more than the node has
    ],
)
def test_one_domain_nodes_give_the_first_free_gpus(
    taken: tuple[int, ...], k: int, expected: tuple[int, ...] | str
) -> None:
    # One 8-GPU node (one NVLink domain): whole_gpus' single-domain path.
    arrays = Cluster.build([Node("a", 64000, 10**6, 8, "A100")]).arrays.copy()
    if taken:
        arrays.allocate(0, Pod("t", num_gpu=len(taken)), taken)
    if isinstance(expected, str):
        with pytest.raises(NoGpuFit, match=expected):
            whole_gpus(k, arrays, 0)
    else:
        assert whole_gpus(k, arrays, 0) == expected


@SETTINGS
@given(
    clusters().filter(lambda c: bool((c.arrays.gpu_total > 0).all())),
    st.lists(pods("new"), min_size=1, max_size=4),
    st.sampled_from(["least-allocated", "most-allocated", "reserve-binpack"]),
    st.booleans(),
)
def test_one_pass_picks_what_the_long_way_picks(
    cluster: Cluster, new: list[Pod], policy_name: str, exclude_first: bool
) -> None:
    # Every node has GPUs, so every total is > 0 and the allocation policies take the
    # one-pass path (asserted; reserve-binpack always does); the long way is the filters,
    # node_scores and select, as before it. The generated nodes are alike (32 cores, 10^6
    # MiB), so equal scores, and the first-row tie-break, are common.
    arrays = cluster.arrays.copy()
    policy = make_policy(policy_name)
    exclude = None
    if exclude_first:
        exclude = np.zeros(len(arrays), dtype=bool)
        exclude[0] = True
    for pod in new:
        assert isinstance(policy, FreshScores)
        fresh = policy.fresh_scores(pod, arrays)
        assert fresh is not None  # the path under test
        got = schedule(pod, arrays, policy, exclude=exclude)
        feasible = feasible_mask(pod, arrays, exclude)
        # one side of the clip skipped: every bit the same on a feasible row, ≥ 0 there
        clipped = policy.score(pod, arrays, feasible)
        assert fresh[feasible].tolist() == clipped[feasible].tolist()
        assert (fresh[feasible] >= 0).all()
        # the long way's selection with the policy's tie order (reserve-binpack: fewest GPUs)
        ties = tie_order(pod, arrays, policy)
        row = select(node_scores(pod, arrays, policy, feasible), feasible, ties)
        if row is None:
            assert isinstance(got, Unschedulable)
            continue
        scores = node_scores(pod, arrays, policy, feasible)
        gpus = policy.choose_gpus(pod, arrays, row)
        assert got == Placement(pod.key, arrays.names[row], row, gpus, int(scores[row]))
        arrays.allocate(row, pod, gpus)  # the next pod sees a changed cluster


def test_one_pass_is_skipped_where_a_total_is_zero() -> None:
    # A GPU-less node: its GPU fraction is not counted (0/0 would be NaN), so the allocation
    # policies give no fresh scores and schedule() takes the long way.
    arrays = Cluster.build(
        [Node("cpu", 8000, 10**5, 0, ""), Node("gpu", 8000, 10**5, 4, "A100")]
    ).arrays
    policy = make_policy("least-allocated")
    assert isinstance(policy, FreshScores)
    assert policy.fresh_scores(Pod("p", cpu_milli=1000), arrays) is None
    # cpu-only pod: "cpu" scores (7000/8000 + 1 + 0) / 2 × 100 = 93.75 → 93; "gpu" scores
    # (7000/8000 + 1 + 4000/4000) / 3 × 100 = 95.83 → 95: the GPU node wins.
    placed = schedule(Pod("p", cpu_milli=1000, memory_mib=0), arrays, policy)
    assert isinstance(placed, Placement)
    assert (placed.node, placed.score) == ("gpu", 95)
