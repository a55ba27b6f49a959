"""GPU memory leak detection: steady growth of a GPU's used memory, heading for exhaustion.

A GPU is *leaking* when, over the lookback, its used memory

* grows faster than ``min_slope_mib_per_h`` on a least-squares line with ``r2 ≥ min_r2``;
* grows in most time slices (``min_rising_fraction`` of ``segments`` slices rise at least half
  the minimum slope) — a plateau after model loading or a single step rises in one slice only;
* never falls back by more than ``max_drawdown_fraction`` of its fitted growth — a sawtooth
  (allocator caches freed and refilled) falls back by its whole amplitude;
* and the line reaches the GPU's total memory within ``horizon_s``.

A leaking GPU held by exactly one pod is that pod's finding; a GPU shared by several pods (or
held by none that DCGM names) is reported as unattributable rather than guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from defrag.detect.findings import Finding, Severity
from defrag.detect.series import FloatArray, LineFit, fit_line, max_drawdown, segment_slopes

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class LeakParams:
    name: str = "gpu-memory-leak"
    severity: Severity = "warning"
    action: str = "alert"
    query: str = ""
    lookback_s: float = 6 * HOUR_S
    min_slope_mib_per_h: float = 256.0
    min_r2: float = 0.9
    horizon_s: float = 48 * HOUR_S
    critical_within_s: float | None = None
    segments: int = 6
    min_rising_fraction: float = 0.8
    max_drawdown_fraction: float = 0.1
    min_coverage: float = 0.5


@dataclass(frozen=True, slots=True)
class DcgmLabels:
    """DCGM exporter label names; each pod field lists the names to try, in order."""

    node: tuple[str, ...] = ("Hostname", "node", "kubernetes_node")
    gpu: str = "gpu"
    uuid: str = "UUID"
    pod: tuple[str, ...] = ("exported_pod", "pod")
    namespace: tuple[str, ...] = ("exported_namespace", "namespace")

    def first(self, labels: Mapping[str, str], names: Sequence[str]) -> str:
        return next((labels[n] for n in names if labels.get(n)), "")

    def pod_key(self, labels: Mapping[str, str]) -> str | None:
        """``namespace/pod`` the series is about; the ``exported_*`` pair wins when present.

        Behind a ServiceMonitor without honorLabels, ``pod``/``namespace`` name the exporter
        itself and ``exported_pod``/``exported_namespace`` the workload; so the namespace is
        taken from the same family as the pod.
        """
        for pod_name, ns_name in zip(self.pod, self.namespace, strict=False):
            if labels.get(pod_name):
                return f"{labels.get(ns_name, '')}/{labels[pod_name]}"
        return None


@dataclass(frozen=True, slots=True, eq=False)
class GpuMemorySeries:
    """One GPU's used memory over time and the pods DCGM (or the cluster) says hold it."""

    node: str
    gpu: str
    times: FloatArray
    used_mib: FloatArray
    total_mib: float
    pods: tuple[str, ...] = ()
    uuid: str = ""

    @property
    def subject(self) -> str:
        return f"gpu/{self.node}/{self.gpu}"


@dataclass(frozen=True, slots=True)
class LeakAssessment:
    """Whether one GPU leaks, with the numbers and the reasons it does not."""

    series: GpuMemorySeries
    leaking: bool
    reasons: tuple[str, ...]
    fit: LineFit | None = None
    rising_fraction: float = 0.0
    drawdown_mib: float = 0.0
    exhaust_at: float | None = None
    evidence: dict[str, object] = field(default_factory=dict, hash=False)


