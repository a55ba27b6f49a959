"""The stop test (``_stalled_since``) from one table of pairwise slopes, longest tail first,
gives to the bit what its plain formulation gave: each tail's slope before it computed afresh,
every tail tried and the longest that passes kept. The oracle below is that formulation."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.detect.series import Binned, PrefixSlopes, median, median_pairwise_slope
from defrag.detectors.leak.core import LeakParams, _stalled_since

HOUR_S = 3600.0
END = 1_772_452_800.0


def oracle(
    bins: Binned, slope: float, noise: float, ratio: float, params: LeakParams
) -> float | None:
    need = max(int(np.ceil(params.flat_for_s / bins.width)), 2)
    n = len(bins.times)
    if n < 2 * need or slope <= 0:
        return None
    hours = (bins.times - bins.times[0]) / HOUR_S
    found: float | None = None
    for size in range(need, n // 2 + 1):
        head_h, head_v = hours[:-size], bins.values[:-size]
        before = median_pairwise_slope(head_h, head_v)
        if before <= 0:
            continue
        residual = head_v - before * head_h
        base = median(residual)
        spread = max(noise, 1.4826 * median(np.abs(residual - base)))
        gap = base + before * hours[-size:] - bins.values[-size:]
        stopped = before * (hours[-size:] - hours[-size] + bins.width / 2 / HOUR_S)
        if float(np.mean(gap)) <= max(3.5 * spread * np.sqrt(ratio / size), np.mean(stopped) / 2):
            continue
        last = float(np.mean(gap[-need:]))
        if last <= max(3.5 * spread * np.sqrt(ratio / need), float(np.mean(stopped[-need:])) / 2):
            continue
        own = median_pairwise_slope(hours[-size:], bins.values[-size:]) if size >= 6 else 0.0
        if own < params.min_persistence * before:
            found = float(bins.times[-size] - bins.width / 2)
    return found


def stalling(n: int, rate: float, flat_bins: int, sigma: float, rng: np.random.Generator) -> Binned:
    """``n`` 5-min bins growing ``rate`` MiB/h, flat for the last ``flat_bins``, with noise."""
    times = END - 300.0 * np.arange(n)[::-1] - 150.0
    hours = (times - times[0]) / HOUR_S
    grown = rate * np.minimum(hours, hours[max(n - 1 - flat_bins, 0)])
    values = 8000.0 + grown + rng.normal(0.0, sigma, n).round(1)
    return Binned(times, values, 300.0)


def test_the_stop_test_is_its_plain_formulation() -> None:
    rng = np.random.default_rng(9)
    params = LeakParams()
    found = 0
    for k in range(600):
        n = int(rng.integers(2, 90))
        bins = stalling(
            n, float(rng.uniform(-200, 2000)), int(rng.integers(0, n)), [0.0, 5.0, 80.0][k % 3], rng
        )
        slope = float(rng.uniform(-10, 2000))
        noise, ratio = float(rng.uniform(0, 60)), float(rng.uniform(1, 3))
        want = oracle(bins, slope, noise, ratio, params)
        assert repr(_stalled_since(bins, slope, noise, ratio, params)) == repr(want)
        found += want is not None
    assert 60 < found < 540  # both answers are exercised


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 80),
    st.floats(-500, 3000),
    st.integers(0, 80),
    st.floats(0, 200),
    st.floats(0.5, 4),
    st.integers(0, 2**32 - 1),
)
def test_the_stop_test_on_any_series(
    n: int, rate: float, flat: int, noise: float, ratio: float, seed: int
) -> None:
    bins = stalling(n, rate, min(flat, n), noise / 4, np.random.default_rng(seed))
    params = LeakParams()
    got = _stalled_since(bins, max(rate, 1.0), noise, ratio, params)
    assert repr(got) == repr(oracle(bins, max(rate, 1.0), noise, ratio, params))


def test_prefix_slopes_are_each_prefixs_median_pairwise_slope() -> None:
    rng = np.random.default_rng(27)
    for k in range(300):
        n = int(rng.integers(0, 75))
        x = np.arange(n) / 12.0 if k % 2 else np.sort(rng.uniform(0, 6, n))
        if k % 7 == 0 and n > 3:
            x[1], x[3] = x[0], x[2]  # repeated times: each prefix computed on its own
        y = rng.normal(0, 100, n).round(int(rng.integers(0, 3))) + (k % 5) * 300 * x
        if k % 11 == 0:
            y = np.round(y / 500) * 500
        if k % 13 == 0:
            y = np.zeros(n) * np.sign(rng.normal(size=n))  # ±0.0
        if k % 17 == 0 and n > 5:
            y[4] = np.nan
        table = PrefixSlopes(x, y)
        for m in range(n + 1):
            assert repr(table.median(m)) == repr(median_pairwise_slope(x[:m], y[:m]))
