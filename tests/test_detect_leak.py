"""The leak detector on histories of known shape: only steady growth is a leak, noise or not.

Shapes come from tests/support/prometheus.py (the fleet the integration tests backfill) and from
the labelled corpus in bench/leak_corpus.py (every family the issue lists, with its truth).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bench.leak_corpus import Case, corpus
from defrag.detectors.leak.core import (
    DcgmLabels,
    GpuMemorySeries,
    LeakParams,
    Occupancy,
    assess_leak,
    detect_leaks,
    memory_of_model,
    split_occupancy,
)
from tests.support.prometheus import (
    END,
    GPU_MEMORY_MIB,
    HOUR,
    LEAK_RATE_MIB_PER_H,
    leak_exhaustion,
    make_fleet,
)

PARAMS = LeakParams(query="DCGM_FI_DEV_FB_USED", lookback_s=6 * HOUR, horizon_s=48 * HOUR)


def series_of(shape: str, *, pods: int = 1, **kw: object) -> GpuMemorySeries:
    fleet = make_fleet([shape], shared=(0,) if pods == 2 else (), **kw)  # type: ignore[arg-type]
    g = fleet.gpus[0]
    return GpuMemorySeries(
        g.node,
        str(g.gpu),
        g.times,
        g.used,
        GPU_MEMORY_MIB,
        tuple(f"ml/{p}" for p in g.pods),
        g.uuid,
    )


def at_end(case: Case) -> datetime:
    return datetime.fromtimestamp(float(case.series.times[-1]), UTC)


def one(family: str, noise: float, rate: float | None = None, seed: int = 5) -> Case:
    rates = (rate,) if rate else (512.0,)
    return corpus(seed=seed, per_cell=1, families=(family,), noises=(noise,), rates=rates)[0]


@pytest.mark.parametrize(
    ("shape", "reason"),
    [
        ("plateau", "slope"),  # flat after a 20-minute warm-up: no growth in the last 6 h
        ("sawtooth", "slope"),  # drops its 3000 MiB cache every hour: the floor is flat
        ("step", "slope"),  # one jump a third into the window: Theil–Sen ignores it (49 MiB/h)
        ("flat", "slope"),
    ],
)
def test_non_leaks_of_the_fleet_are_not_flagged_and_say_why(shape: str, reason: str) -> None:
    verdict = assess_leak(series_of(shape), PARAMS, END)
    assert not verdict.leaking
    assert any(reason in r for r in verdict.reasons), verdict.reasons


@pytest.mark.parametrize(
    ("family", "noise", "reason"),
    [
        ("warmup-exp", 400.0, "rises in"),  # levels off: the last slice does not keep rising
        ("warmup-log", 600.0, "slope"),  # judged from an hour after it loaded: ~flat
        ("restart", 400.0, "rises in"),  # judged since the drop: a warm-up that levels off
        ("step", 600.0, "slope"),
        ("sawtooth", 600.0, "slope"),
        ("spikes", 800.0, "slope"),
    ],
)
def test_non_leak_families_are_not_flagged(family: str, noise: float, reason: str) -> None:
    case = one(family, noise, seed=11)
    verdict = assess_leak(case.series, PARAMS, at_end(case))
    assert not verdict.leaking
    assert any(reason in r for r in verdict.reasons), verdict.reasons


def test_warmup_in_progress_is_rejected_as_levelling_off() -> None:
    # 30 GiB approached exponentially, 95% after 2 h, judged 3.5 h after the job started: the
    # slices rise at ~19500, 3400 and 600 MiB/h against 4400 overall; the last two are below half
    t = END.timestamp() - 3.5 * HOUR + np.arange(30.0, 3.5 * HOUR + 1, 30.0)
    h = (t - t[0]) / HOUR
    used = 30000.0 * (1 - np.exp(-3 * h / 2.0))
    # it loaded from nothing: judged only an hour (``settle``) after memory was last near zero
    verdict = assess_leak(GpuMemorySeries("n", "0", t, used, GPU_MEMORY_MIB, ("a/b",)), PARAMS, END)
    assert not verdict.leaking
    assert verdict.reasons == ("too little history since the job loaded (2.4 h)",)
    # the slices reject it too when it is judged on the whole window (no settle)
    whole = assess_leak(
        GpuMemorySeries("n", "0", t, used, GPU_MEMORY_MIB, ("a/b",)),
        replace(PARAMS, settle_s=0.0),
        END,
    )
    assert not whole.leaking and any("rises in" in r for r in whole.reasons), whole.reasons


def test_a_restart_starts_the_history_again() -> None:
    # 30000 MiB for 4 h, a drop to ~0 (the job restarts), then growth at 2000 MiB/h: before the
    # drop is another job's history; 2 h after it there is too little to judge, 3.5 h after it
    # the regrowth alone is judged (and, rising steadily, is a leak)
    t = END.timestamp() - 7.5 * HOUR + np.arange(30.0, 7.5 * HOUR + 1, 30.0)
    h = (t - t[0]) / HOUR
    used = np.where(h < 4.0, 30000.0, 200.0 + 2000.0 * np.maximum(h - 4.0, 0.0))
    s = GpuMemorySeries("n", "0", t, used, GPU_MEMORY_MIB, ("a/b",))
    early = assess_leak(s, PARAMS, datetime.fromtimestamp(t[0] + 6 * HOUR, UTC))
    # a restart to nothing is a load: judged from ``settle`` (1 h) after the last near-zero bin
    assert early.reasons == ("too little history since the job loaded (0.9 h)",)
    late = assess_leak(s, PARAMS, END)
    assert late.leaking, late.reasons
    assert late.evidence["slope_mib_per_h"] == pytest.approx(2000.0, rel=0.02)


def test_linear_leak_is_flagged_with_exhaustion_time_near_the_truth() -> None:
    s = series_of("leak")
    verdict = assess_leak(s, PARAMS, END)
    assert verdict.leaking, verdict.reasons
    # truth: 8000 MiB + 2000 MiB/h reaches 81920 MiB after 36.96 h from the start (12 h ago),
    # i.e. 24.96 h after END
    truth = leak_exhaustion(END.timestamp() - 12 * HOUR)
    assert verdict.exhaust_at is not None
    assert abs(verdict.exhaust_at - truth) <= 0.01 * (truth - END.timestamp())
    ev = verdict.evidence
    assert ev["slope_mib_per_h"] == pytest.approx(LEAK_RATE_MIB_PER_H, rel=0.02)
    lo, hi = ev["slope_ci_mib_per_h"]  # type: ignore[misc]
    assert lo <= LEAK_RATE_MIB_PER_H <= hi and hi - lo < 100
    assert ev["trend_p"] < 1e-10  # type: ignore[operator]
    # 40 MiB of sample noise; a 5-min median of 10 samples has sd ≈ 1.25 × 40 / √10 ≈ 16
    assert 5 < ev["noise_mib"] < 30  # type: ignore[operator]
    assert ev["judged_on"] == "bins"

    [finding] = detect_leaks([s], PARAMS, END)
    assert finding.kind == "leak"
    assert finding.subject == "pod/ml/leak-0"
    assert finding.labels == {
        "node": "node-000",
        "detector": "leak",
        "rule": PARAMS.name,
        "gpu": "0",
        "namespace": "ml",
        "pod": "leak-0",
    }
    assert finding.evidence["query"] == "DCGM_FI_DEV_FB_USED"
    assert finding.evidence["hours_to_exhaust"] == pytest.approx(24.96, abs=0.3)
    assert "95% CI" in finding.summary
    assert finding.action == "alert"
    assert finding.since == datetime.fromtimestamp(END.timestamp() - 6 * HOUR, UTC)


def test_noisy_leak_from_the_issue_is_found() -> None:
    # 1.5 GiB/h under 400 MiB of sample noise, 30 s for 6 h, 20 GiB at the start of 80 GiB:
    # raw samples fall back by > 2 GiB (noise alone), the 5-min medians do not
    rng = np.random.default_rng(3)
    t = END.timestamp() - 6 * HOUR + np.arange(30.0, 6 * HOUR + 1, 30.0)
    clean = 20480.0 + 1536.0 * (t - t[0]) / HOUR
    used = clean + rng.normal(0, 400.0, len(t))
    assert float((np.maximum.accumulate(used) - used).max()) > 2000
    verdict = assess_leak(GpuMemorySeries("n", "0", t, used, GPU_MEMORY_MIB, ("a/b",)), PARAMS, END)
    assert verdict.leaking, verdict.reasons
    # truth: (81920 − 20480) / 1536 = 40 h after the first sample, i.e. 34 h after END
    assert verdict.evidence["hours_to_exhaust"] == pytest.approx(34.0, rel=0.05)


def test_growth_under_a_sawtooth_is_judged_on_the_floor() -> None:
    case = one("sawtooth-leak", 400.0, rate=1024.0, seed=2)
    verdict = assess_leak(case.series, PARAMS, at_end(case))
    assert verdict.leaking, verdict.reasons
    assert verdict.evidence["judged_on"] == "floor"
    assert verdict.evidence["slope_mib_per_h"] == pytest.approx(1024.0, rel=0.15)


def test_shared_gpu_leak_is_unattributable() -> None:
    [finding] = detect_leaks([series_of("leak", pods=2)], PARAMS, END)
    assert finding.subject == "gpu/node-000/0"
    assert "unattributable" in finding.summary
    assert finding.evidence["pods"] == ["ml/leak-0-a", "ml/leak-0-b"]
    assert "pod" not in finding.labels


def test_exporter_only_leak_is_unattributable_and_says_so() -> None:
    s = replace(series_of("leak"), pods=(), exporter_only=True)
    [finding] = detect_leaks([s], PARAMS, END)
    assert finding.subject == "gpu/node-000/0"
    assert "only the exporter's own pod" in finding.summary


def test_mig_instance_has_its_own_subject_capacity_and_profile() -> None:
    case = one("mig", 200.0, rate=1024.0, seed=4)
    s = replace(case.series, node="node-7", gpu="2", instance="5", profile="3g.40gb")
    s = replace(s, total_mib=40192.0)
    verdict = assess_leak(s, PARAMS, at_end(case))
    assert verdict.evidence["gpu_instance"] == "5"
    assert verdict.evidence["mig_profile"] == "3g.40gb"
    assert verdict.evidence["total_mib"] == 40192.0
    [finding] = detect_leaks([s], PARAMS, at_end(case))
    assert finding.subject == "pod/" + s.pods[0]
    assert finding.evidence["gpu_subject"] == "gpu/node-7/2/mig-5"
    assert finding.labels["gpu_instance"] == "5"


def test_no_node_label_is_keyed_and_named_by_uuid() -> None:
    s = replace(series_of("leak", pods=2), node="")
    [finding] = detect_leaks([s], PARAMS, END)
    assert finding.subject == "gpu/GPU-node-000-00"


def test_reserved_memory_brings_exhaustion_forward() -> None:
    # exhaustion at total − reserved: 4096 MiB less at 2000 MiB/h is 2.05 h earlier
    s = series_of("leak")
    plain = assess_leak(s, PARAMS, END)
    reserved = assess_leak(replace(s, reserved_mib=4096.0), PARAMS, END)
    assert plain.exhaust_at is not None and reserved.exhaust_at is not None
    assert (plain.exhaust_at - reserved.exhaust_at) / HOUR == pytest.approx(4096 / 2000, rel=0.03)
    assert reserved.evidence["reserved_mib"] == 4096.0


def test_leak_beyond_the_horizon_is_not_flagged() -> None:
    # exhaustion 24.96 h after END: a 12 h horizon is too short
    verdict = assess_leak(series_of("leak"), replace(PARAMS, horizon_s=12 * HOUR), END)
    assert not verdict.leaking
    assert any("beyond" in r for r in verdict.reasons)


def test_critical_when_exhaustion_is_close() -> None:
    [finding] = detect_leaks([series_of("leak")], replace(PARAMS, critical_within_s=30 * HOUR), END)
    assert finding.severity == "critical"


def test_too_little_history_is_not_a_leak() -> None:
    # 30 min: less than the 1 h fast window (an hour of a 2 GiB/h leak is found: item 2)
    verdict = assess_leak(series_of("leak", hours=0.5), PARAMS, END)
    assert not verdict.leaking
    assert "too little history" in verdict.reasons[0]


def test_noise_free_linear_leak_gives_exact_exhaustion() -> None:
    t = np.arange(0.0, 6 * HOUR + 1, 30.0) + END.timestamp() - 6 * HOUR
    used = 1000.0 + (t - t[0]) / HOUR * 1000.0  # 1000 MiB/h
    s = GpuMemorySeries("n", "0", t, used, 8000.0, ("a/b",))
    verdict = assess_leak(s, replace(PARAMS, min_slope_mib_per_h=500), END)
    assert verdict.leaking, verdict.reasons
    # reaches 8000 at (8000-1000)/1000 = 7 h after the first point, i.e. 1 h after END
    assert verdict.evidence["hours_to_exhaust"] == pytest.approx(1.0, abs=0.02)


# --- labels --------------------------------------------------------------------------------------

L = DcgmLabels()


@pytest.mark.parametrize(
    ("labels", "node"),
    [
        ({"Hostname": "a", "hostname": "b", "instance": "c:9400"}, "a"),  # before d5e5f51
        ({"hostname": "b", "instance": "c:9400"}, "b"),  # dcgm-exporter main
        ({"instance": "node-3:9400"}, "node-3"),  # --no-hostname, address target: port dropped
        ({"instance": "node-3"}, "node-3"),  # the GPU operator's relabelling of the node name
        ({"kubernetes_node": "k"}, "k"),
        ({}, ""),
    ],
)
def test_node_label_variants(labels: dict[str, str], node: str) -> None:
    assert L.node_of(labels) == node


@pytest.mark.parametrize(
    ("labels", "key"),
    [
        ({"UUID": "GPU-1", "gpu": "0", "Hostname": "a"}, ("uuid", "GPU-1", "")),
        ({"uuid": "GPU-1", "gpu": "0"}, ("uuid", "GPU-1", "")),  # --use-old-namespace
        ({"UUID": "GPU-1", "gpu": "0", "GPU_I_ID": "3"}, ("uuid", "GPU-1", "3")),  # MIG
        ({"gpu": "0", "hostname": "a"}, ("node", "a", "0", "")),
        ({"gpu": "0"}, None),  # neither UUID nor node: nothing names the GPU
    ],
)
def test_series_key_variants(labels: dict[str, str], key: tuple[str, ...] | None) -> None:
    assert L.key(labels) == key


EXPORTER = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x7k2p"}


@pytest.mark.parametrize(
    ("labels", "targets", "pod"),
    [
        ({"namespace": "ml", "pod": "train-0"}, frozenset(), "ml/train-0"),  # honorLabels: true
        (EXPORTER | {"exported_namespace": "ml", "exported_pod": "t"}, frozenset(), "ml/t"),
        (EXPORTER | {"pod_namespace": "ml", "pod_name": "t"}, frozenset(), "ml/t"),  # old names
        (EXPORTER, frozenset(), None),  # pod mapping off: the exporter's own, by its name
        (
            {"namespace": "mon", "pod": "gpu-metrics-abc"},
            frozenset({"mon/gpu-metrics-abc"}),
            None,
        ),  # renamed exporter, known as a scrape target from its other series
        ({"namespace": "ml"}, frozenset(), None),
    ],
)
def test_pod_label_variants(
    labels: dict[str, str], targets: frozenset[str], pod: str | None
) -> None:
    assert L.pod_key(labels, targets) == pod


def test_scrape_targets_are_learned_from_exported_series() -> None:
    series = [
        {
            "namespace": "mon",
            "pod": "gpu-metrics-abc",
            "exported_pod": "t",
            "exported_namespace": "ml",
        },
        {"namespace": "mon", "pod": "gpu-metrics-abc"},
        {"namespace": "ml", "pod": "train"},
    ]
    assert L.target_pods(series) == frozenset({"mon/gpu-metrics-abc"})


# --- properties ----------------------------------------------------------------------------------

T = END.timestamp() - 6 * HOUR + np.arange(30.0, 6 * HOUR + 1, 30.0)  # 6 h at 30 s
T2 = END.timestamp() - 6 * HOUR + np.arange(120.0, 6 * HOUR + 1, 120.0)  # 6 h at 2 min


@settings(max_examples=40, deadline=None)
@given(
    start=st.floats(0, 40000),
    drops=st.lists(st.floats(0, 2000), min_size=len(T2), max_size=len(T2)),
)
def test_never_rising_memory_is_never_a_leak(start: float, drops: list[float]) -> None:
    used = start + 100000.0 - np.cumsum(drops) * 0.01  # non-increasing
    verdict = assess_leak(GpuMemorySeries("n", "0", T2, used, 200000.0, ("a/b",)), PARAMS, END)
    assert not verdict.leaking


@settings(max_examples=40, deadline=None)
@given(
    # 512 MiB/h and more (slower leaks, down to the 64 MiB/h noise guard, judged by their time
    # to exhaustion: tests/test_detect_leak_shapes.py)
    rate=st.floats(512.0, 5120.0),
    start=st.floats(0, 20000),
    noise=st.floats(0, 400),
    seed=st.integers(0, 2**16),
)
# the last hour's 95% interval is 113–472 MiB/h: the ETA is 2.4 h (10.1%) late, as it allows
@example(rate=512.0, start=108.0, noise=165.0, seed=556)
# noise taken for a stop at END and five and ten minutes on; found at fifteen
@example(rate=1533.527907994423, start=6095.248961187616, noise=326.1242114637552, seed=38510)
def test_steady_growth_is_a_leak_with_exhaustion_within_10_percent(
    rate: float, start: float, noise: float, seed: int
) -> None:
    """Found at END, or — where the raw-sample stop test (a one-sided test at ``stop_z`` = 3
    spreads) took noise for a stop — at a later evaluation, five minutes apart, within
    ``stop_tail`` (15 min: by then that test reads only samples it had not seen). Its false
    stops are a designed rate, not zero, and overlapping tails make them linger: of 90,000
    random draws of this property, 27 were still stopped five minutes on, 2 of them ten minutes
    on, none fifteen.

    The ETA is the level line's (the lookback's slope: within 6% of the truth over those
    draws) unless the last hour's 95% interval puts it later — the ETA is never sooner than the
    last hour supports. That interval's upper end lies below a steady leak's rate in a designed
    share of evaluations (1.5–1.7% measured), below rate / 1.1 in 0.2% at 512 MiB/h and σ 165,
    0.8% at σ 400: then the ETA is more than 10% late, no later than that stated upper end
    allows, and the bound is the interval's, not 10%."""
    total = start + rate * 6 + rate * 24  # exhausted 24 h after END (inside the 48 h horizon)
    later = np.concatenate([T, T[-1] + np.arange(30.0, PARAMS.stop_tail_s + 1, 30.0)])
    used = (
        start
        + rate * (later - T[0]) / HOUR
        + np.random.default_rng(seed).normal(0, noise, len(later))
    )
    now, n = END, len(T)
    verdict = assess_leak(GpuMemorySeries("n", "0", T, used[:n], total, ("a/b",)), PARAMS, now)
    while (
        not verdict.leaking
        and verdict.reasons[0].startswith("growth has stopped")
        and n < len(later)
    ):
        now, n = now + timedelta(minutes=5), n + 10
        series = GpuMemorySeries("n", "0", later[:n], used[:n], total, ("a/b",))
        verdict = assess_leak(series, PARAMS, now)
    assert verdict.leaking, verdict.reasons
    assert verdict.exhaust_at is not None
    truth = END.timestamp() + 24 * HOUR
    assert verdict.exhaust_at >= truth - 0.10 * 24 * HOUR  # the last hour only ever delays it
    if verdict.exhaust_at > truth + 0.10 * 24 * HOUR:
        ci = verdict.evidence["recent_slope_ci_mib_per_h"]
        assert isinstance(ci, list)
        high = ci[1]
        # late only where the last hour's own interval excludes the true rate, and by no more
        # than its upper end implies from the memory truly left (5%: the last hour's level)
        assert high is not None and high < rate, (ci, rate)
        left = total - start - rate * (now.timestamp() - T[0]) / HOUR
        assert verdict.exhaust_at - now.timestamp() <= 1.05 * left / high * HOUR


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"gpu": "0"}, {"gpu": "1"}),  # two GPUs of one pod
        ({"gpu": "2", "instance": "3"}, {"gpu": "2", "instance": "5"}),  # two MIG instances
        ({"node": "", "gpu": "", "uuid": "GPU-a"}, {"node": "", "gpu": "", "uuid": "GPU-b"}),
    ],
)
def test_each_leaking_gpu_of_one_pod_has_its_own_fingerprint_and_alert(
    first: dict[str, str], second: dict[str, str]
) -> None:
    """Before, both findings were ``pod/ml/leak-0`` with one fingerprint, and the MIG pair had
    the same alert labels: Alertmanager merged them into one alert."""
    from defrag.alerting import AlertTemplate

    base = series_of("leak")
    found = detect_leaks([replace(base, **first), replace(base, **second)], PARAMS, END)  # type: ignore[arg-type]
    assert [f.subject for f in found] == ["pod/ml/leak-0", "pod/ml/leak-0"]
    assert found[0].fingerprint != found[1].fingerprint
    alerts = [AlertTemplate().alert(f) for f in found]
    assert alerts[0] is not None and alerts[1] is not None
    assert alerts[0].key != alerts[1].key


