"""The starvation detector's registration: high-priority pods pending too long, and why.

Rule model: :class:`StarvationRule` (kube-state-metrics ``queries`` for a cluster built from
Prometheus; the settings are :class:`~.core.StarvationParams`). Needs the
cluster. Pure function: :func:`~.core.detect_starvation`, with the scoring
profile of the snapshot (the policy is configured once, in the settings: a rule's ``policy:``
is an error that says so). Alerts: ``GPUJobStarved`` for a starving pod, ``GPUJobUnsatisfiable``
for one no node could ever hold. docs/rules.md, "starvation".
"""

from __future__ import annotations

from defrag.alerting import AlertSpec
from defrag.detect.findings import Finding
from defrag.detectors.registry import Detector, Inputs, register
from defrag.detectors.rulemodel import ClusterRuleModel
from defrag.detectors.starvation.core import (
    STARVATION_KIND,
    UNSATISFIABLE_KIND,
    StarvationParams,
    detect_starvation,
)

STARVED = "GPUJobStarved"
UNSATISFIABLE = "GPUJobUnsatisfiable"

POLICY_MOVED = (
    "the scheduler policy is no longer a rule field: it is configured once, in the settings "
    "(`policy`, docs/daemon.md, Settings reference), for the daemon, the extender and the CLI "
    "alike; remove it from the rule"
)


def _run(rule: ClusterRuleModel, params: StarvationParams, inputs: Inputs) -> list[Finding]:
    return detect_starvation(inputs.snapshot, params, inputs.now, profile=inputs.profile)


STARVATION: Detector[ClusterRuleModel, StarvationParams] = register(
    Detector(
        name="starvation",
        rule=ClusterRuleModel,
        settings=StarvationParams,
        needs=frozenset({"cluster"}),
        run=_run,
        alerts={
            STARVATION_KIND: [AlertSpec(STARVED)],
            UNSATISFIABLE_KIND: [AlertSpec(UNSATISFIABLE)],
        },
        moved={"policy": POLICY_MOVED},
    )
)
StarvationRule = STARVATION.model
"""The starvation rule model (kube-state-metrics queries and settings)."""
