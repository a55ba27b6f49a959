"""The screen's slope test by counting (``screen.slope_below``) is, row for row, the test it
replaced: the Theil–Sen medians of ``row_pairwise_slopes`` compared with the minimum — on rows
whose slopes tie the minimum, sit on both sides of it by half, or hold NaN and ±inf."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.detect.series import row_pairwise_slopes
from defrag.detectors.leak.screen import slope_below


def oracle(x: np.ndarray, rows: np.ndarray, limit: float) -> np.ndarray:
    with np.errstate(all="ignore"):
        return row_pairwise_slopes(x, rows) < limit


def check(x: np.ndarray, rows: np.ndarray, limit: float) -> None:
    with np.errstate(all="ignore"):
        got = slope_below(x, rows, limit, chunk=3)
    assert got.dtype == bool
    assert got.tolist() == oracle(x, rows, limit).tolist()


cells = st.one_of(
    st.integers(-20, 20).map(float),  # on a grid: many slopes equal the limit
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, -0.0]),
)


@settings(max_examples=400, deadline=None)
@given(
    st.integers(2, 12).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(st.lists(cells, min_size=n, max_size=n), min_size=1, max_size=8),
        )
    ),
    st.sampled_from([0.0, 1.0, 2.0, 12.0, 64.0, -3.0, 0.5]),
    st.sampled_from([1.0, 1 / 12, 0.25]),
)
def test_counting_is_the_median_test(
    shape: tuple[int, list[list[float]]], limit: float, dt: float
) -> None:
    n, rows = shape
    check(np.arange(n) * dt, np.array(rows), limit)


def test_rows_split_by_half_and_the_fleets_shape() -> None:
    """72 points (2,556 pairs: even), rows drawn about the limit so that some split exactly;
    and rows of a flat fleet with a few growing."""
    rng = np.random.default_rng(4)
    x = np.arange(72) / 12.0
    grid = rng.integers(-3, 4, size=(400, 72)).astype(float) + 2.0 * x  # slopes tie 2.0 often
    check(x, grid, 2.0)
    fleet = 8000.0 + rng.normal(0.0, 40.0, (500, 72)) + np.outer(rng.uniform(0, 200, 500), x)
    check(x, fleet, 64.0)
    # 14 points: 91 pairs (odd: the middle slope decides alone); 13 points: 78 (even)
    check(np.arange(14) / 12.0, rng.integers(-2, 3, size=(300, 14)).astype(float), 0.0)
    check(np.arange(13) / 12.0, rng.integers(-2, 3, size=(300, 13)).astype(float), 0.0)


def test_unsure_rows_are_exercised() -> None:
    """A row with exactly half its slopes below the limit: the counting cannot tell, the
    median does (here: the mean of the two middle slopes, 0 and 2, is 1 — below 1.5, not 1)."""
    x = np.array([0.0, 1.0, 2.0, 3.0])  # 6 pairs
    row = np.array([[0.0, 0.0, 2.0, 4.0]])  # slopes 0, 1, 1.33, 2, 2, 2 → median 1.67
    check(x, row, 1.5)
    check(x, row, 1.67)
    check(x, row, 2.0)


def test_times_out_of_order_are_refused_as_before() -> None:
    x = np.array([0.0, 2.0, 1.0])
    with pytest.raises(ValueError):
        slope_below(x, np.zeros((2, 3)), 1.0)
    with pytest.raises(ValueError):
        row_pairwise_slopes(x, np.zeros((2, 3)))
