"""Pod incarnations and shared GPUs in the leak detector's pure core: who holds a GPU's memory.

Shapes follow NVIDIA/dcgm-exporter ``internal/pkg/transformation/kubernetes.go``
(``PodMapper.Process``): with ``--kubernetes-virtual-gpus`` and per-process data (4.5.3+,
``process_metrics.go``) the device-level ``DCGM_FI_DEV_FB_USED`` (no pod labels) is kept beside
each pod's own series; without it, each pod's series carries the device's value and the
unlabelled series is kept only while no pod holds the GPU.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.detectors.leak.core import (
    DcgmLabels,
    Occupancy,
    per_pod_occupants,
    split_incarnations,
    without_neighbours,
)

T = np.arange(0.0, 6 * 3600.0, 300.0)


def test_uid_label_is_read_where_dcgm_exporter_writes_it() -> None:
    # const.go: uidAttribute = "pod_uid"
    labels = {"pod": "p", "namespace": "ml", "container": "main", "pod_uid": "1f2e"}
    assert DcgmLabels().uid_of(labels) == "1f2e"
    assert DcgmLabels().uid_of({"pod": "p"}) == ""


def test_a_hole_while_the_gpu_went_on_is_a_new_incarnation() -> None:
    keep = (T < 3 * 3600) | (T >= 3 * 3600 + 900)
    life = Occupancy("ml/p", T[keep], np.ones(int(keep.sum())))
    others = T[~keep]  # the GPU's unlabelled series during the hole
    old, new = split_incarnations(life, others, 600.0)
    assert old.uid == "" and old.times[-1] < 3 * 3600
    assert new.uid == f"@{3 * 3600 + 900:.0f}" and new.times[0] == 3 * 3600 + 900


def test_a_hole_the_whole_gpu_shares_is_the_exporters_silence() -> None:
    keep = (T < 3 * 3600) | (T >= 3 * 3600 + 900)
    life = Occupancy("ml/p", T[keep], np.ones(int(keep.sum())))
    assert split_incarnations(life, T[keep], 600.0) == [life]
    with_uid = Occupancy("ml/p", T[keep], np.ones(int(keep.sum())), "u1")
    assert split_incarnations(with_uid, T[~keep], 600.0) == [with_uid]


def test_per_pod_series_are_told_apart_from_copies_by_their_labels() -> None:
    device = Occupancy("", T, np.full(len(T), 30000.0))
    pod_a = Occupancy("ml/a", T, np.full(len(T), 10000.0), "u-a")
    assert per_pod_occupants([device, pod_a])
    assert not per_pod_occupants([pod_a])  # copies: no unlabelled series beside the pods
    # the GPU unlabelled only after the pod left: not at the same scrapes
    left = Occupancy("ml/a", T[:10], np.full(10, 1.0))
    after = Occupancy("", T[10:], np.full(len(T) - 10, 1.0))
    assert not per_pod_occupants([left, after])


@settings(max_examples=50, deadline=None)
@given(
    level=st.floats(0.0, 40000.0),
    step=st.floats(-30000.0, 30000.0),
    at_h=st.floats(1.0, 5.0),
    rate=st.floats(0.0, 2000.0),
)
def test_a_neighbour_step_is_removed_and_the_present_level_kept(
    level: float, step: float, at_h: float, rate: float
) -> None:
    at = at_h * 3600.0
    clean = level + rate * T / 3600.0
    used = clean + np.where(at >= T, step, 0.0)  # the neighbour held `step` MiB until `at`
    out = without_neighbours(T, used, [at], 900.0)
    np.testing.assert_allclose(out[at < T], used[at < T])
    # before the change: the clean line, less at most the growth of the window either side
    err = np.abs(out[at >= T] - clean[at >= T])
    assert float(err.max()) <= rate * 1800.0 / 3600.0 + 1e-6
