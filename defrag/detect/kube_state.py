"""kube-state-metrics' labels as Prometheus stores them: the ``exported_*`` variants.

Shared by the cluster built from kube-state-metrics (:mod:`defrag.adapters.ksm_cluster`) and
the leak detector's workload owners (``kube_pod_owner``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Behind a ServiceMonitor without ``honorLabels`` (the kube-state-metrics chart's default:
# prometheus-community/helm-charts charts/kube-state-metrics/templates/servicemonitor.yaml
# lines 28-30 at 0027117e write ``honorLabels: true`` only when the value is set), Prometheus
# gives every scraped label that collides with a target label the prefix ``exported_``
# (Prometheus docs/configuration/configuration.md, ``honor_labels``); prometheus-operator sets
# the target labels ``namespace``, ``service``, ``pod`` and ``container`` of a ServiceMonitor
# target (pkg/prometheus/promcfg.go lines 2135-2149 at 6adcebc5, generateServiceMonitorConfig).
# So kube-state-metrics' own ``pod``/``namespace`` (docs/metrics/workload/pod-metrics.md: every
# kube_pod_* family carries ``pod``, ``namespace`` and ``uid``) become ``exported_pod``/
# ``exported_namespace``, and the plain pair names the kube-state-metrics pod. A node family
# (kube_node_status_allocatable has no ``pod``) gets the plain pair of the target alone.


def label(labels: Mapping[str, str], name: str) -> str:
    """kube-state-metrics' own value of ``name``: ``exported_<name>`` when Prometheus renamed it
    (it collided with a target label), else ``name``."""
    return labels.get(f"exported_{name}") or labels.get(name, "")


def scrape_targets(
    pod_series: Iterable[Mapping[str, str]], node_series: Iterable[Mapping[str, str]] = ()
) -> frozenset[str]:
    """``namespace/pod`` of the scrape targets (the kube-state-metrics pods): the plain pair on a
    pod family's series that also carries ``exported_pod``/``exported_namespace``, or on a node
    family's series (``kube_node_*`` has no ``pod`` label of its own, so one there is the
    target's)."""
    out = set()
    for labels in pod_series:
        if labels.get("pod") and ("exported_pod" in labels or "exported_namespace" in labels):
            out.add(f"{labels.get('namespace', '')}/{labels['pod']}")
    for labels in node_series:
        if labels.get("pod"):
            out.add(f"{labels.get('namespace', '')}/{labels['pod']}")
    return frozenset(out)


def pod_key(labels: Mapping[str, str], targets: frozenset[str] = frozenset()) -> str:
    """``namespace/pod`` of the pod a kube-state-metrics series is about, never a scrape
    target's own pod ('' when it names none)."""
    pod = labels.get("exported_pod", "")
    if pod:
        return f"{labels.get('exported_namespace', '')}/{pod}"
    pod = labels.get("pod", "")
    key = f"{labels.get('namespace', '')}/{pod}" if pod else ""
    return "" if key in targets else key


__all__ = ["label", "pod_key", "scrape_targets"]
