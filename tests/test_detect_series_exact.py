"""The fast series kernels give, to the bit, what their plain numpy formulations give.

``median`` stands in for ``np.median`` and the pairwise slopes reuse one index table per length:
the leak verdicts (and the corpus figures) must not move by a rounding or a zero's sign.
The oracles below are the plain formulations the kernels replaced.
"""

from __future__ import annotations

import math
import warnings
from datetime import UTC, datetime

import numpy as np
import pytest

from defrag.detect.series import (
    Binned,
    Trend,
    median,
    median_pairwise_slope,
    rolling_floor,
    sen_trend,
)
from defrag.detectors.leak.core import LeakParams, Life, detect_workload_leaks
from defrag.detectors.leak.registration import _may_crash_loop

Z = 1.959963984540054


def oracle_slope(x: np.ndarray, y: np.ndarray) -> float:
    i, j = np.triu_indices(len(x), 1)
    dx = x[j] - x[i]
    keep = dx > 0
    if len(x) < 2 or not keep.any():
        return 0.0
    return float(np.median((y[j] - y[i])[keep] / dx[keep]))


def oracle_sen(x: np.ndarray, y: np.ndarray, ratio: float) -> Trend:
    """Sen's slope and interval with a given variance ratio, as sen_trend computed them."""
    n = len(x)
    i, j = np.triu_indices(n, 1)
    dx, dy = x[j] - x[i], y[j] - y[i]
    keep = dx > 0
    slopes = np.sort(dy[keep] / dx[keep])
    m = len(slopes)
    slope = float(np.median(slopes))
    s = float(np.sign(dy[keep]).sum())
    root = float(np.sqrt(n * (n - 1) * (2 * n + 5) / 18.0 * ratio))
    zs = (s - np.sign(s)) / root
    p = float(0.5 * math.erfc(zs / math.sqrt(2.0)))
    lo_rank, hi_rank = (m - Z * root) / 2.0, (m + Z * root) / 2.0
    low = float(slopes[int(np.clip(np.floor(lo_rank), 0, m - 1))]) if lo_rank >= 0 else -np.inf
    high = float(slopes[int(np.clip(np.ceil(hi_rank), 0, m - 1))]) if hi_rank <= m - 1 else np.inf
    return Trend(slope, low, high, float(s / (n * (n - 1) / 2.0)), p, ratio)


@pytest.mark.parametrize(
    "values",
    [
        [5.0],
        [3.0, 1.0, 2.0],
        [4.0, 1.0, 3.0, 2.0],  # even: the mean of 2 and 3
        [-0.0],  # np.median sums from +0.0: the median of −0.0 is 0.0
        [-0.0, -0.0],
        [0.0, -0.0, -0.0, 5.0],
        [1.0, math.nan, 2.0],  # any NaN: NaN
        [math.inf, 1.0, 2.0, 3.0],
        [1e308, 1e308],  # the two middle ones overflow when summed, as in np.mean
        [],
    ],
)
def test_median_is_numpys_to_the_bit(values: list[float]) -> None:
    a = np.array(values, dtype=float)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # numpy warns of an empty slice and of the overflow
        expected = float(np.median(a))
    assert repr(median(a)) == repr(expected)


@pytest.mark.parametrize(
    "values",
    [
        np.array([9.0, 1.0, 5.0, 3.0, 7.0]),
        np.array([4.0, math.nan, 1.0, 2.0]),
        np.array([7, 2, 9, 4]),  # integers: partitioned as integers, as np.median does
        np.arange(10.0)[::-2],  # a strided view
    ],
)
def test_median_leaves_its_input_as_it_was(values: np.ndarray) -> None:
    """``median`` partitions a copy (in place, without ``np.partition``'s wrapper): the caller's
    array keeps its order, and the value is ``np.median``'s (9,1,5,3,7 → 5; 7,2,9,4 → 5.5)."""
    before = values.copy()
    got = median(values)
    assert np.array_equal(values, before, equal_nan=True)
    assert repr(got) == repr(float(np.median(before)))


