"""The extender scale's floor is ``//``'s (defrag/extender/wire.py ``extender_scores``).

The answer's scores are ``min(9, floor(score / 10))`` for any node but the winner (10) and 0 for
NaN; the vectorised form takes ``floor`` of the rounded quotient and corrects it, and must give
what the floor division gave on every float, near every multiple of 10 above all.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.extender.wire import extender_scores


def _by_floor_division(scores: np.ndarray, winner: np.ndarray) -> np.ndarray:
    tenths = np.where(np.isfinite(scores), scores, 0.0)
    np.maximum(tenths, 0.0, out=tenths)
    tenths //= 10
    np.minimum(tenths, 9, out=tenths)
    values = tenths.astype(np.int64)
    values[winner] = 10
    return values


def test_near_every_multiple_of_ten() -> None:
    # the 50 floats each side of 0, 10, ..., 100, and the odd ones
    around = []
    for k in range(11):
        x = np.float64(10 * k)
        below, above = [x], [x]
        for _ in range(50):
            below.append(np.nextafter(below[-1], -np.inf))
            above.append(np.nextafter(above[-1], np.inf))
        around += below + above
    odd = [np.nan, np.inf, -np.inf, -0.0, -1e-300, 5e-324, 1e300, 89.99999999999999, 95.0]
    scores = np.array(around + odd)
    winner = np.zeros(len(scores), dtype=bool)
    winner[[3, 70]] = True
    assert np.array_equal(extender_scores(scores, winner), _by_floor_division(scores, winner))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=50))
def test_any_floats(values: list[float]) -> None:
    scores = np.array(values)
    winner = np.arange(len(values)) == 0
    assert np.array_equal(extender_scores(scores, winner), _by_floor_division(scores, winner))