@pytest.mark.parametrize(
    ("model", "mib"),
    [
        ("NVIDIA H100 80GB HBM3", 80 * 1024.0),
        ("NVIDIA A100-SXM4-40GB", 40 * 1024.0),
        ("Tesla T4", None),  # no size in the name
    ],
)
def test_memory_of_model(model: str, mib: float | None) -> None:
    assert memory_of_model(model) == mib


def test_a_leak_whose_capacity_is_unknown_is_still_reported() -> None:
    """Capacity 0 (no free-memory reading, no model) used to read "never reaches the GPU's
    memory": a leak became no leak."""
    s = replace(series_of("leak"), total_mib=0.0, capacity_from="unknown")
    [finding] = detect_leaks([s], PARAMS, END)
    assert finding.evidence["capacity_from"] == "unknown"
    assert "hours_to_exhaust" not in finding.evidence
    assert "exhaustion time unknown" in finding.summary


@pytest.mark.parametrize(
    ("lasts", "current", "ended"),
    [
        ([100.0, 3000.0], ["b"], ["a"]),  # a ended, b holds the GPU now
        ([3000.0, 2900.0], ["a", "b"], []),  # both within a bin of the last sample: shared
        ([500.0, 100.0, 3000.0], ["c"], ["b", "a"]),  # ended ones oldest first
    ],
)
def test_split_occupancy(lasts: list[float], current: list[str], ended: list[str]) -> None:
    lives = [
        Occupancy(name, np.array([0.0, last]), np.array([1.0, 2.0]))
        for name, last in zip("abc", lasts, strict=False)
    ]
    now, gone = split_occupancy(lives, 300.0)
    assert [o.pod for o in now] == current and [o.pod for o in gone] == ended


