"""Series maths shared by the detectors: least-squares lines, segment slopes, drawdowns, runs.

Everything here takes numpy arrays of unix seconds and values, sorted by time, and returns plain
numbers; nothing knows where the series came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

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


# --- robust statistics for noisy memory series ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Binned:
    """A series reduced to one robust value per fixed-width bin: the bins end at ``end``; bins
    without a sample are dropped. ``times`` are bin centres."""

    times: FloatArray
    values: FloatArray
    width: float


def bin_medians(times: FloatArray, values: FloatArray, width: float, end: float) -> Binned:
    """The median of each ``width``-second bin of ``(end − k·width, end − (k−1)·width]``.

    Vectorised: the samples are laid out in a (bins × most samples in a bin) array padded with
    NaN and reduced with ``nanmedian`` along rows, so thousands of series stay cheap.
    """
    if len(times) == 0:
        return Binned(np.empty(0), np.empty(0), width)
    k = np.floor((end - times) / width).astype(np.int64)  # 0 = the bin ending at ``end``
    starts = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))  # times are sorted
    counts = np.diff(np.append(starts, len(k)))
    bins = k[starts]
    if int(counts.max()) == 1:
        medians = values.astype(float)
    else:
        pos = np.arange(len(values)) - np.repeat(starts, counts)
        grid = np.full((len(bins), int(counts.max())), np.nan)
        grid[np.repeat(np.arange(len(bins)), counts), pos] = values
        medians = np.nanmedian(grid, axis=1)
    centres = end - (bins.astype(float) + 0.5) * width
    return Binned(centres, medians, width)


def rolling_floor(binned: Binned, window: float) -> Binned:
    """The minimum of every full ``window`` of bins (a trailing run of ⌈window / width⌉ bins on
    the bin grid, gaps counted as missing), placed at the window's centre.

    An allocator cache that is freed and refilled within ``window`` leaves the floor flat; the
    floor of a leak rises with it. Windows with fewer than half their bins present are dropped.
    Returns the series itself when it spans less than two windows.
    """
    n = max(round(window / binned.width), 1)
    if n <= 1 or len(binned.times) == 0:
        return binned
    w = binned.width
    idx = np.round((binned.times - binned.times[0]) / w).astype(np.int64)
    size = int(idx[-1]) + 1
    if size < 2 * n:
        return binned
    grid = np.full(size, np.nan)
    grid[idx] = binned.values
    # sliding_window_view(grid, n), built directly (its checks cost more than the minimum)
    step = grid.strides[0]
    windows = np.ndarray((size - n + 1, n), grid.dtype, grid, strides=(step, step))
    missing = np.isnan(windows)
    present = np.sum(~missing, axis=1)
    keep = present * 2 >= n
    filled = np.where(missing, np.inf, windows)
    floor = filled.min(axis=1)
    centres = binned.times[0] + (np.arange(len(floor)) + (n - 1) / 2) * w
    return Binned(centres[keep], floor[keep], w)


def robust_noise(values: FloatArray) -> float:
    """The noise standard deviation from successive differences (MAD-based, scaled for a normal
    distribution): a trend, a step or a rare drop barely move it."""
    if len(values) < 3:
        return 0.0
    d = np.diff(values)
    mad = _median_of(np.abs(d - median(d)))
    return 1.4826 * mad / np.sqrt(2.0)


def row_robust_noise(rows: FloatArray) -> FloatArray:
    """:func:`robust_noise` of each row of a 2-D array of at least 3 columns, to the bit (the
    same differences, :func:`row_medians` for each median)."""
    d = np.diff(rows, axis=1)
    mad = row_medians(np.abs(d - row_medians(d)[:, None]))
    return 1.4826 * mad / np.sqrt(2.0)


def median(values: FloatArray) -> float:
    """``float(np.median(values))`` of a 1-D array, to the bit, without its per-call overhead
    (tens of thousands of calls per detection): the same partition (the middle element(s) and
    the last, where a NaN would go), then the mean of the middle element(s) as ``np.mean``
    sums them — from +0.0, so a median of −0.0 is 0.0 — and NaN when any value is NaN."""
    return _median_of(np.array(values, copy=True))


def _median_of(part: FloatArray) -> float:
    """:func:`median` of a 1-D array this call may reorder (a temporary): the partition
    is done in place, without ``np.partition``'s wrapper and copy (what that function does
    inside: ``a.copy().partition(kth)``)."""
    n = len(part)
    if n == 0:
        return math.nan
    half = n // 2
    if n % 2:
        part.partition((half, n - 1))
        middle = 0.0 + float(part[half])
    else:
        part.partition((half - 1, half, n - 1))
        middle = (0.0 + float(part[half - 1]) + float(part[half])) / 2.0
    return math.nan if math.isnan(part[-1]) else middle


def row_medians(rows: FloatArray) -> FloatArray:
    """:func:`median` of each row of a 2-D array, to the bit: the same partition per row (the
    middle element(s) and the last), the same sum of the middle ones from +0.0, NaN for a row
    holding a NaN."""
    n = rows.shape[1]
    if n == 0:
        return np.full(rows.shape[0], math.nan)
    half = n // 2
    if n % 2:
        part = np.partition(rows, (half, n - 1), axis=1)
        middle = 0.0 + part[:, half]
    else:
        part = np.partition(rows, (half - 1, half, n - 1), axis=1)
        middle = (0.0 + part[:, half - 1] + part[:, half]) / 2.0
    return np.where(np.isnan(part[:, -1]), math.nan, middle)


@lru_cache(maxsize=64)
def point_pairs(n: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """``np.triu_indices(n, 1)``, built once per length (read-only: shared between calls)."""
    i, j = np.triu_indices(n, 1)
    i.flags.writeable = False
    j.flags.writeable = False
    return i, j


def _pairwise(x: FloatArray, y: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(Δy, Δx) of every pair of points with distinct ``x`` (later minus earlier), in
    ``np.triu_indices`` order; when ``x`` strictly increases no pair needs to be dropped."""
    i, j = point_pairs(len(x))
    dx = x[j] - x[i]
    dy = y[j] - y[i]
    if bool((x[1:] > x[:-1]).all()):
        return dy, dx
    keep = dx > 0
    return dy[keep], dx[keep]


