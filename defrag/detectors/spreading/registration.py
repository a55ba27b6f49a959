"""The spreading detector's registration: the cluster's scheduler spreads GPU pods.

Rule model: :class:`SpreadingRule` (kube-state-metrics ``queries`` for a cluster built from
Prometheus — such a cluster has no bind times, so the rule is skipped there; the settings are
:class:`~.core.SpreadingParams`). Needs the cluster. Pure function:
:func:`~.core.detect_spreading`, replayed with the snapshot's scoring profile. Too few
informative placements is thin evidence: :class:`~defrag.detectors.registry.MissingInput` with
the reason (the rule is listed as skipped). Alert: ``GPUSchedulerSpreads``. docs/rules.md,
"spreading".
"""

from __future__ import annotations

from defrag.alerting import AlertSpec, NotAlerted
from defrag.detect.findings import Finding
from defrag.detectors.registry import Detector, Inputs, MissingInput, register
from defrag.detectors.rulemodel import ClusterRuleModel
from defrag.detectors.spreading.core import PACKING, SpreadingParams, detect_spreading

SCHEDULER_SPREADS = "GPUSchedulerSpreads"


def _run(rule: ClusterRuleModel, params: SpreadingParams, inputs: Inputs) -> list[Finding]:
    verdict = detect_spreading(inputs.snapshot, params, inputs.now, profile=inputs.profile)
    if not verdict.evidence.ok:
        raise MissingInput(str(verdict.evidence))
    return list(verdict.findings)


SPREADING: Detector[ClusterRuleModel, SpreadingParams] = register(
    Detector(
        name="spreading",
        rule=ClusterRuleModel,
        settings=SpreadingParams,
        needs=frozenset({"cluster"}),
        run=_run,
        alerts={
            "spreading": [AlertSpec(SCHEDULER_SPREADS)],
            PACKING: NotAlerted("make-room's input (the scheduler packs), not a problem"),
        },
    )
)
SpreadingRule = SPREADING.model
"""The spreading rule model (kube-state-metrics queries and settings)."""
