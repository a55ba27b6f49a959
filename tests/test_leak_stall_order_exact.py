"""The stop test (``_stalled_since``) with its cheap bound tried first — a tail whose gap is
within half the gap of growth that stopped is passed over before the spread and the line's
error are computed — gives to the bit what it gave with every bound computed (the oracle below,
the code as it was), with and without the line's error, on stalls, leaks, noise, NaN and odd
figures."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.detect.series import Binned, PrefixSlopes, median, median_pairwise_slope
from defrag.detectors.leak.core import LeakParams, _line_se, _mean, _stalled_since
from tests.test_detect_leak_stall_exact import stalling

HOUR_S = 3600.0
END = 1_772_452_800.0
PARAMS = LeakParams()


def oracle(
    bins: Binned,
    slope: float,
    noise: float,
    ratio: float,
    params: LeakParams,
    line_error: bool = False,
) -> float | None:
    need = max(int(np.ceil(params.flat_for_s / bins.width)), 2)
    n = len(bins.times)
    if n < 2 * need or slope <= 0:
        return None
    hours = (bins.times - bins.times[0]) / HOUR_S
    heads = PrefixSlopes(hours, bins.values)
    for size in range(n // 2, need - 1, -1):
        head_h, head_v = hours[:-size], bins.values[:-size]
        before = heads.median(n - size)
        if before <= 0:
            continue
        residual = head_v - before * head_h
        base = median(residual)
        spread = max(noise, 1.4826 * median(np.abs(residual - base)))
        gap = base + before * hours[-size:] - bins.values[-size:]
        stopped = before * (hours[-size:] - hours[-size] + bins.width / 2 / HOUR_S)
        whole = _line_se(head_h, hours[-size:], spread, ratio) if line_error else 0.0
        if _mean(gap) <= max(
            3.5 * math.sqrt(spread * spread * ratio / size + whole * whole), _mean(stopped) / 2
        ):
            continue
        last = _mean(gap[-need:])
        end_se = _line_se(head_h, hours[-need:], spread, ratio) if line_error else 0.0
        if last <= max(
            3.5 * math.sqrt(spread * spread * ratio / need + end_se * end_se),
            _mean(stopped[-need:]) / 2,
        ):
            continue
        own = median_pairwise_slope(hours[-size:], bins.values[-size:]) if size >= 6 else 0.0
        if own < params.min_persistence * before:
            return float(bins.times[-size] - bins.width / 2)
    return None


def answer(f, *args: object) -> str:  # type: ignore[no-untyped-def]
    """The answer's repr, or the exception's type (a bound's sqrt of a negative, say)."""
    try:
        with np.errstate(all="ignore"):
            return repr(f(*args))
    except (ValueError, ZeroDivisionError, OverflowError) as e:
        return type(e).__name__


def test_the_stop_test_is_as_it_was_on_stalls_and_leaks() -> None:
    rng = np.random.default_rng(12)
    found = 0
    for k in range(900):
        n = int(rng.integers(2, 90))
        bins = stalling(
            n, float(rng.uniform(-200, 2000)), int(rng.integers(0, n)), [0.0, 5.0, 80.0][k % 3], rng
        )
        slope = float(rng.uniform(-10, 2000))
        noise, ratio = float(rng.uniform(0, 60)), float(rng.uniform(0.5, 3))
        for line_error in (False, True):
            want = answer(oracle, bins, slope, noise, ratio, PARAMS, line_error)
            assert answer(_stalled_since, bins, slope, noise, ratio, PARAMS, line_error) == want
            found += want != "None"
    assert 100 < found < 1700  # both answers are exercised


odd_figures = st.sampled_from(
    [0.0, -1.0, 1.0, 1.5, 1e-300, 1e60, math.inf, -math.inf, math.nan, 2.0, 30.0]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(-1e5, 1e5, allow_nan=False),
            st.sampled_from([math.nan, math.inf, 0.0, 1e300]),
        ),
        min_size=4,
        max_size=40,
    ),
    st.floats(-10, 3000, allow_nan=False),
    odd_figures,
    odd_figures,
    st.booleans(),
    st.sampled_from([300.0, 1e-60, 60.0]),
)
def test_the_stop_test_is_as_it_was_on_any_figures(
    values: list[float], slope: float, noise: float, ratio: float, line_error: bool, width: float
) -> None:
    v = np.array(values)
    times = END - width * np.arange(len(v))[::-1]
    bins = Binned(times, v, width)
    want = answer(oracle, bins, slope, noise, ratio, PARAMS, line_error)
    assert answer(_stalled_since, bins, slope, noise, ratio, PARAMS, line_error) == want
