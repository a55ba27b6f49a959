"""Detection at the edge: each rule through its detector's registration, findings collected.

``run_detection(rules, metrics, cluster, now, profile=...)`` is what the daemon's cycle calls
once per cycle and what ``defrag detect`` prints. It dispatches through the detector registry
(:mod:`defrag.detectors.registry`): a rule whose detector needs metrics is skipped when there is
no metrics source, one that needs the cluster when there is no cluster (unless its
kube-state-metrics ``queries`` build one). A rule whose query fails does not stop the others
(:func:`run_detection` returns both), but :func:`detect` raises :class:`DetectionError` after
running them all, naming each failed rule, its query and Prometheus's message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from defrag.adapters.ksm_cluster import cluster_from_kube_state
from defrag.adapters.prometheus import apply_gpu_indices, gpu_indices_by_pod
from defrag.decide import Detected, Detector
from defrag.detect.findings import Finding
from defrag.detectors import registry
from defrag.detectors.idle.core import IdleParams, IdleStatus, assess_idle
from defrag.detectors.idle.registration import IDLE, IdleRuleFields, idle_curve
from defrag.detectors.leak.core import DcgmLabels, LeakParams, detect_leaks
from defrag.detectors.leak.registration import LEAK, LeakRuleFields, leak_series
from defrag.detectors.range_memory import RangeMemory, remembering
from defrag.detectors.registry import Inputs, MissingInput
from defrag.detectors.rulemodel import ClusterRuleModel, KubeStateQueries, settings_of
from defrag.detectors.starvation.core import first_per_pod
from defrag.model.cluster import Cluster
from defrag.ports import MetricsSource
from defrag.redact import redact_text
from defrag.rules import LoadedRule, RuleSet
from defrag.scoring.profile import ScoringProfile

NO_METRICS_SOURCE = "no metrics source"
"""Why a metric rule is skipped when no Prometheus is configured (a choice, not a fault)."""


class DetectionError(RuntimeError):
    """One or more rules could not be evaluated; the message has one line per rule."""

    def __init__(self, failures: tuple[RuleFailure, ...]) -> None:
        super().__init__("\n".join(str(f) for f in failures))
        self.failures = failures


@dataclass(frozen=True, slots=True)
class RuleFailure:
    rule: str
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"rule {self.rule} ({self.file}:{self.line}): {self.message}"


@dataclass(frozen=True, slots=True)
class DetectionReport:
    findings: tuple[Finding, ...]
    failures: tuple[RuleFailure, ...] = ()
    skipped: Mapping[str, str] = field(default_factory=dict)
    ran: tuple[str, ...] = ()
    """The rules evaluated to the end, in order (with or without findings); every enabled rule
    is in exactly one of ``ran``, ``skipped`` (why) and ``failures``."""


def detect(
    rules: RuleSet,
    metrics: MetricsSource | None,
    cluster: Cluster | None,
    now: datetime,
    *,
    profile: ScoringProfile,
) -> list[Finding]:
    """Findings of every enabled rule; :class:`DetectionError` if any rule failed."""
    report = run_detection(rules, metrics, cluster, now, profile=profile)
    if report.failures:
        raise DetectionError(report.failures)
    return list(report.findings)


def run_detection(
    rules: RuleSet,
    metrics: MetricsSource | None,
    cluster: Cluster | None,
    now: datetime,
    *,
    profile: ScoringProfile,
    memory: RangeMemory | None = None,
) -> DetectionReport:
    """Every enabled rule, each through its detector's registration.

    ``profile`` is the scoring profile of ``cluster`` (the configured policy bound to its
    workload mix); the detectors that score (starvation, fragmentation) use it. Without
    ``cluster``, rules of detectors that need one and carry kube-state-metrics ``queries``
    build a GPU-only cluster from Prometheus (:func:`cluster_from_kube_state`, once per set of
    queries), scored with the same configuration bound to that cluster's mix. A pod several
    starvation rules find has the first rule's finding only (:func:`first_per_pod`).

    ``memory``: what the previous detections of these rules kept of their range answers
    (:mod:`defrag.detectors.range_memory`), so that this one asks Prometheus only for what is new;
    it keeps this one's in turn. None: every range is read whole, nothing kept.
    """
    with remembering(memory):
        return _run_detection(rules, metrics, cluster, now, profile)


def _run_detection(
    rules: RuleSet,
    metrics: MetricsSource | None,
    cluster: Cluster | None,
    now: datetime,
    profile: ScoringProfile,
) -> DetectionReport:
    findings: list[Finding] = []
    failures: list[RuleFailure] = []
    skipped: dict[str, str] = {}
    ran: list[str] = []
    built: dict[KubeStateQueries, tuple[Cluster, ScoringProfile] | MissingInput] = {}
    for loaded in rules.enabled():
        rule = loaded.rule
        detector = registry.get(rule.detector)
        try:
            inputs = Inputs(now, profile)
            if "metrics" in detector.needs:
                if metrics is None:
                    skipped[rule.name] = NO_METRICS_SOURCE
                    continue
                inputs = replace(inputs, metrics=metrics)
            if "cluster" in detector.needs:
                queries = rule.queries if isinstance(rule, ClusterRuleModel) else None
                if cluster is not None:
                    inputs = replace(inputs, cluster=cluster)
                elif metrics is not None and queries is not None:
                    if queries not in built:
                        try:
                            ksm = cluster_from_kube_state(queries, metrics, now)
                            built[queries] = (ksm, profile.config.for_cluster(ksm))
                        except MissingInput as exc:
                            built[queries] = exc  # said once per rule, asked once
                    got = built[queries]
                    if isinstance(got, MissingInput):
                        raise got
                    inputs = replace(inputs, cluster=got[0], profile=got[1])
                else:
                    skipped[rule.name] = "no cluster snapshot"
                    continue
            findings += detector.evaluate(rule, inputs)
            ran.append(rule.name)
        except MissingInput as exc:
            skipped[rule.name] = str(exc)
        except Exception as exc:  # one broken rule or query must not hide the other rules
            failures.append(_failure(loaded, exc))
    # a pod two starvation rules find is reported by the first (file order: high priority first)
    return DetectionReport(tuple(first_per_pod(findings)), tuple(failures), skipped, tuple(ran))


def cycle_detector(rules: RuleSet, metrics: MetricsSource | None) -> Detector:
    """The decision's detector port: every enabled rule on the cycle's cluster, with what
    could not be evaluated (rule → why, redacted) and what was skipped for missing inputs. One
    broken rule never stops the others; the daemon logs, counts and alerts on the failed ones,
    and holds their alerts as they were. The daemon and the simulator both detect with it.

    It remembers (a :class:`~defrag.detectors.range_memory.RangeMemory` of its own): each cycle's
    detection asks Prometheus only for the span since the previous one where it can, and the
    rules and the source stay the same for its life (new rules make a new detector, which
    reads everything anew)."""
    memory = RangeMemory()

    def detect(cluster: Cluster, now: datetime, profile: ScoringProfile) -> Detected:
        report = run_detection(rules, metrics, cluster, now, profile=profile, memory=memory)
        failed = {f.rule: redact_text(f"{f.message} ({f.file}:{f.line})") for f in report.failures}
        return Detected(report.findings, failed, report.skipped)

    return detect


def _failure(loaded: LoadedRule, exc: Exception) -> RuleFailure:
    return RuleFailure(loaded.rule.name, loaded.file, loaded.line, str(exc) or type(exc).__name__)


# --- the window gate ------------------------------------------------------------------------


def idle_status(rules: RuleSet, metrics: MetricsSource, now: datetime) -> IdleStatus:
    """The idle gate for execution windows: idle when every enabled idle rule says so."""
    idle_rules = [r.rule for r in rules.enabled("idle")]
    if not idle_rules:
        return IdleStatus(False, ("no idle rule is enabled",))
    reasons: list[str] = []
    since: datetime | None = None
    for rule in idle_rules:
        assert isinstance(rule, IdleRuleFields)
        params: IdleParams = IDLE.settings_of(rule)
        times, values = idle_curve(rule, metrics, now)
        status = assess_idle(times, values, params, now)
        reasons += [f"{rule.name}: {r}" for r in status.reasons]
        if status.since is not None:
            since = max(since, status.since) if since else status.since
    return IdleStatus(not reasons, tuple(reasons), since if not reasons else None)


def with_dcgm_gpu_indices(
    cluster: Cluster, rules: RuleSet, metrics: MetricsSource, at: datetime
) -> Cluster:
    """The cluster with the GPU indices DCGM reports for its pods (the first enabled leak
    rule's ``queries.used`` and label names); pods DCGM disagrees with keep theirs."""
    leak = next((r.rule for r in rules.enabled("leak")), None)
    if not isinstance(leak, LeakRuleFields):
        return cluster
    names: DcgmLabels = settings_of(leak.labels)
    holdings = gpu_indices_by_pod(metrics, leak.queries.used, at, names)
    return apply_gpu_indices(cluster, holdings).cluster


# --- report extras -------------------------------------------------------------------------------


def report_extras(
    metrics: MetricsSource, rules: RuleSet, at: datetime | None, window_s: float = 24 * 3600.0
) -> dict[str, Any]:
    """For ``defrag report --prometheus``: GPU utilisation p50/p90/p99 and the leak suspects.

    Leak suspects are the leak rules' findings without the horizon: every GPU whose memory
    grows steadily, however far from exhaustion. Utilisation percentiles are over every
    per-GPU sample of the last ``window_s`` (the idle rule's ``per_gpu_query``, else its
    ``query``), at a 5-minute step; ``at`` None means now. A leak rule whose inputs are missing
    is listed under ``skipped`` with the reason.
    Raises the metrics source's error (e.g. ``MetricsError``) when a query fails.
    """
    at = at or datetime.now(UTC)
    out: dict[str, Any] = {"utilisation": None, "leak_suspects": []}
    idle_rules = [r.rule for r in rules.enabled("idle")]
    if idle_rules:
        rule = idle_rules[0]
        assert isinstance(rule, IdleRuleFields)
        query = rule.per_gpu_query or rule.query
        series = metrics.range(query, at - timedelta(seconds=window_s), at, 300.0)
        values = np.array([v for s in series for _, v in s.points], dtype=float)
        values = values[np.isfinite(values)]
        if len(values):
            p50, p90, p99 = np.percentile(values, [50, 90, 99])
            out["utilisation"] = {
                "p50": round(float(p50), 2),
                "p90": round(float(p90), 2),
                "p99": round(float(p99), 2),
                "gpus": len(series),
                "samples": len(values),
                "window_s": window_s,
                "query": query,
            }
    for loaded in rules.enabled("leak"):
        rule_ = loaded.rule
        assert isinstance(rule_, LeakRuleFields)
        # suspects: every steady grower, however far its exhaustion (no horizon)
        params: LeakParams = replace(LEAK.settings_of(rule_), horizon_s=math.inf)
        try:
            found = detect_leaks(leak_series(rule_, metrics, at), params, at)
        except MissingInput as exc:
            out.setdefault("skipped", {})[rule_.name] = str(exc)
            continue
        out["leak_suspects"] += [f.to_dict() for f in found]
    return out
