"""The leak detector on histories of known shape: only the steady linear growth is a leak."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.detect.leak import GpuMemorySeries, LeakParams, assess_leak, detect_leaks
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


@pytest.mark.parametrize(
    ("shape", "reason"),
    [
        ("plateau", "slope"),  # flat after a 20-minute warm-up: no growth in the last 6 h
        ("sawtooth", "falls back"),  # drops its 3000 MiB cache every hour
        ("step", "rises in"),  # one jump: only one slice in six rises
        ("flat", "slope"),
    ],
)
def test_non_leaks_are_not_flagged_and_say_why(shape: str, reason: str) -> None:
    verdict = assess_leak(series_of(shape), PARAMS, END)
    assert not verdict.leaking
    assert any(reason in r for r in verdict.reasons), verdict.reasons


def test_linear_leak_is_flagged_with_exhaustion_time_near_the_truth() -> None:
    s = series_of("leak")
    verdict = assess_leak(s, PARAMS, END)
    assert verdict.leaking, verdict.reasons
    # truth: 8000 MiB + 2000 MiB/h reaches 81920 MiB after 36.96 h from the start (12 h ago),
    # i.e. 24.96 h after END
    truth = leak_exhaustion(END.timestamp() - 12 * HOUR)
    assert verdict.exhaust_at is not None
    assert abs(verdict.exhaust_at - truth) <= 0.01 * (truth - END.timestamp())
    assert verdict.evidence["slope_mib_per_h"] == pytest.approx(LEAK_RATE_MIB_PER_H, rel=0.02)

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
    assert finding.action == "alert"
    assert finding.since == datetime.fromtimestamp(END.timestamp() - 6 * HOUR, UTC)


def test_shared_gpu_leak_is_unattributable() -> None:
    [finding] = detect_leaks([series_of("leak", pods=2)], PARAMS, END)
    assert finding.subject == "gpu/node-000/0"
    assert "unattributable" in finding.summary
    assert finding.evidence["pods"] == ["ml/leak-0-a", "ml/leak-0-b"]
    assert "pod" not in finding.labels


def test_leak_beyond_the_horizon_is_not_flagged() -> None:
    # exhaustion 24.96 h after END: a 12 h horizon is too short
    verdict = assess_leak(series_of("leak"), replace(PARAMS, horizon_s=12 * HOUR), END)
    assert not verdict.leaking
    assert any("beyond" in r for r in verdict.reasons)


def test_critical_when_exhaustion_is_close() -> None:
    [finding] = detect_leaks([series_of("leak")], replace(PARAMS, critical_within_s=30 * HOUR), END)
    assert finding.severity == "critical"


def test_too_little_history_is_not_a_leak() -> None:
    verdict = assess_leak(series_of("leak", hours=1.0), PARAMS, END)
    assert not verdict.leaking
    assert "too little history" in verdict.reasons[0]


def test_noise_free_linear_leak_gives_perfect_fit() -> None:
    t = np.arange(0.0, 6 * HOUR + 1, 30.0) + END.timestamp() - 6 * HOUR
    used = 1000.0 + (t - t[0]) / HOUR * 1000.0  # 1000 MiB/h
    s = GpuMemorySeries("n", "0", t, used, 8000.0, ("a/b",))
    verdict = assess_leak(s, replace(PARAMS, min_slope_mib_per_h=500), END)
    assert verdict.leaking
    assert verdict.fit is not None and verdict.fit.r2 == pytest.approx(1.0)
    # reaches 8000 at (8000-1000)/1000 = 7 h after the first point, i.e. 1 h after END
    assert verdict.evidence["hours_to_exhaust"] == pytest.approx(1.0, abs=1e-6)


# --- properties ----------------------------------------------------------------------------------

T = END.timestamp() - 6 * HOUR + np.arange(0.0, 6 * HOUR + 1, 120.0)  # 6 h at 2 min


@settings(max_examples=60, deadline=None)
@given(
    start=st.floats(0, 40000),
    drops=st.lists(st.floats(0, 2000), min_size=len(T), max_size=len(T)),
)
def test_never_rising_memory_is_never_a_leak(start: float, drops: list[float]) -> None:
    used = start + 100000.0 - np.cumsum(drops) * 0.01  # non-increasing
    verdict = assess_leak(GpuMemorySeries("n", "0", T, used, 200000.0, ("a/b",)), PARAMS, END)
    assert not verdict.leaking


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(2 * PARAMS.min_slope_mib_per_h, 20 * PARAMS.min_slope_mib_per_h),
    start=st.floats(0, 20000),
    noise_fraction=st.floats(0, 0.005),
    seed=st.integers(0, 2**16),
)
def test_steady_growth_is_a_leak_with_exhaustion_within_10_percent(
    rate: float, start: float, noise_fraction: float, seed: int
) -> None:
    growth = rate * 6  # MiB over the 6 h window
    total = start + growth + rate * 24  # exhausted 24 h after END (inside the 48 h horizon)
    noise = np.random.default_rng(seed).normal(0, noise_fraction * growth, len(T))
    used = start + rate * (T - T[0]) / HOUR + noise
    verdict = assess_leak(GpuMemorySeries("n", "0", T, used, total, ("a/b",)), PARAMS, END)
    assert verdict.leaking, verdict.reasons
    assert verdict.exhaust_at is not None
    truth = END.timestamp() + 24 * HOUR
    assert abs(verdict.exhaust_at - truth) <= 0.10 * 24 * HOUR
