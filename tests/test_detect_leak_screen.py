"""The batched screen (``leak/screen.py``) and its row kernel against the per-series code.

``row_medians`` must give each row's ``median`` to the bit; ``cannot_leak`` may clear a series
only when ``assess_leak`` finds it not leaking, so ``detect_leaks`` reports the same findings
with the screen as without it.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.detect.series import (
    median,
    median_pairwise_slope,
    robust_noise,
    row_medians,
    row_pairwise_slopes,
    row_robust_noise,
)
from defrag.detectors.leak import core
from defrag.detectors.leak.core import GpuMemorySeries, LeakParams, assess_leak, detect_leaks
from defrag.detectors.leak.screen import cannot_leak

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
END = NOW.timestamp()
STEP = 300.0
# the points of a 6 h range query at a 5 min step, as Prometheus answers it (73 steps, the
# first one at the lookback's start, which assess_leak drops: t > start)
TIMES = END - STEP * np.arange(72, -1, -1, dtype=float)

cells = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf, 1.0, 2.0]),
)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 9).flatmap(
        lambda n: st.lists(st.lists(cells, min_size=n, max_size=n), min_size=1, max_size=6)
    )
)
def test_row_medians_are_median_of_each_row_to_the_bit(rows: list[list[float]]) -> None:
    """Widths 0–9 (odd, even, empty), NaN, ±inf and zeros of both signs."""
    matrix = np.array(rows, dtype=float).reshape(len(rows), -1)
    with np.errstate(all="ignore"):  # inf + −inf in the middle pair, in both
        got = row_medians(matrix)
        want = [repr(median(row)) for row in matrix]
    assert [repr(float(v)) for v in got] == want


@settings(max_examples=300, deadline=None)
@given(
    st.integers(3, 12).flatmap(
        lambda n: st.lists(
            st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=n, max_size=n),
            min_size=1,
            max_size=6,
        )
    )
)
def test_row_robust_noise_is_robust_noise_of_each_row_to_the_bit(rows: list[list[float]]) -> None:
    """The screen's noise per row (the bins: finite values, at least 3 of them)."""
    matrix = np.array(rows, dtype=float)
    got = row_robust_noise(matrix)
    assert [repr(float(v)) for v in got] == [repr(float(robust_noise(row))) for row in matrix]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 30).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(0, 24, allow_nan=False), min_size=n, max_size=n, unique=True),
            st.lists(st.lists(cells, min_size=n, max_size=n), min_size=0, max_size=5),
            st.integers(1, 4),
        )
    )
)
def test_row_pairwise_slopes_are_each_rows_slope_to_the_bit(
    case: tuple[list[float], list[list[float]], int],
) -> None:
    """0–30 points (widths differ from example to example), any chunk size, NaN and ±inf."""
    xs, rows, chunk = case
    x = np.sort(np.array(xs, dtype=float))
    matrix = np.array(rows, dtype=float).reshape(len(rows), len(x))
    with np.errstate(all="ignore"):  # inf − inf and overflowing quotients, in both
        got = row_pairwise_slopes(x, matrix, chunk=chunk)
        want = [repr(median_pairwise_slope(x, r)) for r in matrix]
    assert [repr(float(v)) for v in got] == want


def _series(values: np.ndarray, i: int, stale_s: float = 0.0) -> GpuMemorySeries:
    return GpuMemorySeries(
        node=f"node-{i // 8}",
        gpu=str(i % 8),
        times=TIMES.copy(),
        used_mib=values,
        total_mib=81920.0,
        pods=(f"ml/pod-{i}",),
        stale_s=stale_s,
    )


