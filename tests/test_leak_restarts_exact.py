"""``_restarts`` (where memory fell to a tenth of its running peak, or an OOM kill) with its
shortcut for series that cannot have fallen is, to the index, the plain computation — the
oracle below — on random series with zeros, negatives, NaN, plateaus and falls."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.detectors.leak.core import _restarts


def oracle(v: np.ndarray, min_fall: float, usable: float = 0.0) -> np.ndarray:
    if len(v) < 2:
        return np.empty(0, dtype=np.intp)
    peak = np.maximum.accumulate(v)
    oom = (peak >= 0.9 * usable) & (v <= 0.5 * peak) if usable > 0 else np.zeros(len(v), bool)
    fell = ((v <= 0.1 * peak) | oom) & (peak - v > max(min_fall, 0.0)) & (peak > 0)
    return np.flatnonzero(fell & ~np.concatenate(([False], fell[:-1])))


values = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([0.0, -0.0, 1.0, 10.0, 50.0, 51.0, 100.0, math.nan, 5e-324]),
)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(values, max_size=40),
    st.sampled_from([0.0, -1.0, 5.0, 1e9]),
    st.sampled_from([0.0, 100.0, 110.0, 80000.0]),
)
def test_restarts_are_the_plain_computation(v: list[float], min_fall: float, usable: float) -> None:
    a = np.array(v, dtype=float)
    with np.errstate(invalid="ignore"):
        got, want = _restarts(a, min_fall, usable), oracle(a, min_fall, usable)
    assert got.dtype == want.dtype
    assert got.tolist() == want.tolist()


def test_shapes_on_both_sides_of_the_shortcut() -> None:
    rng = np.random.default_rng(5)
    hits = 0
    for _ in range(3000):
        n = int(rng.integers(2, 60))
        level = float(rng.choice([0.0, 100.0, 8000.0]))
        v = level + rng.normal(0.0, float(rng.choice([0.0, 10.0, 3000.0])), n)
        if rng.random() < 0.3:  # a fall to near nothing, or to half (an OOM kill)
            v[int(rng.integers(0, n)) :] *= float(rng.choice([0.05, 0.1, 0.5, 0.51]))
        usable = float(rng.choice([0.0, level * 1.05, level * 2]))
        want = oracle(v, 0.0, usable)
        assert _restarts(v, 0.0, usable).tolist() == want.tolist()
        hits += len(want) > 0
    assert 100 < hits < 2900