# --- issue 21 items 2 and 5: a cache that stopped 15 min ago; leaks at the noise's edge -------

E = END.timestamp()
END_AT = END


def _grown(
    rate: float, flat_min: float, noise: float, seed: int, *, tau_min: float = 0.0
) -> GpuMemorySeries:
    """6 h of 30 s samples growing ``rate`` MiB/h, then flat for the last ``flat_min`` minutes
    (at 60 000 MiB of an 80 GiB GPU), with white noise (or AR(1) noise of time constant
    ``tau_min``) of σ ``noise``."""
    from bench.leak_corpus import ar1_noise

    rng = np.random.default_rng(seed)
    t = np.arange(E - 6 * HOUR + 30.0, E + 1e-6, 30.0)
    stop = E - flat_min * 60.0
    clean = 60000.0 - rate * np.maximum(stop - t, 0.0) / HOUR
    jitter = ar1_noise(t, noise, tau_min * 60.0, rng) if tau_min else rng.normal(0, noise, len(t))
    return GpuMemorySeries("n", "0", t, clean + jitter, 81920.0, ("ml/p",), "GPU-x")


@pytest.mark.parametrize(
    ("rate", "flat_min", "noise", "tau_min", "stopped"),
    [
        # flat 15 min: the growth the tail lost, Σu·gap/Σu², is ≈ the rate (1024–4096 MiB/h);
        # its spread over 15-min blocks of white noise σ 200 on 30 samples is
        # 200 / √(Σu²) = 200 / √(30 × 0.25² / 3) ≈ 253 MiB/h, so 1024 stands 4 spreads clear
        (1024.0, 15.0, 200.0, 0.0, True),
        (1536.0, 15.0, 200.0, 0.0, True),
        (4096.0, 15.0, 200.0, 0.0, True),
        (2048.0, 15.0, 0.0, 0.0, True),  # no noise: any lost growth shows
        # growth goes on: the tail is on the line, whatever the noise
        (1024.0, 0.0, 200.0, 0.0, False),
        (768.0, 0.0, 600.0, 0.0, False),
        # AR(1) noise, τ 20 min: a 15-min tail lingering low is the noise (its blocks show it)
        (768.0, 0.0, 600.0, 20.0, False),
    ],
)
def test_growth_that_stopped_15_min_ago_is_not_a_leak(
    rate: float, flat_min: float, noise: float, tau_min: float, stopped: bool
) -> None:
    """Before: 5-min bins recognised a 1 GiB/h cache only 20–25 min after it stopped."""
    for seed in range(4):
        v = assess_leak(_grown(rate, flat_min, noise, seed, tau_min=tau_min), PARAMS, END_AT)
        says = any("growth has stopped" in r for r in v.reasons)
        assert says == stopped, (seed, v.reasons)
        assert not (stopped and v.leaking)