def assess_leak(series: GpuMemorySeries, params: LeakParams, now: datetime) -> LeakAssessment:
    """Judge one GPU's memory over ``[now − lookback, now]``."""
    end = now.timestamp()
    start = end - params.lookback_s
    keep = (series.times >= start) & (series.times <= end) & np.isfinite(series.used_mib)
    t, y = series.times[keep], series.used_mib[keep]
    if len(t) < 3 or (t[-1] - t[0]) < params.min_coverage * params.lookback_s:
        span_h = (t[-1] - t[0]) / HOUR_S if len(t) >= 2 else 0.0
        return LeakAssessment(series, False, (f"too little history ({span_h:.1f} h)",))
    fit = fit_line(t, y)
    slope_h = fit.slope * HOUR_S
    slopes = segment_slopes(t, y, params.segments) * HOUR_S
    rising = float(np.mean(slopes >= params.min_slope_mib_per_h / 2)) if len(slopes) else 0.0
    drawdown = max_drawdown(y)
    growth = max(fit.slope * (t[-1] - t[0]), 0.0)
    exhaust_at = fit.reaches(series.total_mib) if series.total_mib > 0 else None
    reasons: list[str] = []
    if slope_h < params.min_slope_mib_per_h:
        reasons.append(f"slope {slope_h:.0f} MiB/h below {params.min_slope_mib_per_h:g}")
    if fit.r2 < params.min_r2:
        reasons.append(f"linear fit r2 {fit.r2:.2f} below {params.min_r2:g}")
    if rising < params.min_rising_fraction:
        reasons.append(f"rises in {rising:.0%} of slices, not steadily")
    if growth <= 0 or drawdown > params.max_drawdown_fraction * growth:
        reasons.append(f"falls back {drawdown:.0f} MiB (not monotonic)")
    if exhaust_at is None:
        reasons.append("never reaches the GPU's memory")
    elif exhaust_at - end > params.horizon_s:
        reasons.append(
            f"exhaustion in {(exhaust_at - end) / HOUR_S:.1f} h, beyond the "
            f"{params.horizon_s / HOUR_S:g} h horizon"
        )
    evidence: dict[str, object] = {
        "query": params.query,
        "node": series.node,
        "gpu": series.gpu,
        "uuid": series.uuid,
        "used_mib": round(float(y[-1]), 1),
        "total_mib": round(series.total_mib, 1),
        "slope_mib_per_h": round(slope_h, 1),
        "r2": round(fit.r2, 4),
        "rising_fraction": round(rising, 3),
        "drawdown_mib": round(drawdown, 1),
        "lookback_s": params.lookback_s,
    }
    if exhaust_at is not None:
        evidence["exhaust_at"] = _iso(exhaust_at)
        evidence["hours_to_exhaust"] = round(max(exhaust_at - end, 0.0) / HOUR_S, 2)
    return LeakAssessment(
        series, not reasons, tuple(reasons), fit, rising, drawdown, exhaust_at, evidence
    )


def detect_leaks(
    series: Sequence[GpuMemorySeries], params: LeakParams, now: datetime
) -> list[Finding]:
    """Findings for every leaking GPU: per pod when one pod holds it, else unattributable."""
    findings = []
    for one in series:
        verdict = assess_leak(one, params, now)
        if verdict.leaking:
            findings.append(_finding(verdict, params, now))
    return sorted(findings, key=lambda f: f.subject)


def _finding(verdict: LeakAssessment, params: LeakParams, now: datetime) -> Finding:
    s = verdict.series
    ev = dict(verdict.evidence)
    hours = ev.get("hours_to_exhaust", 0.0)
    severity = params.severity
    end = now.timestamp()
    if (
        params.critical_within_s is not None
        and verdict.exhaust_at is not None
        and verdict.exhaust_at - end <= params.critical_within_s
    ):
        severity = "critical"
    since = datetime.fromtimestamp(float(s.times[0]), UTC) if len(s.times) else None
    since = max(since, datetime.fromtimestamp(end - params.lookback_s, UTC)) if since else None
    labels = {"node": s.node, "detector": "leak", "rule": params.name, "gpu": s.gpu}
    rate = ev["slope_mib_per_h"]
    if len(s.pods) == 1:
        namespace, _, pod = s.pods[0].partition("/")
        labels |= {"namespace": namespace, "pod": pod}
        return Finding(
            kind="leak",
            subject=f"pod/{s.pods[0]}",
            severity=severity,
            summary=(
                f"GPU memory of pod {s.pods[0]} on {s.subject} grows {rate} MiB/h; "
                f"exhausted in {hours} h"
            ),
            evidence=ev | {"pods": list(s.pods)},
            since=since,
            labels=labels,
            action=params.action,
        )
    holders = ", ".join(s.pods) if s.pods else "no pod DCGM names"
    return Finding(
        kind="leak",
        subject=s.subject,
        severity=severity,
        summary=(
            f"GPU memory on {s.subject} grows {rate} MiB/h, exhausted in {hours} h; "
            f"unattributable: held by {holders}"
        ),
        evidence=ev | {"pods": list(s.pods), "attributable": False},
        since=since,
        labels=labels,
        action=params.action,
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()