def median_pairwise_slope(x: FloatArray, y: FloatArray) -> float:
    """The Theil–Sen slope: the median of the slopes between every pair of points with distinct
    ``x`` — what ``scipy.stats.theilslopes`` returns as its slope, without its confidence
    interval and per-call overhead (a screen for thousands of series)."""
    if len(x) < 2:
        return 0.0
    dy, dx = _pairwise(x, y)
    if len(dx) == 0:
        return 0.0
    return _median_of(dy / dx)


class PrefixSlopes:
    """:func:`median_pairwise_slope` of every prefix of one series (``x[:m]``, ``y[:m]``), to
    the bit, from one table: the slopes of every pair, ordered by the later point, so a
    prefix's pairs are the table's first m(m − 1)/2 — the same differences and quotients,
    element by element, and the same median of them. Where ``x`` does not strictly increase
    (pairs would be dropped), each prefix is computed by :func:`median_pairwise_slope`."""

    def __init__(self, x: FloatArray, y: FloatArray) -> None:
        self.x, self.y = x, y
        self.table: FloatArray | None = None
        if len(x) >= 2 and bool((x[1:] > x[:-1]).all()):
            later, earlier = _pairs_by_later(len(x))
            self.table = (y[later] - y[earlier]) / (x[later] - x[earlier])

    def median(self, m: int) -> float:
        """``median_pairwise_slope(x[:m], y[:m])``."""
        if self.table is None or not 2 <= m <= len(self.x):
            return median_pairwise_slope(self.x[:m], self.y[:m])
        return _median_of(self.table[: m * (m - 1) // 2].copy())


@lru_cache(maxsize=64)
def _pairs_by_later(n: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Every pair (later, earlier) of ``n`` points, by the later point, then the earlier
    (``np.tril_indices(n, -1)``; read-only: shared between calls)."""
    later, earlier = np.tril_indices(n, -1)
    later.flags.writeable = False
    earlier.flags.writeable = False
    return later, earlier


def row_pairwise_slopes(x: FloatArray, rows: FloatArray, chunk: int = 32) -> FloatArray:
    """:func:`median_pairwise_slope` of each row of ``rows`` against ``x`` (shared, strictly
    increasing), to the bit: the same differences and quotients, element by element, and
    :func:`row_medians` of them; ``chunk`` rows at a time (the pairs of 72 points are 2,556 a
    row: small blocks stay in cache)."""
    if len(x) < 2:
        return np.zeros(rows.shape[0])
    if not bool((x[1:] > x[:-1]).all()):
        raise ValueError("row_pairwise_slopes: x must strictly increase")
    i, j = point_pairs(len(x))
    dx = x[j] - x[i]
    parts = [
        row_medians((rows[s : s + chunk, j] - rows[s : s + chunk, i]) / dx)
        for s in range(0, rows.shape[0], chunk)
    ]
    return np.concatenate(parts) if parts else np.empty(0)


def rolling_mean(binned: Binned, window: float) -> Binned:
    """The mean of every run of ⌈window / width⌉ consecutive points, at the run's centre time.

    Over a floor (a staircase: the same trough is the minimum until it leaves the window) a mean
    over at least one cache cycle turns the stairs back into the line they follow. Returns the
    series itself when it holds fewer than two windows.
    """
    n = max(round(window / binned.width), 1)
    if n <= 1 or len(binned.values) < 2 * n:
        return binned
    kernel = np.full(n, 1.0 / n)
    values = np.convolve(binned.values, kernel, mode="valid")
    times = np.convolve(binned.times, kernel, mode="valid")
    return Binned(times, values, binned.width)


# --- trend tests under serially correlated noise ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Trend:
    """Sen's slope of ``y`` against ``x`` with its interval, and the modified Mann–Kendall test
    of a rising trend (Hamed & Rao 1998): the variance of Kendall's S is multiplied by
    ``variance_ratio`` (n / n*, the effective sample size's correction from the significant
    autocorrelations of the detrended ranks, never below 1)."""

    slope: float
    low: float
    high: float
    tau: float
    p_rising: float
    variance_ratio: float


_Z_975 = 1.959963984540054


def sen_trend(
    x: FloatArray, y: FloatArray, z: float = _Z_975, variance_ratio: float | None = None
) -> Trend:
    """Sen's slope of ``y`` against ``x`` (distinct ``x``, at least 3 points) with the two-sided
    interval at normal quantile ``z`` (``z`` 1.96: 95%), both from the autocorrelation-corrected
    variance of Kendall's S, and the one-sided p-value of a rising trend.

    Sen (1968): the interval's ends are the slopes of rank (N − C)/2 and (N + C)/2 among the N
    pairwise slopes, C = z √Var(S). Hamed & Rao (1998): Var(S) = n(n−1)(2n+5)/18 × n/n*, with
    n/n* = 1 + 2 / (n(n−1)(n−2)) Σ_k (n−k)(n−k−1)(n−k−2) ρ_k over the lags whose rank
    autocorrelation ρ_k of the detrended series is significant at 5% (|ρ_k| > 1.96 / √n).
    ``variance_ratio`` given (one estimated on a longer stretch of the same series) is used
    instead of estimating it from these few points.
    """
    n = len(x)
    if n < 3:
        return Trend(0.0, -np.inf, np.inf, 0.0, 1.0, 1.0)
    dy, dx = _pairwise(x, y)
    slopes = np.sort(dy / dx)
    m = len(slopes)
    if m == 0:
        return Trend(0.0, -np.inf, np.inf, 0.0, 1.0, 1.0)
    slope = median(slopes)  # of the sorted array, as before: the same sign of a zero slope
    s = float(np.sign(dy).sum())
    ratio = variance_ratio if variance_ratio is not None else _variance_ratio(y - slope * x)
    var_s = n * (n - 1) * (2 * n + 5) / 18.0 * ratio
    root = float(np.sqrt(var_s))
    zs = (s - np.sign(s)) / root if root > 0 else 0.0
    p = float(0.5 * math.erfc(zs / math.sqrt(2.0)))
    c = z * root
    lo_rank = (m - c) / 2.0
    hi_rank = (m + c) / 2.0
    low = float(slopes[min(max(math.floor(lo_rank), 0), m - 1)]) if lo_rank >= 0 else -np.inf
    high = float(slopes[min(max(math.ceil(hi_rank), 0), m - 1)]) if hi_rank <= m - 1 else np.inf
    tau = s / (n * (n - 1) / 2.0)
    return Trend(slope, low, high, float(tau), p, ratio)


def _variance_ratio(residuals: FloatArray) -> float:
    """Hamed & Rao's n / n* from the ranks of the detrended series (at least 1)."""
    n = len(residuals)
    if n < 4:
        return 1.0
    ranks = np.argsort(np.argsort(residuals)).astype(float)
    r = ranks - ranks.mean()
    denom = float(r @ r)
    if denom == 0.0:
        return 1.0
    acf = np.correlate(r, r, mode="full")[n:] / denom  # lags 1 .. n−1
    k = np.arange(1, n)
    significant = np.abs(acf) > _Z_975 / np.sqrt(n)
    weights = (n - k) * (n - k - 1) * (n - k - 2)
    ratio = 1.0 + 2.0 / (n * (n - 1) * (n - 2)) * float((weights * acf * significant).sum())
    return max(ratio, 1.0)
