"""The leak detector against the labelled corpus (bench/leak_corpus.py), and the series maths.

The full figures (every family × noise level, 10 per cell, the 1,000-history mix) are the bench's
(docs/benchmarks.md); here a small seeded slice of the same corpus must meet the issue's targets,
and the Prometheus-side prefilter must never drop a GPU the detector would flag.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from bench.bench_leak_corpus import evaluate
from bench.leak_corpus import LEAK_FAMILIES, NON_LEAK_FAMILIES, corpus
from defrag.detect.series import bin_medians, robust_noise, rolling_floor
from defrag.detectors.leak.core import LeakParams, assess_leak

PARAMS = LeakParams()
CASES = corpus(seed=9, per_cell=1, noises=(0.0, 300.0, 600.0))


@pytest.mark.parametrize("family", NON_LEAK_FAMILIES)
def test_no_non_leak_is_flagged_at_any_evaluation(family: str) -> None:
    flagged = [c.name for c in CASES if c.truth.family == family and evaluate(c).any_flag]
    assert flagged == []


@pytest.mark.parametrize("family", LEAK_FAMILIES)
def test_leaks_of_512_mib_per_h_and_more_are_found_with_a_close_eta(family: str) -> None:
    cases = [c for c in CASES if c.truth.family == family and c.truth.rate_mib_per_h >= 512]
    outcomes = [evaluate(c) for c in cases]
    missed = [o.case.name for o in outcomes if not o.flagged_at_end]
    assert len(missed) <= 1, missed  # 12 cases (4 rates × 3 noise levels); the bench has 0.985
    errors = [o.eta_error for o in outcomes if o.eta_error is not None]
    assert float(np.median(errors)) <= 0.25


def _deriv_per_h(times: np.ndarray, values: np.ndarray) -> float:
    """Prometheus ``deriv``: the least-squares slope of the raw samples (per second → per h)."""
    if len(times) < 2:
        return 0.0
    return float(np.polyfit(times - times[0], values, 1)[0]) * 3600


def test_the_prefilter_never_drops_a_leak() -> None:
    # rule prefilter: deriv(used[lookback] @ end()) * 3600 > min_slope / 2; results must not
    # depend on it, so every GPU flagged at any evaluation time must pass it at that time
    threshold = PARAMS.min_slope_mib_per_h / 2
    checked = 0
    for case in corpus(seed=4, per_cell=1, noises=(0.0, 400.0, 800.0)):
        s = case.series
        for at in np.arange(float(s.times[-1]), float(s.times[0]) + 3 * 3600, -3600.0):
            verdict = assess_leak(s, PARAMS, datetime.fromtimestamp(at, UTC))
            if verdict.leaking:
                keep = (s.times > at - PARAMS.lookback_s) & (s.times <= at)
                assert _deriv_per_h(s.times[keep], s.used_mib[keep]) > threshold, case.name
                checked += 1
    assert checked > 100  # the property was exercised


# --- series maths --------------------------------------------------------------------------------


def test_bin_medians_end_at_the_evaluation_time() -> None:
    # samples at 30 s over 10 min ending at t = 600: bins (0, 300] and (300, 600]
    t = np.arange(30.0, 601.0, 30.0)
    v = np.arange(len(t), dtype=float)  # 0..19
    b = bin_medians(t, v, 300.0, 600.0)
    assert list(b.times) == [150.0, 450.0]
    assert list(b.values) == [4.5, 14.5]  # medians of 0..9 and 10..19


def test_bin_medians_drop_empty_bins_and_ignore_a_spike() -> None:
    t = np.array([10.0, 20.0, 30.0, 710.0, 720.0])  # nothing in (300, 600]
    v = np.array([1.0, 1000.0, 2.0, 5.0, 5.0])
    b = bin_medians(t, v, 300.0, 900.0)
    assert list(b.times) == [150.0, 750.0] and list(b.values) == [2.0, 5.0]


def test_rolling_floor_flattens_a_sawtooth_and_follows_a_leak() -> None:
    t = np.arange(150.0, 6 * 3600.0, 300.0)  # 5-min bins over 6 h
    saw = 1000.0 * ((t % 3600.0) / 3600.0)  # 0 → 1000 every hour
    binned = bin_medians(t, saw, 300.0, 6 * 3600.0)
    floor = rolling_floor(binned, 3600.0)
    assert float(floor.values.max() - floor.values.min()) < 100  # the hour's trough: 0..83
    leak = bin_medians(t, saw + 0.5 * t, 300.0, 6 * 3600.0)  # + 1800 MiB/h
    f = rolling_floor(leak, 3600.0)
    slope_h = np.polyfit(f.times, f.values, 1)[0] * 3600
    assert slope_h == pytest.approx(1800.0, rel=0.05)


@pytest.mark.parametrize("sigma", [50.0, 400.0])
def test_robust_noise_estimates_sigma_under_a_trend(sigma: float) -> None:
    rng = np.random.default_rng(1)
    x = np.arange(2000.0)
    values = 10.0 * x + rng.normal(0, sigma, len(x))  # a steep trend does not count as noise
    assert robust_noise(values) == pytest.approx(sigma, rel=0.1)


@pytest.mark.parametrize("n", [3, 20, 61])
def test_median_pairwise_slope_is_scipys_theil_sen_slope(n: int) -> None:
    from scipy.stats import theilslopes

    from defrag.detect.series import median_pairwise_slope

    rng = np.random.default_rng(n)
    x = np.sort(rng.uniform(0, 6, n))
    y = 500 * x + rng.normal(0, 300, n)
    assert median_pairwise_slope(x, y) == pytest.approx(float(theilslopes(y, x).slope))


# --- issue 21: noise that lingers, saturation, fast leaks ------------------------------------


def test_sen_trend_is_the_plain_test_on_white_noise_and_widens_under_ar1() -> None:
    from scipy import stats

    from bench.leak_corpus import ar1_noise
    from defrag.detect.series import sen_trend

    rng = np.random.default_rng(4)
    x = np.arange(72) / 12.0  # 6 h of 5-min bins, in hours
    white = 500.0 * x + rng.normal(0.0, 300.0, 72)
    fit = sen_trend(x, white)
    ref = stats.theilslopes(white, x, alpha=0.95)
    assert fit.variance_ratio == 1.0  # no significant autocorrelation: the plain test
    assert fit.slope == pytest.approx(ref.slope)
    assert fit.low == pytest.approx(ref.low_slope, rel=0.01)
    assert fit.high == pytest.approx(ref.high_slope, rel=0.01)
    assert fit.p_rising == pytest.approx(
        stats.kendalltau(x, white, alternative="greater").pvalue, rel=0.2
    )
    # AR(1) noise, τ 20 min on 5-min bins: φ = e^(−1/4) ≈ 0.78, so n/n* near (1 + φ)/(1 − φ) ≈ 8
    lingering = 500.0 * x + ar1_noise(x * 3600.0, 600.0, 1200.0, rng)
    wide = sen_trend(x, lingering)
    assert wide.variance_ratio > 2.0
    assert wide.high - wide.low > fit.high - fit.low


@pytest.mark.parametrize("seed", [1, 3])
def test_leaks_under_ar1_noise_are_found_and_flat_ar1_noise_is_not(seed: int) -> None:
    """Before: 38 of 60 such leaks found (every miss failed "every slice rises")."""
    from bench.leak_corpus import correlated_corpus

    cases = correlated_corpus(seed, 20)
    leaks = [c for c in cases if c.truth.family == "ar1-leak"]
    found = sum(evaluate(c).flagged_at_end for c in leaks)
    assert found >= 19, found  # ≥ 0.95 of 20 (τ 1–20 min, σ 300–600 MiB, 512–1024 MiB/h)
    flat = [c.name for c in cases if c.truth.family == "ar1-flat" and evaluate(c).any_flag]
    assert flat == []


@pytest.mark.parametrize("seed", [5, 1, 11])
def test_a_cache_at_its_limit_is_not_reported_once_flat_for_15_min(seed: int) -> None:
    """Before: reported critical while flat at its limit for up to 1.25 h (5 of 20); then, on
    5-min bins alone, still reported 15 min after it stopped (2 of 20 on seed 1, 1 on seed 11):
    the last 15 min are judged on their raw samples now."""
    from bench.leak_corpus import correlated_corpus

    late = []
    for case in correlated_corpus(seed, 20):
        if case.truth.family != "saturating":
            continue
        assert case.truth.flat_since is not None
        for at in np.arange(case.truth.flat_since + 900.0, case.series.times[-1] + 1, 300.0):
            if assess_leak(case.series, PARAMS, datetime.fromtimestamp(at, UTC)).leaking:
                late.append(case.name)
                break
    assert late == []


def test_fast_leaks_are_found_within_the_hour_and_before_their_oom() -> None:
    """Before: the first finding came 5.25 h after a leak began; leaks that OOM their pod
    within about 5 h were never reported; then the slowest 2 GiB/h leak took 1.25 h and the
    slowest 512 MiB/h one 3.5–4.5 h. At σ ≤ 600 MiB: ≥ 2 GiB/h within 1 h of their start,
    ≥ 512 MiB/h within 2 h; every OOM reported at least 30 min before it."""
    from bench.leak_corpus import fast_corpus

    fast: list[float] = []  # hours from the leak's start to its first finding, ≥ 2 GiB/h
    within: list[float] = []  # … 512–1024 MiB/h
    late = []
    for case in fast_corpus(6, 2, noises=(0.0, 300.0, 600.0)):
        tr = case.truth
        stop = tr.exhaust_at if tr.family == "oom" else float(case.series.times[-1])
        assert stop is not None
        first = next(
            (
                float(at)
                for at in np.arange(tr.leak_start, stop, 900.0)
                if assess_leak(case.series, PARAMS, datetime.fromtimestamp(at, UTC)).leaking
            ),
            None,
        )
        if tr.family == "oom":
            if first is None or stop - first < 1800.0:  # 30 min of warning
                late.append(case.name)
        elif tr.rate_mib_per_h >= 512:
            hours = np.inf if first is None else (first - tr.leak_start) / 3600.0
            (fast if tr.rate_mib_per_h >= 2048 else within).append(hours)
    assert late == []
    assert max(fast) <= 1.0, fast
    assert max(within) <= 2.0, within
