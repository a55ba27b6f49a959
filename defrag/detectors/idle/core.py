"""Idle detection: cluster GPU utilisation below a threshold for a duration.

This is the gate execution windows may require (docs/daemon.md): repacking only disturbs a cluster
that is not busy. The series is one utilisation curve in percent (by default the mean DCGM
``DCGM_FI_DEV_GPU_UTIL`` across GPUs); it is idle when every sample of the last ``for_s`` seconds
is below ``threshold_pct`` and no gap in the samples is longer than ``max_gap_s`` (missing data is
never taken for idleness).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import numpy as np
from annotated_types import Gt, Le

from defrag.detect.findings import Finding, Severity
from defrag.detect.series import FloatArray, largest_gap, trailing_run_start
from defrag.detect.settings import INTERNAL, Action, RuleName, Seconds


@dataclass(frozen=True, slots=True)
class IdleParams:
    """The idle detector's settings (rule-file names and meaning: docs/rules.md)."""

    name: Annotated[str, INTERNAL] = "cluster-idle"
    severity: Severity = "info"
    action: Action = "repack"
    query: Annotated[str, INTERNAL] = ""
    """The rule's ``query`` (for the evidence)."""
    threshold_pct: Annotated[float, Gt(0), Le(100)] = 20.0
    for_s: Annotated[Seconds, RuleName("for")] = 1800.0
    step_s: Annotated[Seconds, RuleName("step")] = 60.0
    max_gap_s: Annotated[Seconds, RuleName("max_gap")] = 300.0


@dataclass(frozen=True, slots=True)
class IdleStatus:
    """Idle or not, with the reasons it is not and since when it is."""

    idle: bool
    reasons: tuple[str, ...]
    since: datetime | None = None
    mean_pct: float | None = None
    max_pct: float | None = None


def assess_idle(
    times: FloatArray, values: FloatArray, params: IdleParams, now: datetime
) -> IdleStatus:
    end = now.timestamp()
    start = end - params.for_s
    window = (times >= start) & (times <= end) & np.isfinite(values)
    t, v = times[window], values[window]
    if len(t) == 0:
        return IdleStatus(False, (f"no utilisation samples in the last {params.for_s:g} s",))
    mean, peak = float(v.mean()), float(v.max())
    reasons = []
    gap = largest_gap(t, start, end)
    if gap > params.max_gap_s:
        reasons.append(f"samples missing for {gap:.0f} s (more than {params.max_gap_s:g} s)")
    if peak >= params.threshold_pct:
        reasons.append(f"utilisation reached {peak:.1f}% (threshold {params.threshold_pct:g}%)")
    if reasons:
        return IdleStatus(False, tuple(reasons), None, mean, peak)
    ok = np.isfinite(values) & (values < params.threshold_pct) & (times <= end)
    began = trailing_run_start(times[times <= end], ok[times <= end])
    since = datetime.fromtimestamp(began if began is not None else float(t[0]), UTC)
    return IdleStatus(True, (), since, mean, peak)


def detect_idle(
    times: FloatArray, values: FloatArray, params: IdleParams, now: datetime
) -> list[Finding]:
    status = assess_idle(times, values, params, now)
    if not status.idle:
        return []
    assert status.since is not None and status.mean_pct is not None
    minutes = (now - status.since).total_seconds() / 60
    return [
        Finding(
            kind="idle",
            subject="cluster",
            severity=params.severity,
            summary=(
                f"cluster GPU utilisation below {params.threshold_pct:g}% for {minutes:.0f} min "
                f"(mean {status.mean_pct:.1f}%)"
            ),
            evidence={
                "query": params.query,
                "threshold_pct": params.threshold_pct,
                "for_s": params.for_s,
                "mean_pct": round(status.mean_pct, 2),
                "max_pct": round(status.max_pct or 0.0, 2),
            },
            since=status.since,
            labels={"detector": "idle", "rule": params.name},
            action=params.action,
        )
    ]
