"""The idle detector's registration: the cluster's GPUs quiet for a while (the window gate).

Rule model: :class:`IdleRule` (``query``, ``per_gpu_query`` here; the settings are
:class:`~.core.IdleParams`). Query: ``query`` over twice ``for``
(:func:`idle_curve`). Pure function: :func:`~.core.detect_idle`. Never alerted: it
gates execution windows (docs/daemon.md), it is not a problem. docs/rules.md, "idle".
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from defrag.alerting import NotAlerted
from defrag.detect.findings import Finding
from defrag.detectors.idle.core import IdleParams, detect_idle
from defrag.detectors.registry import Detector, Inputs, MissingInput, register
from defrag.detectors.rulemodel import PromQL, RuleModel
from defrag.ports import MetricsSource


class IdleRuleFields(RuleModel):
    """What only the edge reads; the settings come from :class:`IdleParams`."""

    query: PromQL
    per_gpu_query: PromQL | None = None

    def promql(self) -> dict[str, str]:
        out = {"query": self.query}
        if self.per_gpu_query:
            out["per_gpu_query"] = self.per_gpu_query
        return out


def idle_curve(
    rule: IdleRuleFields, metrics: MetricsSource, now: datetime
) -> tuple[np.ndarray, np.ndarray]:
    """The utilisation curve over twice the rule's ``for`` (to tell since when it is quiet)."""
    params: IdleParams = IDLE.settings_of(rule)
    start = now - timedelta(seconds=2 * params.for_s)
    series = metrics.range(rule.query, start, now, params.step_s)
    if len(series) > 1:
        raise ValueError(
            f"idle query {rule.query!r} returned {len(series)} series; it must return one "
            "(aggregate it, e.g. avg(...))"
        )
    if not series:
        return np.empty(0), np.empty(0)
    points = np.asarray(series[0].points, dtype=float).reshape(-1, 2)
    return points[:, 0], points[:, 1]


def _run(rule: IdleRuleFields, params: IdleParams, inputs: Inputs) -> list[Finding]:
    times, values = idle_curve(rule, inputs.prometheus, inputs.now)
    if len(times) == 0:
        raise MissingInput(f"query ({rule.query}) returns no series")
    return detect_idle(times, values, params, inputs.now)


def _edge(rule: IdleRuleFields) -> Mapping[str, Any]:
    return {"query": rule.query}


IDLE: Detector[IdleRuleFields, IdleParams] = register(
    Detector(
        name="idle",
        rule=IdleRuleFields,
        settings=IdleParams,
        needs=frozenset({"metrics"}),
        run=_run,
        alerts={"idle": NotAlerted("the gate for execution windows, not a problem")},
        edge_settings=_edge,
    )
)
IdleRule = IDLE.model
"""The idle rule model (edge fields and settings)."""
