"""Series maths shared by the detectors: least-squares lines, segment slopes, drawdowns, runs.

Everything here takes numpy arrays of unix seconds and values, sorted by time, and returns plain
numbers; nothing knows where the series came from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class LineFit:
    """``value ≈ intercept + slope × (t − t0)``; ``r2`` is the coefficient of determination."""

    slope: float  # value units per second
    intercept: float  # fitted value at t0
    t0: float
    r2: float

    def at(self, t: float) -> float:
        return self.intercept + self.slope * (t - self.t0)

    def reaches(self, level: float) -> float | None:
        """The time the fitted line reaches ``level``; None when it never does going forward."""
        if self.slope <= 0:
            return None
        return self.t0 + (level - self.intercept) / self.slope


def fit_line(times: FloatArray, values: FloatArray) -> LineFit:
    """Ordinary least squares. Fewer than two points or no spread in time gives slope 0, r2 0."""
    n = len(times)
    if n < 2:
        return LineFit(0.0, float(values[0]) if n else 0.0, float(times[0]) if n else 0.0, 0.0)
    t0 = float(times[0])
    x = times - t0
    x_mean = float(x.mean())
    y_mean = float(values.mean())
    dx = x - x_mean
    dy = values - y_mean
    sxx = float(dx @ dx)
    if sxx == 0.0:
        return LineFit(0.0, y_mean, t0, 0.0)
    slope = float(dx @ dy) / sxx
    intercept = y_mean - slope * x_mean
    syy = float(dy @ dy)
    if syy == 0.0:
        r2 = 1.0  # a perfectly flat series is perfectly explained by a flat line
    else:
        residual = values - (intercept + slope * x)
        r2 = 1.0 - float(residual @ residual) / syy
    return LineFit(slope, intercept, t0, r2)


def segment_slopes(times: FloatArray, values: FloatArray, segments: int) -> FloatArray:
    """Least-squares slope of each of ``segments`` equal time slices (NaN where < 2 points)."""
    out = np.full(segments, np.nan)
    if len(times) < 2 or segments < 1:
        return out
    edges = np.linspace(times[0], times[-1], segments + 1)
    which = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, segments - 1)
    for i in range(segments):
        mask = which == i
        if int(mask.sum()) >= 2:
            out[i] = fit_line(times[mask], values[mask]).slope
    return out


def max_drawdown(values: FloatArray) -> float:
    """The largest fall from a running maximum to a later value (0 for a non-decreasing series)."""
    if len(values) == 0:
        return 0.0
    return float((np.maximum.accumulate(values) - values).max())


def trailing_run_start(times: FloatArray, condition: npt.NDArray[np.bool_]) -> float | None:
    """The time the trailing run of ``condition`` began; None when the last point fails it."""
    if len(times) == 0 or not bool(condition[-1]):
        return None
    failing = np.flatnonzero(~condition)
    first = int(failing[-1]) + 1 if len(failing) else 0
    return float(times[first])


def largest_gap(times: FloatArray, start: float, end: float) -> float:
    """The longest stretch of ``[start, end]`` with no sample (the whole span when empty)."""
    inside = times[(times >= start) & (times <= end)]
    if len(inside) == 0:
        return end - start
    edges = np.concatenate(([start], inside, [end]))
    return float(np.diff(edges).max())
