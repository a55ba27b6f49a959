"""The fragmentation detector's registration: free GPUs stranded on nodes and in the cluster.

Rule model: :class:`FragmentationRule` (kube-state-metrics ``queries`` for a cluster built from
Prometheus; the settings are :class:`~.core.FragmentationParams`). Needs
the cluster. Pure function: :func:`~.core.detect_fragmentation`, measured
against the snapshot's scoring profile (its workload mix). Alerts: ``GPUNodeFragmented`` for a
node's finding, ``GPUClusterFragmented`` for the cluster's. docs/rules.md, "fragmentation".
"""

from __future__ import annotations

from defrag.alerting import AlertSpec
from defrag.detect.findings import Finding
from defrag.detectors.fragmentation.core import FragmentationParams, detect_fragmentation
from defrag.detectors.registry import Detector, Inputs, register
from defrag.detectors.rulemodel import ClusterRuleModel

CLUSTER_FRAGMENTED = "GPUClusterFragmented"
NODE_FRAGMENTED = "GPUNodeFragmented"


def is_node_finding(finding: Finding) -> bool:
    """A node's finding (``node/<name>``, or labelled with a node), not the cluster's."""
    if finding.subject == "cluster":
        return False
    return finding.subject.startswith("node/") or bool(finding.labels.get("node"))


def _run(rule: ClusterRuleModel, params: FragmentationParams, inputs: Inputs) -> list[Finding]:
    return detect_fragmentation(inputs.snapshot, params, inputs.now, profile=inputs.profile)


FRAGMENTATION: Detector[ClusterRuleModel, FragmentationParams] = register(
    Detector(
        name="fragmentation",
        rule=ClusterRuleModel,
        settings=FragmentationParams,
        needs=frozenset({"cluster"}),
        run=_run,
        alerts={
            "fragmentation": [
                AlertSpec(NODE_FRAGMENTED, when=is_node_finding),
                AlertSpec(CLUSTER_FRAGMENTED),
            ]
        },
    )
)
FragmentationRule = FRAGMENTATION.model
"""The fragmentation rule model (kube-state-metrics queries and settings)."""
