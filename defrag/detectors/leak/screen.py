"""A batched screen of the GPUs that cannot be leaking, so :func:`~.core.assess_leak` runs only
on the rest.

Most GPUs of a fleet do not grow, and their verdict is reached on the commonest path of
``assess_leak``: no restart, no load from nothing, the lookback judged on the bins (no cache
freed) and its Theil–Sen slope below the minimum, each short window's quick slope below its
own. Through Prometheus every series of a range query shares the same timestamps (one point per
step), so those steps are computed here for all such series at once, as rows of one matrix, by
the same arithmetic (each row's values are bit for bit the per-series ones: the same IEEE
operations on the same numbers, the same partition for each median; a slope's comparison
with its minimum by counting the pairwise slopes below it, which decides as the median does).
A series the screen cannot clear — other timestamps, a NaN, a restart, a load, a cache freed, a
slope at or above a minimum, a stale exporter — goes to ``assess_leak`` as before. Only
verdicts of *not leaking* are skipped, and ``detect_leaks`` reports leaking verdicts only: the
findings are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from defrag.detect.series import (
    FloatArray,
    point_pairs,
    row_medians,
    row_pairwise_slopes,
    row_robust_noise,
)
from defrag.model.arrays import BoolArray

HOUR_S = 3600.0


class Screened(Protocol):
    """What the screen reads of a ``GpuMemorySeries`` (``core`` imports this module)."""

    @property
    def times(self) -> FloatArray: ...
    @property
    def used_mib(self) -> FloatArray: ...
    @property
    def stale_s(self) -> float: ...


class ScreenParams(Protocol):
    """What the screen reads of ``LeakParams``."""

    @property
    def lookback_s(self) -> float: ...
    @property
    def bin_s(self) -> float: ...
    @property
    def cycle_noise(self) -> float: ...
    @property
    def min_slope_mib_per_h(self) -> float: ...
    @property
    def short_min_slope_mib_per_h(self) -> float: ...
    @property
    def short_window_s(self) -> float: ...
    @property
    def fast_window_s(self) -> float: ...
    @property
    def fast_min_slope_mib_per_h(self) -> float: ...


def cannot_leak(series: Sequence[Screened], params: ScreenParams, end: float) -> list[bool]:
    """For each series, True when ``assess_leak`` would certainly find it not leaking at
    ``end`` (the screen's path, above); False when it must be assessed."""
    out = [False] * len(series)
    groups: dict[bytes, list[int]] = {}
    for i, one in enumerate(series):
        if one.stale_s <= 0 and one.times.dtype == np.float64 and one.used_mib.dtype == np.float64:
            groups.setdefault(one.times.tobytes(), []).append(i)
    for rows in groups.values():
        if len(rows) < 2:
            continue  # nothing to share: assessed alone
        times = series[rows[0]].times
        values = np.stack([series[i].used_mib for i in rows])
        for i, cleared in zip(rows, _screen(times, values, params, end), strict=True):
            out[i] = bool(cleared)
    return out


def _screen(times: FloatArray, used: FloatArray, params: ScreenParams, end: float) -> BoolArray:
    """The screen over rows of ``used`` sharing ``times`` (``assess_leak``'s steps, by line)."""
    n = len(used)
    no = np.zeros(n, dtype=bool)
    start = end - params.lookback_s
    inside = (times > start) & (times <= end)
    t = times[inside]
    y = used[:, inside]
    finite = np.isfinite(y).all(axis=1)  # a NaN drops a sample from its row alone: assessed
    if len(t) < 3:
        return no
    # bin_medians: one sample per bin (the timestamps are the steps) → the bins are the values
    k = np.floor((end - t) / params.bin_s).astype(np.int64)
    if bool((k[1:] >= k[:-1]).any()):
        return no  # not one sample per bin in time order (k falls strictly as t rises)
    centres = end - (k.astype(float) + 0.5) * params.bin_s
    bins = y  # ``values.astype(float)``: float64 rows, the same numbers
    noise = row_robust_noise(bins)
    level = row_medians(bins[:, -3:])
    loaded = ((bins <= 0.1 * level[:, None]).any(axis=1)) & ~(level <= 0)
    candidate = finite & ~loaded
    # the lookback (all of it inside: ``bins.times > end − lookback``), judged on the bins when
    # no fall exceeds ``cycle_noise`` × noise (else on the floor: assessed). A restart is such
    # a fall (``_restarts``: peak − value > max(``cycle_noise`` × noise, 0)), so a row without
    # one has not restarted either: the bins are the ones ``assess_leak`` judges
    drawdown = (np.maximum.accumulate(bins, axis=1) - bins).max(axis=1)
    candidate &= ~(drawdown > params.cycle_noise * noise)
    candidate &= bool((centres > end - params.lookback_s).all())
    full_x = (centres - centres[0]) / HOUR_S
    windows = [
        (w, slope)
        for w, slope in (
            (params.short_window_s, params.short_min_slope_mib_per_h),
            (params.fast_window_s, params.fast_min_slope_mib_per_h),
        )
        if not (w <= 0 or w >= params.lookback_s or (t[-1] - t[0]) < 0.9 * w)
    ]  # the others are skipped by ``assess_leak`` whatever the values
    rows = np.flatnonzero(candidate)
    kept = bins[rows]
    cleared = slope_below(full_x, kept, params.min_slope_mib_per_h)
    for window, need in windows:
        inside = centres > end - window  # a short window's first test in ``_judge``
        x = centres[inside]
        if len(x) >= 2:  # else too few bins: not leaking there either
            cleared &= slope_below((x - x[0]) / HOUR_S, kept[:, inside], need, chunk=128)
    out = np.zeros(n, dtype=bool)
    out[rows] = cleared
    return out


def slope_below(x: FloatArray, rows: FloatArray, limit: float, chunk: int = 32) -> BoolArray:
    """``row_pairwise_slopes(x, rows, chunk) < limit``, to the bit, without the medians where
    counting decides: of the N pairwise slopes of a row, the median (the middle one, or the
    two middle ones' mean) lies below ``limit`` when more than half lie below it, and not when
    fewer than half do (the mean of two values lies between them, in floating point too); a
    row where exactly half do, or whose values are not all finite (a slope could be NaN),
    gets its median."""
    n = rows.shape[0]
    if len(x) < 2 or n == 0 or not np.isfinite(limit):
        return row_pairwise_slopes(x, rows, chunk) < limit
    if not bool((x[1:] > x[:-1]).all()):
        raise ValueError("slope_below: x must strictly increase")
    i, j = point_pairs(len(x))
    dx = x[j] - x[i]
    pairs = len(dx)
    below = np.empty(n, dtype=np.int64)
    for s in range(0, n, chunk):
        slopes = (rows[s : s + chunk, j] - rows[s : s + chunk, i]) / dx
        below[s : s + chunk] = np.count_nonzero(slopes < limit, axis=1)
    out = below > pairs // 2  # the middle one (odd N), both middle ones (even N) below
    unsure = ~np.isfinite(rows).all(axis=1)
    if pairs % 2 == 0:
        unsure |= below == pairs // 2  # the lower middle one below, the upper one not
    if bool(unsure.any()):
        out[unsure] = row_pairwise_slopes(x, rows[unsure], chunk) < limit
    return out
