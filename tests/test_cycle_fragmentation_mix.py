"""One workload mix per cluster: the FGD figure is one number everywhere (issue 13, in part).

Before, the daemon's cycle reported fragmentation against the default mix (1/2/4/8-GPU jobs)
while ``report``, the fragmentation rule's alert evidence and the extender used the mix of the
cluster's own pods: on the demo cluster 55.0% on /metrics and 8.15% in the alert and report.
"""

from __future__ import annotations

from defrag.adapters.simcluster import SimClock, SimCluster, fragmented_cluster
from defrag.cli.run import _detector, _planner, default_rules_dir
from defrag.daemon.cycle import CyclePorts, run_cycle
from defrag.decide import CycleConfig
from defrag.model.workload import WorkloadMix
from defrag.rules import load_rules
from defrag.scoring.fragmentation import fragmentation_report
from defrag.scoring.profile import ProfileConfig
from defrag.settings import load_settings


def test_cycle_report_and_alert_evidence_give_one_fgd_figure() -> None:
    cluster = fragmented_cluster()
    clock = SimClock(speedup=0)
    sim = SimCluster(cluster, clock)
    rules = load_rules([default_rules_dir()])
    ports = CyclePorts(sim, clock, _detector(rules, None), _planner(load_settings(None, {})))
    result = run_cycle(ports, CycleConfig())
    on_metrics = result.before["fgd_frag_pct_of_idle"]  # what /metrics exports
    mix = ProfileConfig().for_cluster(cluster).mix
    in_report = fragmentation_report(cluster, mix).fgd_frag_pct_of_idle
    (evidence,) = [f.evidence for f in result.findings if f.subject == "cluster"]
    assert on_metrics == round(in_report, 3) == evidence["fgd_frag_pct_of_idle"]
    # and it is the cluster's own mix, not the default one, that gives it
    default = fragmentation_report(cluster, WorkloadMix.default()).fgd_frag_pct_of_idle
    assert mix == WorkloadMix.observed(cluster.pods.values()) != WorkloadMix.default()
    assert round(default, 2) != round(in_report, 2)