def _onset(rate: float, hours_since: float, noise: float, seed: int) -> GpuMemorySeries:
    """Flat at 65 000 MiB, then a leak of ``rate`` MiB/h for the last ``hours_since`` h of 8
    (at 512 MiB/h the GPU is exhausted within 33 h: inside the 48 h horizon)."""
    rng = np.random.default_rng(seed)
    t = np.arange(E - 8 * HOUR + 30.0, E + 1e-6, 30.0)
    start = E - hours_since * HOUR
    clean = 65000.0 + rate * np.maximum(t - start, 0.0) / HOUR
    used = clean + rng.normal(0.0, noise, len(t))
    return GpuMemorySeries("n", "0", t[t <= E], used[t <= E], 81920.0, ("ml/p",), "GPU-x")


@pytest.mark.parametrize(
    ("rate", "hours", "noise", "at_least"),
    [
        # 2 h of 512 MiB/h is 1024 MiB of growth; σ 600 on 30 s samples is ≈ 240 MiB on 5-min
        # medians (600 × 1.25 / √10): 4.3 noises, above the 2 h window's 3 (it was 6: never).
        # At σ 600 a 2-standard-error dip still hides one in eight (the bench: 0.85–0.88 of 40),
        # so 9 of 10 here; before: 4 of 10 at σ 400, 1 of 10 at σ 600
        (512.0, 2.0, 400.0, 10),
        (512.0, 2.0, 600.0, 9),
        # 1 h of 2 GiB/h in the fast window: each half-hour's Sen slope (6 bins) spreads by
        # ≈ 240 / √(6 × 0.5² / 12) ≈ 680 MiB/h, so a half is judged by its interval's upper end;
        # before: 8 and 3 of 10
        (2048.0, 1.0, 400.0, 10),
        (2048.0, 1.0, 600.0, 10),
    ],
)
def test_leaks_are_found_within_their_target_time(
    rate: float, hours: float, noise: float, at_least: int
) -> None:
    """Item 2: ≤ 2 h at 512 MiB/h and ≤ 1 h at 2 GiB/h, σ ≤ 600 MiB (before: the slowest took
    3.5–4.5 h and 1.25 h)."""
    found = sum(
        assess_leak(_onset(rate, hours, noise, seed), PARAMS, END_AT).leaking for seed in range(10)
    )
    assert found >= at_least, found
