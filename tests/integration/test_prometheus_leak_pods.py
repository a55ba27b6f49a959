"""Leak detection against the real Prometheus on pods that share a GPU or are re-created.

Series are shaped as NVIDIA/dcgm-exporter writes them (``internal/pkg/transformation/
kubernetes.go``, ``PodMapper.Process``, and ``process_metrics.go``, 4.5.3+, PR #594):

- ``--kubernetes-virtual-gpus`` with per-process data: ``DCGM_FI_DEV_FB_USED`` is the
  device-level series (no pod labels: the GPU's whole memory) *and* one series per pod on the
  GPU with ``pod``, ``namespace``, ``container``, ``pod_uid`` (always, ``createPerProcessMetrics``)
  and ``vgpu`` where the device plugin names one — its value the sum of the pod's processes'
  memory (``getValueForMetric``: bytes / 1 MiB), "0" for a pod with none. Every other field,
  ``DCGM_FI_DEV_FB_FREE`` among them, is copied onto each pod's series with the device's value
  (``pod_uid`` only with ``--kubernetes-enable-pod-uid``) and no device-level series is kept
  while pods hold the GPU.
- without virtual GPUs and with ``--kubernetes-enable-pod-uid``: each field's one series gets
  ``pod``, ``namespace``, ``container`` and ``pod_uid``; a GPU no pod holds keeps its series
  without them. A pod re-created under its name has a new ``pod_uid``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from defrag.adapters.prometheus import PrometheusSource
from defrag.detection import run_detection
from defrag.rules import load_rules
from defrag.scoring.profile import ScoringProfile
from tests.support.prometheus import END, HOUR, gauge_family, prometheus_server

pytestmark = pytest.mark.integration

PROFILE = ScoringProfile.default()
GPU_MIB = 81920.0
HOURS = 8.0
TIMES = np.arange(END.timestamp() - HOURS * HOUR + 30, END.timestamp() + 1, 30.0)
H = (TIMES - TIMES[0]) / HOUR
RNG = np.random.default_rng(39)
MODEL = {"modelName": "NVIDIA H100 80GB HBM3", "device": "nvidia0"}
LEAK_RATE = 1024.0


def noisy(clean: np.ndarray, sigma: float = 200.0) -> np.ndarray:
    return np.clip(np.round(clean + RNG.normal(0, sigma, len(clean))), 0, None)


def gpu(variant: str, node: str, uuid: str) -> dict[str, str]:
    return {"variant": variant, "gpu": "0", "UUID": uuid, "hostname": node} | MODEL


def pod(name: str, uid: str | None, vgpu: str = "") -> dict[str, str]:
    out = {"pod": name, "namespace": "ml", "container": "main"}
    if uid is not None:
        out["pod_uid"] = uid
    if vgpu:
        out["vgpu"] = vgpu
    return out


Series = list[tuple[dict[str, str], np.ndarray, np.ndarray]]


def timesliced() -> tuple[Series, Series, float]:
    """Three pods time-slicing one GPU: one leaks 1 GiB/h from 8 GiB, one holds 20 GiB with a
    cache freed and refilled each 40 min, one holds 10 GiB; the device series is their sum plus
    the driver's 600 MiB. Returns (used, free, the true hours to exhaustion at END)."""
    base = gpu("timesliced", "node-t", "GPU-t0")
    leaker = noisy(8192.0 + LEAK_RATE * H)
    cache = noisy(20480.0 + 4096.0 * ((H * 60.0) % 40.0) / 40.0)
    steady = noisy(np.full_like(H, 10240.0))
    device = leaker + cache + steady + 600.0
    used: Series = [(base, TIMES, device)]
    free: Series = []
    for name, uid, values, slot in (
        ("leaker", "7c0e-1", leaker, "0"),
        ("cache", "7c0e-2", cache, "1"),
        ("steady", "7c0e-3", steady, "2"),
    ):
        used.append((base | pod(name, uid, slot), TIMES, values))
        free.append((base | pod(name, None, slot), TIMES, GPU_MIB - device))
    truth_h = (GPU_MIB - (8192.0 + LEAK_RATE * H[-1] + 20480.0 + 2048.0 + 10240.0 + 600.0)) / (
        LEAK_RATE
    )
    return used, free, truth_h


