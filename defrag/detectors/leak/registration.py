"""The leak detector's registration: GPU memory growing steadily towards exhaustion.

Rule model: :class:`LeakRule` (``queries``, ``labels``, ``prefilter`` here; the settings are
:class:`~.core.LeakParams`). Queries: ``queries.used`` over the lookback (5-min
medians computed by Prometheus, see :func:`leak_range_query`), ``queries.free`` and
``queries.reserved`` at the evaluation time. Pure function:
:func:`~.core.detect_leaks`. Alert: ``GPUMemoryLeakSuspected``. docs/rules.md,
"leak".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from defrag.alerting import AlertSpec
from defrag.detect.findings import Finding
from defrag.detectors.leak.core import DcgmLabels, GpuMemorySeries, LeakParams, detect_leaks
from defrag.detectors.registry import Detector, Inputs, MissingInput, register
from defrag.detectors.rulemodel import (
    Model,
    PromQL,
    RuleModel,
    settings_model,
    settings_of,
)
from defrag.ports import MetricsSource, Sample

DcgmLabelNames = settings_model(DcgmLabels)
"""The ``labels:`` of a leak rule, generated from :class:`~.core.DcgmLabels`."""


class LeakQueries(Model):
    used: PromQL
    free: PromQL
    reserved: PromQL | None = None
    """``DCGM_FI_DEV_FB_RESERVED`` where the exporter is configured to export it."""


class LeakRuleFields(RuleModel):
    """What only the edge reads; the settings come from :class:`LeakParams`."""

    queries: LeakQueries
    labels: DcgmLabelNames = DcgmLabelNames()  # type: ignore[valid-type]
    prefilter: bool = True
    """Ask Prometheus only for GPUs whose least-squares slope is at least half the minimum."""

    def promql(self) -> dict[str, str]:
        out = {"queries.used": self.queries.used, "queries.free": self.queries.free}
        if self.queries.reserved:
            out["queries.reserved"] = self.queries.reserved
        return out


def _run(rule: LeakRuleFields, params: LeakParams, inputs: Inputs) -> list[Finding]:
    return detect_leaks(leak_series(rule, inputs.prometheus, inputs.now), params, inputs.now)


def _edge(rule: LeakRuleFields) -> Mapping[str, Any]:
    return {"query": rule.queries.used}


LEAK: Detector[LeakRuleFields, LeakParams] = register(
    Detector(
        name="leak",
        rule=LeakRuleFields,
        settings=LeakParams,
        needs=frozenset({"metrics"}),
        run=_run,
        # gpu_instance and uuid (besides the routing node/gpu): one alert per GPU or MIG
        # instance of a pod, never merged by Alertmanager
        alerts={"leak": [AlertSpec("GPUMemoryLeakSuspected", labels=("gpu_instance", "uuid"))]},
        edge_settings=_edge,
    )
)
LeakRule = LEAK.model
"""The leak rule model (edge fields and settings)."""

_SELECTOR = re.compile(r"^\s*[A-Za-z_:][A-Za-z0-9_:]*\s*(\{[^{}]*\})?\s*$")


def leak_range_query(rule: LeakRuleFields) -> str:
    """The range query for the leak rule.

    When ``queries.used`` is a plain selector, each point is the median of the samples of its
    ``step`` (``quantile_over_time(0.5, used[step])``): Prometheus does the first reduction, so
    1,000 GPUs at 30 s come back as 72 points each over 6 h. With ``prefilter``, only GPUs whose
    least-squares slope over the whole lookback (``deriv(...) @ end()``, evaluated once) is at
    least half the minimum come back — a necessary condition in practice (the corpus property
    test in tests/test_detect_corpus.py checks the results do not change).
    """
    params = LEAK.settings_of(rule)
    used = rule.queries.used
    if not _SELECTOR.match(used):
        return used
    sel = used.strip()
    query = f"quantile_over_time(0.5, {sel}[{params.bin_s:.0f}s])"
    if not rule.prefilter:
        return query
    threshold = params.min_slope_mib_per_h / 2
    return f"({query}) and (deriv({sel}[{params.lookback_s:.0f}s] @ end()) * 3600 > {threshold:g})"


def leak_series(
    rule: LeakRuleFields, metrics: MetricsSource, now: datetime
) -> list[GpuMemorySeries]:
    """One memory series per GPU (per MIG instance) over the rule's lookback, with the pods
    DCGM names on it. Raises :class:`MissingInput` when DCGM's series are absent, or when no
    series carries labels that name a GPU."""
    params = LEAK.settings_of(rule)
    start = now - timedelta(seconds=params.lookback_s)
    used = metrics.range(leak_range_query(rule), start, now, params.bin_s)
    free = metrics.instant(rule.queries.free, now)
    reserved = metrics.instant(rule.queries.reserved, now) if rule.queries.reserved else []
    used_now = metrics.instant(rule.queries.used, now) if used else []
    names: DcgmLabels = settings_of(rule.labels)
    if not used and not free:
        raise MissingInput(
            f"queries.used ({rule.queries.used}) and queries.free ({rule.queries.free}) return "
            "no series: is the DCGM exporter scraped?"
        )
    if used and not free:
        raise MissingInput(
            f"queries.free ({rule.queries.free}) returns no series: no GPU's capacity is known"
        )
    targets = names.target_pods(s.labels for s in [*used, *free])
    # capacity = used + free (+ reserved) read at the same instant, per GPU / MIG instance
    last_of: dict[str, dict[tuple[str, ...], float]] = {"free": {}, "reserved": {}, "used": {}}
    unkeyed = 0
    for kind, samples in (("free", free), ("reserved", reserved), ("used", used_now)):
        for s in samples:
            key = names.key(s.labels)
            if key is not None and s.last is not None:
                last_of[kind][key] = s.last
    groups: dict[tuple[str, ...], list[Sample]] = {}
    for s in used:
        key = names.key(s.labels)
        if key is None:
            unkeyed += 1
            continue
        groups.setdefault(key, []).append(s)
    keyed_free = bool(last_of["free"])
    if not groups and (unkeyed or (free and not keyed_free)):
        raise MissingInput(
            "no DCGM series carries a GPU UUID or a node and GPU label "
            f"(labels.uuid: {', '.join(names.uuid)}; labels.node: {', '.join(names.node)}; "
            f"labels.gpu: {names.gpu})"
        )
    out = []
    for key, samples in sorted(groups.items()):
        times, values = _merge_points(samples)
        latest = max(samples, key=lambda s: s.points[-1][0] if s.points else 0.0).labels
        pods = tuple(sorted({k for s in samples if (k := names.pod_key(s.labels, targets))}))
        named = any(s.labels.get(p) for s in samples for p in names.pod)
        last_used = last_of["used"].get(key, float(values[-1]) if len(values) else 0.0)
        free_now = last_of["free"].get(key)
        reserved_now = last_of["reserved"].get(key, 0.0)
        total = last_used + free_now + reserved_now if free_now is not None else 0.0
        out.append(
            GpuMemorySeries(
                node=names.node_of(latest),
                gpu=latest.get(names.gpu, ""),
                times=times,
                used_mib=values,
                total_mib=total,
                pods=pods,
                uuid=names.uuid_of(latest),
                instance=latest.get(names.gpu_instance, ""),
                profile=latest.get(names.gpu_profile, ""),
                reserved_mib=reserved_now,
                exporter_only=named and not pods,
            )
        )
    return out


def _merge_points(samples: list[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """One time-ordered series from several: DCGM exports one series per pod on a shared GPU
    (the same values), and an exporter restart behind a ServiceMonitor starts a new series (a
    new exporter pod label). Values at the same time are averaged."""
    points = np.concatenate([np.asarray(s.points, dtype=float).reshape(-1, 2) for s in samples])
    if len(samples) == 1 or len(points) == 0:
        return points[:, 0], points[:, 1]
    times, inverse, counts = np.unique(points[:, 0], return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=points[:, 1], minlength=len(times))
    return times, sums / counts
