"""The onset's hinge search (``hinge.best_break``: every break estimated at once, the close ones
fitted one by one) gives to the bit what the plain loop gave — the same break and the same
residual sum — on random series with near-ties, plateaus, steps, restarts and NaN. The oracle
below is that loop, as ``_onset`` ran it."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.detect.series import Binned, median_pairwise_slope
from defrag.detectors.leak.core import ONSET_FLAT_SHARE, ONSET_SSE_SHARE, _onset
from defrag.detectors.leak.hinge import best_break, estimates, hinge_sse

HOUR_S = 3600.0
END = 1_772_452_800.0


def oracle_line_sse(x: np.ndarray, y: np.ndarray) -> float:
    xc = x - x.mean()
    yc = y - y.mean()
    sxx = float(xc @ xc)
    b = float(xc @ yc) / sxx if sxx > 0 else 0.0
    r = yc - b * xc
    return float(r @ r)


def oracle_best(h: np.ndarray, v: np.ndarray, first: int, last: int) -> tuple[int, float]:
    best_k, best_sse = 0, oracle_line_sse(h, v)
    for k in range(first, last):
        sse = oracle_line_sse(np.maximum(h - h[k], 0.0), v)
        if sse < best_sse:
            best_k, best_sse = k, sse
    return best_k, best_sse


def oracle_onset(bins: Binned, need: int) -> float | None:
    n = len(bins.times)
    if n < need + 3:
        return None
    h = (bins.times - bins.times[0]) / HOUR_S
    v = bins.values
    best_k, best_sse = oracle_best(h, v, 3, n - need + 1)
    if best_k == 0 or best_sse > ONSET_SSE_SHARE * oracle_line_sse(h, v):
        return None
    x = np.maximum(h - h[best_k], 0.0)
    rise = float(np.polyfit(x, v, 1)[0])
    if rise <= 0 or median_pairwise_slope(h[:best_k], v[:best_k]) > ONSET_FLAT_SHARE * rise:
        return None
    return float(bins.times[best_k] - bins.width / 2)


def shaped(rng: np.random.Generator, n: int, kind: int) -> np.ndarray:
    """One of the shapes the onset meets: flat then growing, a plateau, a step, a restart,
    quantised noise (exact ties), a symmetric hinge (two breaks tie), a NaN gap."""
    h = np.arange(n) / 12.0
    base = float(rng.choice([0.0, 8000.0, 79_000.0, 1e9]))
    sigma = float(rng.choice([0.0, 0.5, 5.0, 80.0]))
    at = int(rng.integers(0, n))
    rate = float(rng.uniform(-500, 3000))
    noise = rng.normal(0.0, sigma, n) if sigma else np.zeros(n)
    if kind == 0:  # flat, then a line
        v = base + rate * np.maximum(h - h[at], 0.0) + noise
    elif kind == 1:  # a plateau: growth that stopped
        v = base + rate * np.minimum(h, h[at]) + noise
    elif kind == 2:  # a step
        v = base + np.where(np.arange(n) >= at, abs(rate), 0.0) + noise
    elif kind == 3:  # a restart: near nothing, then growth again
        v = base + rate * h + noise
        v[at:] = rate * (h[at:] - h[at]) + noise[at:]
    elif kind == 4:  # quantised: many exact ties
        v = np.round(base + rate * np.maximum(h - h[at], 0.0) + noise, -2)
    elif kind == 5:  # symmetric about the middle: mirrored breaks leave equal sums
        half = rate * np.abs(h - h[n // 2])
        v = base + half + noise
    else:  # a NaN gap
        v = base + rate * h + noise
        v[at : at + int(rng.integers(1, 4))] = np.nan
    return v


def test_best_break_is_the_loop_on_shaped_series() -> None:
    rng = np.random.default_rng(40)
    breaks = set()
    for trial in range(1400):
        n = int(rng.integers(4, 100))
        v = shaped(rng, n, trial % 7)
        h = np.arange(n) / 12.0 + float(rng.choice([0.0, 1e-9, 0.5]))
        need = int(rng.integers(1, 8))
        want = oracle_best(h, v, 3, n - need + 1)
        got = best_break(h, v, 3, n - need + 1)
        assert repr(got) == repr(want), (trial, n, need)
        breaks.add(want[0] > 0)
    assert breaks == {True, False}  # both answers are exercised


def test_near_ties_go_to_the_loop() -> None:
    """Two breaks whose sums differ in the last bits: the earlier one wins only when it is
    strictly less, as in the loop (the estimates cannot tell them apart)."""
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(300):
        n = int(rng.integers(10, 80))
        h = np.arange(n) / 12.0
        v = 1000.0 * np.abs(h - h[n // 2]) + rng.choice([0.0, 1e-12, -1e-12], n)
        want = oracle_best(h, v, 3, n - 1)
        assert repr(best_break(h, v, 3, n - 1)) == repr(want)
        hits += want[0] > 0
    assert hits > 0


def test_repeated_times_fall_back_to_the_loop() -> None:
    h = np.array([0.0, 0.1, 0.1, 0.2, 0.3, 0.3, 0.4, 0.5, 0.6])
    v = np.array([5.0, 5.0, 5.0, 5.0, 9.0, 12.0, 15.0, 19.0, 22.0])
    assert repr(best_break(h, v, 3, 7)) == repr(oracle_best(h, v, 3, 7))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(4, 90),
    st.integers(0, 6),
    st.integers(1, 10),
    st.integers(0, 2**32 - 1),
    st.floats(-1e6, 1e6, allow_nan=False),
)
def test_onset_is_the_loop(n: int, kind: int, need: int, seed: int, shift: float) -> None:
    rng = np.random.default_rng(seed)
    v = shaped(rng, n, kind) + shift
    times = END - 300.0 * np.arange(n)[::-1] - 150.0
    bins = Binned(times, v, 300.0)
    assert repr(_onset(bins, need)) == repr(oracle_onset(bins, need))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(-1e7, 1e7, allow_nan=False),
            st.sampled_from([0.0, 1.0, 100.0, 100.0 + 1e-9, float("nan")]),
        ),
        min_size=4,
        max_size=60,
    ),
    st.integers(1, 6),
)
def test_best_break_is_the_loop_on_any_values(values: list[float], need: int) -> None:
    v = np.array(values)
    h = np.arange(len(v)) / 12.0
    last = len(v) - need + 1
    assert repr(best_break(h, v, 3, last)) == repr(oracle_best(h, v, 3, last))


def test_the_estimates_lie_well_within_the_bound() -> None:
    """The premise of the search: each estimate differs from its break's own fit by far less
    than half the bound (here: less than a thousandth of it), on every shape above."""
    rng = np.random.default_rng(11)
    worst = 0.0
    for trial in range(700):
        n = int(rng.integers(5, 150))
        v = shaped(rng, n, trial % 6)  # no NaN: those are fitted one by one
        h = np.arange(n) / 12.0 + float(rng.choice([0.0, 3.7]))
        estimate, bound = estimates(h, v, 3, n - 1)
        fits = np.array([hinge_sse(h, v, k) for k in range(3, n - 1)])
        if bound > 0:
            worst = max(worst, float(np.abs(estimate - fits).max()) / bound)
        else:
            assert (estimate == fits).all()
    assert worst < 1e-3