def recreated(variant: str, uids: bool, second_leaks: bool) -> tuple[Series, Series]:
    """A pod re-created under its name on its GPU 3 h before END, the GPU held by no pod for
    10 min between: the first incarnation leaks 2 GiB/h from 20 GiB (and is deleted); the second
    loads 30 GiB and then leaks 2 GiB/h (``second_leaks``: out of memory in about 22 h) or holds
    it."""
    base = gpu(variant, f"node-{variant}", f"GPU-{variant}")
    gone, back = HOURS - 3.0 - 10 / 60, HOURS - 3.0
    h = H
    first = h < gone
    hole = (h >= gone) & (h < back)
    second = h >= back
    old = noisy(20480.0 + 2048.0 * h)
    new = noisy(30720.0 + (2 * LEAK_RATE if second_leaks else 0.0) * np.maximum(h - back, 0.0))
    old_labels = base | pod("trainer-0", "a1" if uids else None)
    new_labels = base | pod("trainer-0", "b2" if uids else None)
    used: Series = [
        (old_labels, TIMES[first], old[first]),
        (base, TIMES[hole], noisy(np.full(int(hole.sum()), 300.0), 20.0)),
        (new_labels, TIMES[second], new[second]),
    ]
    free: Series = [(lab, t, GPU_MIB - v) for lab, t, v in used]
    return used, free


def neighbour_leaves() -> tuple[Series, Series]:
    """No per-process data: each pod's series carries the device's value. Pod ``a`` leaks
    1.5 GiB/h from 30 GiB; its time-slice neighbour ``b`` holds 25 GiB and leaves 2 h before END,
    taking its memory out of the GPU's total (on ``a``'s series: a 25 GiB fall)."""
    base = gpu("neighbour", "node-n", "GPU-n0")
    a = 30720.0 + 1536.0 * H
    b_there = HOURS - 2.0 > H
    device = noisy(a + np.where(b_there, 25600.0, 0.0))
    used: Series = [
        (base | pod("a", None), TIMES, device),
        (base | pod("b", None), TIMES[b_there], device[b_there]),
    ]
    free: Series = [(lab, t, GPU_MIB - v) for lab, t, v in used]
    return used, free


def neighbour_arrives() -> tuple[Series, Series]:
    """The same without per-process data: pod ``a`` leaks 1.5 GiB/h from 30 GiB, and ``b``
    arrives with 20 GiB 45 min before END and stays (on ``a``'s series: a 20 GiB step)."""
    base = gpu("arrives", "node-r", "GPU-r0")
    a = 30720.0 + 1536.0 * H
    b_there = HOURS - 0.75 <= H
    device = noisy(a + np.where(b_there, 20480.0, 0.0))
    used: Series = [
        (base | pod("a", None), TIMES, device),
        (base | pod("b", None), TIMES[b_there], device[b_there]),
    ]
    free: Series = [(lab, t, GPU_MIB - v) for lab, t, v in used]
    return used, free


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    used, free, _ = timesliced()
    for variant, uids, leaks in (
        ("uid-healthy", True, False),
        ("uid-leak", True, True),
        ("hole-healthy", False, False),
        ("hole-leak", False, True),
    ):
        u, f = recreated(variant, uids, leaks)
        used += u
        free += f
    for u, f in (neighbour_leaves(), neighbour_arrives()):
        used += u
        free += f
    path = tmp_path_factory.mktemp("om") / "pods.om"
    with path.open("w") as out:
        out.write(gauge_family("DCGM_FI_DEV_FB_USED", used))
        out.write(gauge_family("DCGM_FI_DEV_FB_FREE", free))
        out.write("# EOF\n")
    with prometheus_server(path) as server:
        yield server.url


