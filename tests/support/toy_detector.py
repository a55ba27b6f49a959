"""A toy detector: the whole of adding a detector, in one module with one registration.

``hot-gpu`` flags a GPU whose temperature stayed above ``max_celsius`` for its whole
``lookback``. The metric is dcgm-exporter's ``DCGM_FI_DEV_GPU_TEMP`` (a gauge, "GPU temperature
(in C)", in NVIDIA/dcgm-exporter ``etc/default-counters.csv``), labelled ``gpu``, ``UUID`` and
``Hostname`` as ``internal/pkg/rendermetrics/render_metrics.go`` writes them.

Nothing else in defrag is edited for it: the settings dataclass is the one definition of its
settings (the rule model is generated from it), ``TOY`` binds the rule's edge fields, the
settings, what it needs, the pure function and the alert. Tests register it only inside
``registry.registered(TOY)``, so no other test sees it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated

from annotated_types import Gt

from defrag.alerting import AlertSpec
from defrag.detect.findings import Finding, Severity
from defrag.detect.settings import INTERNAL, Action, RuleName, Seconds
from defrag.detectors.registry import Detector, Inputs, MissingInput
from defrag.detectors.rulemodel import PromQL, RuleModel

KIND = "hot-gpu"
ALERT = "ToyGPUTooHot"


@dataclass(frozen=True, slots=True)
class HotGpuParams:
    """The toy's settings: defaults and bounds written once, here."""

    name: Annotated[str, INTERNAL] = "gpu-too-hot"
    severity: Severity = "warning"
    action: Action = "alert"
    max_celsius: Annotated[float, Gt(0)] = 85.0
    lookback_s: Annotated[Seconds, Gt(0), RuleName("lookback")] = 600.0
    step_s: Annotated[Seconds, Gt(0), RuleName("step")] = 60.0


def detect_hot_gpus(
    temperatures: Mapping[str, Sequence[float]], params: HotGpuParams
) -> list[Finding]:
    """The pure function: a GPU (``node/gpu``) is hot when every sample exceeds the limit."""
    findings = []
    for key, values in sorted(temperatures.items()):
        if not values or min(values) <= params.max_celsius:
            continue
        node, _, gpu = key.partition("/")
        findings.append(
            Finding(
                kind=KIND,
                subject=f"gpu/{node}/{gpu}",
                severity=params.severity,
                summary=f"GPU {gpu} of {node} above {params.max_celsius:g} C",
                evidence={"min_celsius": min(values), "max_celsius": params.max_celsius},
                labels={"node": node, "gpu": gpu, "detector": KIND, "rule": params.name},
                action=params.action,
            )
        )
    return findings


class HotGpuRule(RuleModel):
    """What only the edge reads: the query."""

    query: PromQL = "DCGM_FI_DEV_GPU_TEMP"

    def promql(self) -> dict[str, str]:
        return {"query": self.query}


def _run(rule: HotGpuRule, params: HotGpuParams, inputs: Inputs) -> list[Finding]:
    start = inputs.now - timedelta(seconds=params.lookback_s)
    series = inputs.prometheus.range(rule.query, start, inputs.now, params.step_s)
    if not series:
        raise MissingInput(f"query ({rule.query}) returns no series")
    temperatures = {
        f"{s.labels.get('Hostname', '')}/{s.labels.get('gpu', '')}": [v for _, v in s.points]
        for s in series
    }
    return detect_hot_gpus(temperatures, params)


TOY: Detector[HotGpuRule, HotGpuParams] = Detector(
    name="hot-gpu",
    rule=HotGpuRule,
    settings=HotGpuParams,
    needs=frozenset({"metrics"}),
    run=_run,
    alerts={KIND: [AlertSpec(ALERT, summary="{summary} (lowest {min_celsius} C)")]},
)
