"""The idle gate: every sample of the last ``for`` below the threshold, and no gap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from defrag.detectors.idle.core import IdleParams, assess_idle, detect_idle

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
PARAMS = IdleParams(query="avg(DCGM_FI_DEV_GPU_UTIL)", threshold_pct=20, for_s=1800, max_gap_s=300)


def curve(values_by_minute: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """One sample a minute, the last one at NOW."""
    n = len(values_by_minute)
    times = NOW.timestamp() - 60.0 * np.arange(n - 1, -1, -1)
    return times, np.array(values_by_minute, dtype=float)


@pytest.mark.parametrize(
    ("values", "idle", "reason"),
    [
        ([50.0] * 30 + [5.0] * 31, True, ""),  # busy an hour ago, quiet for the last 30 min
        ([5.0] * 60 + [25.0], False, "reached 25.0%"),  # a burst in the last sample
        ([5.0] * 20, False, "missing"),  # only 19 minutes of data: 11 min gap at the start
        ([19.9] * 61, True, ""),  # just below the threshold
        ([20.0] * 61, False, "reached 20.0%"),  # equal is not below
    ],
)
def test_idle_cases(values: list[float], idle: bool, reason: str) -> None:
    t, v = curve(values)
    status = assess_idle(t, v, PARAMS, NOW)
    assert status.idle is idle
    if reason:
        assert any(reason in r for r in status.reasons), status.reasons


def test_gap_in_the_middle_is_not_idle() -> None:
    t, v = curve([5.0] * 61)
    keep = (t < NOW.timestamp() - 1200) | (t > NOW.timestamp() - 600)  # 10 minutes missing
    status = assess_idle(t[keep], v[keep], PARAMS, NOW)
    assert not status.idle
    # last sample kept at NOW-1260 s, next at NOW-540 s: a 720 s gap
    assert "missing for 720 s" in status.reasons[0]


def test_finding_reports_since_the_start_of_the_quiet_run() -> None:
    t, v = curve([50.0] * 30 + [5.0] * 45)  # quiet for the last 45 samples = 44 minutes
    [finding] = detect_idle(t, v, PARAMS, NOW)
    assert finding.kind == "idle" and finding.subject == "cluster"
    assert finding.since == NOW - timedelta(minutes=44)
    assert finding.evidence["mean_pct"] == 5.0
    assert finding.action == "repack"


def test_no_samples_is_not_idle() -> None:
    status = assess_idle(np.array([]), np.array([]), PARAMS, NOW)
    assert not status.idle and "no utilisation samples" in status.reasons[0]