def detect(url: str, tmp_path: Path, variant: str, prefilter: bool = True) -> list:
    sel = f'{{variant="{variant}"}}'
    text = (
        "rules:\n  - name: leak\n    detector: leak\n    queries:\n"
        f"      used: DCGM_FI_DEV_FB_USED{sel}\n      free: DCGM_FI_DEV_FB_FREE{sel}\n"
        f"    prefilter: {str(prefilter).lower()}\n"
    )
    path = tmp_path / f"{variant}.yaml"
    path.write_text(text)
    source = PrometheusSource(url, retries=0, timeout_s=10)
    report = run_detection(load_rules([path]), source, None, END, profile=PROFILE)
    assert report.failures == () and dict(report.skipped) == {}
    return list(report.findings)


@pytest.mark.parametrize("prefilter", [True, False])
def test_a_time_sliced_leak_names_its_pod_and_its_eta_is_its_own(
    prom: str, tmp_path: Path, prefilter: bool
) -> None:
    [finding] = detect(prom, tmp_path, "timesliced", prefilter)
    assert finding.subject == "pod/ml/leaker"
    assert finding.evidence["memory_of"] == "pod"
    assert finding.evidence["pod_uid"] == "7c0e-1"
    assert "unattributable" not in finding.summary
    _, _, truth_h = timesliced()
    # the pod's own slope against the GPU's free memory: not the device's average
    assert finding.evidence["slope_mib_per_h"] == pytest.approx(LEAK_RATE, rel=0.1)
    assert finding.evidence["hours_to_exhaust"] == pytest.approx(truth_h, rel=0.15)


@pytest.mark.parametrize("variant", ["uid-healthy", "hole-healthy"])
@pytest.mark.parametrize("prefilter", [True, False])
def test_a_healthy_incarnation_never_inherits_the_old_ones_leak(
    prom: str, tmp_path: Path, variant: str, prefilter: bool
) -> None:
    assert detect(prom, tmp_path, variant, prefilter) == []


@pytest.mark.parametrize("variant", ["uid-leak", "hole-leak"])
@pytest.mark.parametrize("prefilter", [True, False])
def test_a_re_created_pods_own_leak_is_found(
    prom: str, tmp_path: Path, variant: str, prefilter: bool
) -> None:
    [finding] = detect(prom, tmp_path, variant, prefilter)
    assert finding.subject == "pod/ml/trainer-0"
    assert finding.evidence["slope_mib_per_h"] == pytest.approx(2 * LEAK_RATE, rel=0.25)
    if variant == "uid-leak":
        assert finding.evidence["pod_uid"] == "b2"


@pytest.mark.parametrize("prefilter", [True, False])
def test_a_neighbour_leaving_a_shared_gpu_hides_no_leak(
    prom: str, tmp_path: Path, prefilter: bool
) -> None:
    [finding] = detect(prom, tmp_path, "neighbour", prefilter)
    assert finding.subject == "pod/ml/a"
    assert finding.evidence["slope_mib_per_h"] == pytest.approx(1536.0, rel=0.25)
    truth_h = (GPU_MIB - 30720.0 - 1536.0 * H[-1]) / 1536.0
    assert finding.evidence["hours_to_exhaust"] == pytest.approx(truth_h, rel=0.15)


@pytest.mark.parametrize("prefilter", [True, False])
def test_a_neighbour_arriving_on_a_shared_gpu_is_no_step(
    prom: str, tmp_path: Path, prefilter: bool
) -> None:
    # both pods carry the device's value: the GPU's growth, unattributable between them
    [finding] = detect(prom, tmp_path, "arrives", prefilter)
    assert finding.subject == "gpu/node-r/0"
    assert "unattributable" in finding.summary
    assert finding.evidence["slope_mib_per_h"] == pytest.approx(1536.0, rel=0.25)
    truth_h = (GPU_MIB - 30720.0 - 20480.0 - 1536.0 * H[-1]) / 1536.0
    assert finding.evidence["hours_to_exhaust"] == pytest.approx(truth_h, rel=0.15)
