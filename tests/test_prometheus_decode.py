"""A Prometheus matrix decoded straight into arrays holds what the tuple of pairs held.

Prometheus writes a matrix result as ``{"metric": {...}, "values": [[<unix time>, "<value>"],
...]}`` with every sample value a string (prometheus/prometheus docs/querying/api.md, "Range
vectors"; "NaN", "+Inf" and "-Inf" spelt as Go's strconv.FormatFloat writes them, the format's
section "Expression query result formats"). The decode must give each point ``float(t),
float(v)``, exactly as the per-sample tuples did.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from defrag.adapters.prometheus import _to_samples
from defrag.ports import Sample, SeriesPoints

# (values as Prometheus sends them, what float() makes of them)
MATRIX_CASES = [
    ([[1700000000, "1"], [1700000030.5, "2.5"]], [(1700000000.0, 1.0), (1700000030.5, 2.5)]),
    (
        [[1.0, "NaN"], [2.0, "+Inf"], [3.0, "-Inf"]],
        [(1.0, math.nan), (2.0, math.inf), (3.0, -math.inf)],
    ),
    ([[1.0, "1e-400"], [2.0, "-0"], [3.0, "0.1"]], [(1.0, 0.0), (2.0, -0.0), (3.0, 0.1)]),
    ([[1.0, "123456789.123456789"]], [(1.0, 123456789.123456789)]),
    ([], []),
]


def _bits(pairs: object) -> list[tuple[str, str]]:
    """Each number by its exact bits (NaN equal to NaN, −0.0 apart from 0.0)."""
    return [(float(t).hex(), float(v).hex()) for t, v in pairs]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("values", "want"), MATRIX_CASES)
def test_matrix_values_decode_as_float_of_each(
    values: list[list[object]], want: list[tuple[float, float]]
) -> None:
    [sample] = _to_samples([{"metric": {"gpu": "0"}, "values": values}])
    assert isinstance(sample.points, SeriesPoints)
    assert _bits(sample.points) == _bits(want)
    # the tuples the decode made before, from the same JSON
    assert _bits(sample.points) == _bits((float(t), float(v)) for t, v in values)  # type: ignore[arg-type]
    assert np.asarray(sample.points, dtype=float).shape == (len(want), 2)


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ([[1.0, "1", "extra"]], ValueError),  # not a pair: refused, as unpacking it refused
        ([[1.0]], ValueError),
        ([5], TypeError),  # a point that is not a list
        ([[1.0, "one"]], ValueError),  # not a number
        ([[1.0, None]], TypeError),
    ],
)
def test_matrix_points_of_the_wrong_shape_are_refused(values: list[object], error: type) -> None:
    with pytest.raises(error):
        _to_samples([{"metric": {}, "values": values}])


def test_series_points_read_as_the_tuple_they_stand_for() -> None:
    pairs = ((1.0, 10.0), (2.0, 20.0), (3.0, 30.0))
    points = SeriesPoints(np.array(pairs))
    assert points == pairs and pairs == points  # both ways round: Sample equality
    assert Sample({"a": "b"}, points) == Sample({"a": "b"}, pairs)
    assert hash(points) == hash(pairs)
    assert (len(points), points[-1], points[0][1], points[1:]) == (3, (3.0, 30.0), 10.0, pairs[1:])
    assert list(points) == list(pairs)
    assert Sample({}, points).last == 30.0
    assert not SeriesPoints(np.empty((0, 2)))  # empty reads as false, as () did
    held = np.asarray(points, dtype=float)
    assert held is np.asarray(points)  # no copy on the way into the detectors
    with pytest.raises(ValueError):
        held[0, 0] = 5.0  # read-only: a Sample stays frozen
