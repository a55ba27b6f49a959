"""The stop tests' answers kept for the leaks' second judging (``assess_leak``'s ``seen``)
change no verdict: every assessment with them — the first, which fills them, and the next, on
the same bins with raw samples added — is the one made without them, to the bit."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np

from bench.leak_corpus import LEAK_FAMILIES, NON_LEAK_FAMILIES, corpus
from defrag.detect.series import Binned
from defrag.detectors.leak.core import (
    GpuMemorySeries,
    LeakAssessment,
    LeakParams,
    StopsSeen,
    _stops_on_bins,
    assess_leak,
)

PARAMS = LeakParams(query="DCGM_FI_DEV_FB_USED")


def same(a: LeakAssessment, b: LeakAssessment) -> bool:
    return repr((a.leaking, a.reasons, a.slope_mib_per_h, a.exhaust_at, a.evidence)) == repr(
        (b.leaking, b.reasons, b.slope_mib_per_h, b.exhaust_at, b.evidence)
    )


def test_kept_stop_answers_change_no_assessment() -> None:
    cases = corpus(seed=3, per_cell=1, noises=(0.0, 400.0), rates=(512.0, 2048.0))
    assert {re.sub(r"-s\d+(-r\d+)?-\d+$", "", c.name) for c in cases} == set(
        LEAK_FAMILIES + NON_LEAK_FAMILIES
    )
    rng = np.random.default_rng(2)
    seen: StopsSeen = {}
    leaking = stopped = 0
    series = [c.series for c in cases]
    series += [flattened(s, 3600.0) for s in series[:20]]  # growth that stopped an hour ago
    for s in series:
        for back in (0.0, 1800.0, 5400.0):
            now = datetime.fromtimestamp(float(s.times[-1]) - back, UTC)
            first = assess_leak(s, PARAMS, now, seen)
            assert same(first, assess_leak(s, PARAMS, now))
            # again with raw samples (the second judging): the same bins, other samples
            raw = (s.times, s.used_mib + rng.normal(0.0, 50.0, len(s.times)))
            with_raw = replace(s, raw=raw)
            assert same(
                assess_leak(with_raw, PARAMS, now, seen), assess_leak(with_raw, PARAMS, now)
            )
            leaking += first.leaking
            stopped += "flat_since" in first.evidence
    assert seen  # the would-be leaks' answers were kept …
    assert leaking > 10 and stopped > 0  # … and both kinds of answer were read back


def flattened(s: GpuMemorySeries, last_s: float) -> GpuMemorySeries:
    """``s`` with its last ``last_s`` held at the level it had then."""
    flat = s.used_mib.copy()
    tail = np.flatnonzero(s.times > s.times[-1] - last_s)
    flat[tail] = flat[tail[0]]
    return replace(s, used_mib=flat)


def test_other_bins_or_settings_are_not_answered_from_what_is_kept() -> None:
    case = corpus(seed=3, per_cell=1, families=("linear",), noises=(200.0,), rates=(1024.0,))[0]
    s = case.series
    now = datetime.fromtimestamp(float(s.times[-1]), UTC)
    seen: StopsSeen = {}
    assert assess_leak(s, PARAMS, now, seen).leaking
    kept = dict(seen)
    # the same series, its last hour flat: growth stopped (the kept answer would say it goes on)
    stalled = flattened(s, 3600.0)
    assert same(assess_leak(stalled, PARAMS, now, seen), assess_leak(stalled, PARAMS, now))
    other = replace(PARAMS, flat_for_s=1200.0)
    assert same(assess_leak(s, other, now, seen), assess_leak(s, other, now))
    assert len(seen) > len(kept)  # each was judged afresh and kept beside the first


def test_an_answer_is_kept_for_its_own_bins_and_figures_only() -> None:
    """Called directly with the same figures: bins that differ in their values, their times,
    or figures that differ in one bit are each answered afresh."""
    times = 1_772_452_800.0 - 300.0 * np.arange(72)[::-1] - 150.0
    hours = (times - times[0]) / 3600.0
    growing = Binned(times, 8000.0 + 900.0 * hours, 300.0)
    stopped = Binned(times, 8000.0 + 900.0 * np.minimum(hours, hours[-13]), 300.0)
    later = Binned(times + 300.0, growing.values, 300.0)
    seen: StopsSeen = {}
    figures = (900.0, 20.0, 1.5, PARAMS)
    assert _stops_on_bins(growing, *figures, seen)[1] is None
    for bins in (stopped, later, growing):
        for slope in (900.0, np.nextafter(900.0, 0.0)):
            want = _stops_on_bins(bins, slope, 20.0, 1.5, PARAMS)
            assert repr(_stops_on_bins(bins, slope, 20.0, 1.5, PARAMS, seen)) == repr(want)
    assert _stops_on_bins(stopped, *figures)[1] is not None
    assert len(seen) == 6
