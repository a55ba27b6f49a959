"""The scoring kernel's shortcuts agree with the long way round: the per-node counts kept by
``allocate``/``release``, the fused feasible mask, the reasons skipped on request."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from defrag.model import Cluster, Node, Pod
from defrag.model.units import GPU_MILLI
from defrag.scoring.filters import feasible_mask, filter_masks
from defrag.scoring.framework import Placement, Unschedulable
from defrag.scoring.policies import POLICY_NAMES, make_policy
from defrag.scoring.scheduler import schedule
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