def _fleet(seed: int, count: int) -> list[GpuMemorySeries]:
    """Shapes the leak detector sees through Prometheus: flat, plateaus after a warm-up, slow
    and fast leaks, saw-tooth caches, steps, restarts to nothing, OOM kills, loads from nothing,
    a missing sample (NaN), a stale exporter; noise σ 0–800 MiB."""
    rng = np.random.default_rng(seed)
    h = (TIMES - TIMES[0]) / 3600.0
    out = []
    for i in range(count):
        base = float(rng.uniform(1000, 60000))
        noise = rng.normal(0, float(rng.choice([0, 50, 200, 800])), len(h))
        kind = i % 10
        if kind == 0:  # a leak, 100 MiB/h to 4 GiB/h
            v = base + float(rng.uniform(100, 4096)) * h
        elif kind == 1:  # a warm-up levelling off
            v = base * (1 - np.exp(-h / float(rng.uniform(0.3, 3))))
        elif kind == 2:  # a cache filled and freed
            v = base + 3000 * ((h * float(rng.uniform(0.5, 3))) % 1)
        elif kind == 3:  # one step
            v = base + np.where(h > float(rng.uniform(0, 6)), 8000.0, 0.0)
        elif kind == 4:  # a restart to nothing, then growth
            cut = int(rng.integers(1, 72))
            v = base + 500 * h
            v[cut : cut + 2] = 0.0
        elif kind == 5:  # grows to the GPU's memory and is killed
            v = np.minimum(70000 + 4000 * (h % 3), 81000.0)
            v[h % 3 > 2.9] = 1000.0
        elif kind == 6:  # loaded from nothing inside the lookback
            v = np.where(h > float(rng.uniform(0, 6)), base, 0.0)
        elif kind == 7:  # the last hour grows fast
            v = base + np.maximum(h - 5, 0) * float(rng.uniform(500, 6000))
        else:  # flat
            v = np.full(len(h), base)
        v = np.round(v + noise, int(rng.integers(0, 2)))
        if i % 17 == 0:
            v[int(rng.integers(0, 73))] = math.nan
        out.append(_series(v, i, stale_s=120.0 if i % 23 == 0 else 0.0))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_screen_clears_only_gpus_that_are_not_leaking(seed: int) -> None:
    fleet = _fleet(seed, 400)
    cleared = cannot_leak(fleet, LeakParams(), END)
    leaking = [assess_leak(s, LeakParams(), NOW).leaking for s in fleet]
    assert not any(c and lk for c, lk in zip(cleared, leaking, strict=True))
    # not vacuous: most quiet GPUs are cleared, and leaks are found among the rest
    assert sum(cleared) > 50
    assert sum(leaking) > 10
    # a series with a NaN, or from a stale exporter, is always assessed
    for s, c in zip(fleet, cleared, strict=True):
        if np.isnan(s.used_mib).any() or s.stale_s > 0:
            assert not c


@pytest.mark.parametrize("seed", [4, 5])
def test_detect_leaks_finds_the_same_with_the_screen(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = _fleet(seed, 300)
    with_screen = detect_leaks(fleet, LeakParams(), NOW)
    monkeypatch.setattr(core, "cannot_leak", lambda series, *_: [False] * len(series))
    without = detect_leaks(fleet, LeakParams(), NOW)
    assert len(with_screen) > 10
    assert [(f.subject, f.severity, f.summary, f.evidence, f.since) for f in with_screen] == [
        (f.subject, f.severity, f.summary, f.evidence, f.since) for f in without
    ]


def test_series_with_their_own_timestamps_are_assessed() -> None:
    """Only series sharing their timestamps with another are screened (rows of one matrix)."""
    flat = np.full(73, 20000.0)
    alone = _series(flat.copy(), 0)
    shifted = GpuMemorySeries("n", "1", TIMES - 30.0, flat.copy(), 81920.0)
    assert cannot_leak([alone, shifted], LeakParams(), END) == [False, False]
    assert cannot_leak([alone, _series(flat.copy(), 1)], LeakParams(), END) == [True, True]


def test_a_leak_after_a_restart_is_assessed() -> None:
    """60 GiB held for 3 h, a restart to 1,000 MiB, then 2,000 MiB/h for 3 h: over the whole
    lookback the Theil–Sen slope is negative (−9,682 MiB/h: most pairs straddle the fall), but
    ``assess_leak`` judges what follows the restart only, and finds the leak; the screen must
    leave it to it."""
    h = (TIMES - TIMES[0]) / 3600.0
    restarted = np.where(h < 3, 60000.0, 1000 + 2000 * (h - 3))
    fleet = [_series(restarted, 0), _series(np.full(73, 20000.0), 1)]
    assert assess_leak(fleet[0], LeakParams(), NOW).leaking
    assert cannot_leak(fleet, LeakParams(), END) == [False, True]