def cases() -> list[tuple[np.ndarray, np.ndarray]]:
    """Seeded series like the detector's: bin centres (some repeated), rounded noisy values,
    steps of 500, flat runs, zeros of both signs."""
    rng = np.random.default_rng(26)
    out = []
    for k in range(400):
        n = int(rng.integers(0, 80))
        x = np.arange(n) / 12.0 if k % 2 else np.sort(rng.uniform(0, 6, n))
        if k % 7 == 0 and n > 3:
            x[1], x[3] = x[0], x[2]  # repeated times: those pairs have no slope
        y = rng.normal(0, 100, n).round(int(rng.integers(0, 3))) + (k % 5) * 300 * x
        if k % 11 == 0:
            y = np.round(y / 500) * 500
        if k % 13 == 0:
            y = np.zeros(n) * np.sign(rng.normal(size=n))  # ±0.0
        out.append((x, y))
    return out


def test_pairwise_slope_and_sen_trend_are_the_plain_formulations() -> None:
    checked = 0
    for x, y in cases():
        assert repr(median_pairwise_slope(x, y)) == repr(oracle_slope(x, y))
        if len(x) >= 3 and (np.diff(x) > 0).any():
            for ratio in (1.0, 1.7):
                assert repr(sen_trend(x, y, variance_ratio=ratio)) == repr(oracle_sen(x, y, ratio))
                checked += 1
    assert checked > 500


NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
END = NOW.timestamp()
H = 3600.0


def life(owner: str, pod: str, start_h: float, hours: float, ended: bool) -> Life:
    """A life growing steadily from 1 GiB to its GPU's 80 GiB (usable) over ``hours``."""
    t = END - start_h * H + np.arange(0.0, hours * H + 1, 30.0)
    used = 1024.0 + (t - t[0]) / (hours * H) * (81920.0 - 1024.0)
    return Life(owner, pod, f"gpu/n/{pod}", "n", t, used, 81920.0, ended)


@pytest.mark.parametrize(
    ("lives", "kept", "found"),
    [
        # two lives ended at the GPU's memory within the lookback: a crash loop, all kept
        ([life("w/Job/a", "a-1", 5, 2, True), life("w/Job/a", "a-2", 3, 2, True)], 2, 1),
        # one ended, one current: cannot make min_lives (2) ended lives, none fitted
        ([life("w/Job/b", "b-1", 5, 2, True), life("w/Job/b", "b-2", 3, 2, False)], 0, 0),
        # the first ended before the lookback (6 h): one ended life within it
        ([life("w/Job/c", "c-1", 12, 2, True), life("w/Job/c", "c-2", 3, 2, True)], 0, 0),
        # a qualifying owner keeps its current life too (it is in the finding's evidence)
        (
            [
                life("w/Job/d", "d-1", 6, 1, True),
                life("w/Job/d", "d-2", 4, 1, True),
                life("w/Job/d", "d-3", 2, 1, False),
            ],
            3,
            1,
        ),
    ],
)
def test_only_workloads_that_can_crash_loop_are_fitted(
    lives: list[Life], kept: int, found: int
) -> None:
    params = LeakParams(query="DCGM_FI_DEV_FB_USED")
    narrowed = _may_crash_loop(lives, params, NOW)
    assert len(narrowed) == kept
    findings = detect_workload_leaks(lives, params, NOW)
    assert len(findings) == found
    assert detect_workload_leaks(narrowed, params, NOW) == findings


def oracle_floor_values(binned: Binned, window: float) -> np.ndarray:
    """rolling_floor's values through numpy's sliding_window_view (the formulation it had)."""
    n = max(round(window / binned.width), 1)
    idx = np.round((binned.times - binned.times[0]) / binned.width).astype(np.int64)
    size = int(idx[-1]) + 1
    if n <= 1 or size < 2 * n:
        return binned.values
    grid = np.full(size, np.nan)
    grid[idx] = binned.values
    windows = np.lib.stride_tricks.sliding_window_view(grid, n)
    keep = np.sum(~np.isnan(windows), axis=1) * 2 >= n
    return np.where(np.isnan(windows), np.inf, windows).min(axis=1)[keep]


def test_rolling_floor_is_the_sliding_window_minimum() -> None:
    rng = np.random.default_rng(5)
    for k in range(300):
        n = int(rng.integers(1, 90))
        times = np.sort(rng.choice(100, n, replace=False)).astype(float) * 300 + 1e9  # gaps
        values = rng.normal(0, 100, n).round(1) * (k % 3) + (k % 5) * 10
        binned = Binned(times, values, 300.0)
        for window in (600.0, 3600.0, 7200.0):
            got = rolling_floor(binned, window).values
            assert repr(got.tolist()) == repr(oracle_floor_values(binned, window).tolist())
