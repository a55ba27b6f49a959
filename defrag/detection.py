"""Detection at the edge: fetch what each rule needs, run the pure detectors, collect findings.

``detect(rules, metrics, cluster, now)`` is what the daemon's cycle calls once per cycle and what
``defrag detect`` prints. Rules that need metrics are skipped when there is no metrics source,
rules that need the cluster when there is no cluster; a rule whose query fails does not stop the
others (:func:`run_detection` returns both), but :func:`detect` raises :class:`DetectionError`
after running them all, naming each failed rule, its query and Prometheus's message.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from defrag.adapters.gpu_shapes import KSM_GPU, ksm_kind
from defrag.adapters.prometheus import apply_gpu_indices, gpu_indices_by_pod
from defrag.detect.findings import Finding
from defrag.detect.fragmentation import detect_fragmentation
from defrag.detect.idle import IdleStatus, assess_idle, detect_idle
from defrag.detect.leak import GpuMemorySeries, detect_leaks
from defrag.detect.series import trailing_run_start
from defrag.detect.starvation import detect_starvation
from defrag.model.cluster import Cluster, ModelError
from defrag.model.resources import Node, Pod
from defrag.ports import MetricsSource, Sample
from defrag.rules import (
    FragmentationRule,
    IdleRule,
    KubeStateQueries,
    LeakRule,
    LoadedRule,
    RuleSet,
    StarvationRule,
)
from defrag.scoring.profile import ProfileConfig, ScoringProfile

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


def detect(
    rules: RuleSet,
    metrics: MetricsSource | None,
    cluster: Cluster | None,
    now: datetime,
    *,
    profile: ScoringProfile | ProfileConfig | None = None,
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
    profile: ScoringProfile | ProfileConfig | None = None,
) -> DetectionReport:
    """Every enabled rule. Without ``cluster``, cluster rules that carry kube-state-metrics
    ``queries`` build a GPU-only cluster from Prometheus (:func:`cluster_from_kube_state`).
    ``profile``: the scoring profile built for ``cluster``, or the configuration to build it
    from (None: the default one); a cluster built here gets its own, from that configuration."""
    config = profile.config if isinstance(profile, ScoringProfile) else profile or ProfileConfig()
    if not isinstance(profile, ScoringProfile):
        profile = config.for_cluster(cluster) if cluster is not None else None
    findings: list[Finding] = []
    failures: list[RuleFailure] = []
    skipped: dict[str, str] = {}
    built: dict[KubeStateQueries, Cluster | MissingInput] = {}
    for loaded in rules.enabled():
        rule = loaded.rule
        try:
            if (
                cluster is None
                and metrics is not None
                and isinstance(rule, StarvationRule | FragmentationRule)
                and rule.queries is not None
            ):
                if rule.queries not in built:
                    try:
                        built[rule.queries] = cluster_from_kube_state(rule.queries, metrics, now)
                    except MissingInput as exc:
                        built[rule.queries] = exc  # said once per rule, asked once
                got = built[rule.queries]
                if isinstance(got, MissingInput):
                    raise got
                findings += _cluster_rule(rule, got, now, config.for_cluster(got))
                continue
            if isinstance(rule, LeakRule | IdleRule):
                if metrics is None:
                    skipped[rule.name] = NO_METRICS_SOURCE
                    continue
                if isinstance(rule, LeakRule):
                    findings += detect_leaks(leak_series(rule, metrics, now), rule.params(), now)
                else:
                    times, values = idle_curve(rule, metrics, now)
                    if len(times) == 0:
                        raise MissingInput(f"query ({rule.query}) returns no series")
                    findings += detect_idle(times, values, rule.params(), now)
            elif cluster is None:
                skipped[rule.name] = "no cluster snapshot"
            elif isinstance(rule, StarvationRule | FragmentationRule):
                findings += _cluster_rule(
                    rule, cluster, now, profile or config.for_cluster(cluster)
                )
        except MissingInput as exc:
            skipped[rule.name] = str(exc)
        except Exception as exc:  # one broken rule or query must not hide the other rules
            failures.append(_failure(loaded, exc))
    return DetectionReport(tuple(findings), tuple(failures), skipped)


def _cluster_rule(
    rule: StarvationRule | FragmentationRule,
    cluster: Cluster,
    now: datetime,
    profile: ScoringProfile,
) -> list[Finding]:
    if isinstance(rule, StarvationRule):
        return detect_starvation(cluster, rule.params(), now, profile=profile)
    return detect_fragmentation(cluster, rule.params(), now, profile=profile)


def _failure(loaded: LoadedRule, exc: Exception) -> RuleFailure:
    return RuleFailure(loaded.rule.name, loaded.file, loaded.line, str(exc) or type(exc).__name__)


# --- fetching ------------------------------------------------------------------------------------


_SELECTOR = re.compile(r"^\s*[A-Za-z_:][A-Za-z0-9_:]*\s*(\{[^{}]*\})?\s*$")


class MissingInput(LookupError):
    """A rule's queries returned nothing it can use; the message says which and why."""


def leak_range_query(rule: LeakRule) -> str:
    """The range query for the leak rule.

    When ``queries.used`` is a plain selector, each point is the median of the samples of its
    ``step`` (``quantile_over_time(0.5, used[step])``): Prometheus does the first reduction, so
    1,000 GPUs at 30 s come back as 72 points each over 6 h. With ``prefilter``, only GPUs whose
    least-squares slope over the whole lookback (``deriv(...) @ end()``, evaluated once) is at
    least half the minimum come back — a necessary condition in practice (the corpus property
    test in tests/test_detect_corpus.py checks the results do not change).
    """
    used = rule.queries.used
    if not _SELECTOR.match(used):
        return used
    sel = used.strip()
    query = f"quantile_over_time(0.5, {sel}[{rule.step:.0f}s])"
    if not rule.prefilter:
        return query
    threshold = rule.min_slope_mib_per_h / 2
    return f"({query}) and (deriv({sel}[{rule.lookback:.0f}s] @ end()) * 3600 > {threshold:g})"


def leak_series(rule: LeakRule, metrics: MetricsSource, now: datetime) -> list[GpuMemorySeries]:
    """One memory series per GPU (per MIG instance) over the rule's lookback, with the pods
    DCGM names on it. Raises :class:`MissingInput` when DCGM's series are absent, or when no
    series carries labels that name a GPU."""
    start = now - timedelta(seconds=rule.lookback)
    used = metrics.range(leak_range_query(rule), start, now, rule.step)
    free = metrics.instant(rule.queries.free, now)
    reserved = metrics.instant(rule.queries.reserved, now) if rule.queries.reserved else []
    used_now = metrics.instant(rule.queries.used, now) if used else []
    names = rule.labels.dcgm()
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


def idle_curve(rule: IdleRule, metrics: MetricsSource, now: datetime) -> tuple[Any, Any]:
    """The utilisation curve over twice the rule's ``for`` (to tell since when it is quiet)."""
    start = now - timedelta(seconds=2 * rule.for_)
    series = metrics.range(rule.query, start, now, rule.step)
    if len(series) > 1:
        raise ValueError(
            f"idle query {rule.query!r} returned {len(series)} series; it must return one "
            "(aggregate it, e.g. avg(...))"
        )
    if not series:
        return np.empty(0), np.empty(0)
    points = np.asarray(series[0].points, dtype=float).reshape(-1, 2)
    return points[:, 0], points[:, 1]


def idle_status(rules: RuleSet, metrics: MetricsSource, now: datetime) -> IdleStatus:
    """The idle gate for execution windows: idle when every enabled idle rule says so."""
    idle_rules = [r.rule for r in rules.enabled("idle")]
    if not idle_rules:
        return IdleStatus(False, ("no idle rule is enabled",))
    reasons: list[str] = []
    since: datetime | None = None
    for rule in idle_rules:
        assert isinstance(rule, IdleRule)
        times, values = idle_curve(rule, metrics, now)
        status = assess_idle(times, values, rule.params(), now)
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
    if not isinstance(leak, LeakRule):
        return cluster
    holdings = gpu_indices_by_pod(metrics, leak.queries.used, at, leak.labels.dcgm())
    return apply_gpu_indices(cluster, holdings).cluster


# --- a cluster from kube-state-metrics ----------------------------------------------------------


def cluster_from_kube_state(
    queries: KubeStateQueries, metrics: MetricsSource, now: datetime
) -> Cluster:
    """A GPU-only cluster from kube-state-metrics at ``now``: nodes with their allocatable GPUs,
    pods bound or pending with their GPU requests, priority class and (from the ``pending``
    range over ``lookback``) since when they are pending. CPU and memory are not modelled.

    Pods whose requests do not fit what their node has left (scrapes a moment apart) are left
    out rather than failing the cycle. ``resource`` labels of MIG profiles and renamed
    time-sliced replicas are pools, unknown accelerators warnings (``Cluster.warnings``); a
    time-sliced ``nvidia.com/gpu`` or a HAMi split count cannot be told apart here (no labels,
    no annotations) and reads as whole GPUs (docs/kubernetes.md).
    """
    warnings: list[str] = []
    whole: dict[str, int] = {}
    pools: dict[str, dict[str, int]] = {}
    allocatable = metrics.instant(queries.allocatable, now)
    if not allocatable:
        raise MissingInput(
            f"queries.allocatable ({queries.allocatable}) returns no series: is "
            "kube-state-metrics scraped?"
        )
    for s in allocatable:
        name, res = s.labels.get("node", ""), s.labels.get("resource", KSM_GPU)
        if not name or s.last is None or s.last <= 0:
            continue
        kind = ksm_kind(res)
        if kind == "gpu":
            whole[name] = int(s.last)
        elif kind == "pool":
            pools.setdefault(name, {})[res] = int(s.last)
        elif kind == "unknown":
            warnings.append(
                f"Node {name}: kube_node_status_allocatable{{resource={res!r}}}: {int(s.last)} "
                "unit(s) of an accelerator defrag does not model; left out"
            )
    nodes = {
        name: Node(name, 0, 0, num_gpu=whole.get(name, 0), pools=pools.get(name, {}))
        for name in {*whole, *pools}
    }
    if not nodes and not warnings:
        raise MissingInput(
            f"queries.allocatable ({queries.allocatable}) returns {len(allocatable)} series, "
            "none with a node label and a GPU"
        )
    requests: dict[str, float] = {}
    pool_requests: dict[str, tuple[str, float]] = {}
    unmodelled: set[str] = set()
    req_node: dict[str, str] = {}
    for s in metrics.instant(queries.gpu_requests, now):
        key, res = _pod_key(s.labels), s.labels.get("resource", KSM_GPU)
        if not key or not s.last:
            continue
        kind = ksm_kind(res)
        if kind == "gpu":
            requests[key] = requests.get(key, 0.0) + s.last
        elif kind == "pool":
            first, units = pool_requests.get(key, (res, 0.0))
            pool_requests[key] = (first, units + s.last if first == res else units)
        elif kind == "unknown":
            unmodelled.add(key)
            warnings.append(
                f"Pod {key}: kube_pod_container_resource_requests{{resource={res!r}}}: an "
                "accelerator defrag does not model; counted for nothing"
            )
            continue
        else:
            continue
        req_node.setdefault(key, s.labels.get("node", ""))
    phases = {
        key: s.labels.get("phase", "")
        for s in metrics.instant(queries.phase, now)
        if (key := _pod_key(s.labels)) and s.last
    }
    info = {
        key: s.labels for s in metrics.instant(queries.info, now) if (key := _pod_key(s.labels))
    }
    since: dict[str, datetime] = {}
    start = now - timedelta(seconds=queries.lookback)
    for s in metrics.range(queries.pending, start, now, queries.step):
        key = _pod_key(s.labels)
        points = np.asarray(s.points, dtype=float).reshape(-1, 2)
        if not key or len(points) == 0 or points[-1, 0] < now.timestamp() - 2 * queries.step:
            continue  # not pending any more
        began = trailing_run_start(points[:, 0], points[:, 1] > 0)
        if began is not None:
            since[key] = datetime.fromtimestamp(began, UTC)
    pods = []
    for key in sorted({*requests, *pool_requests}):
        gpus = requests.get(key, 0.0)
        pool, units = pool_requests.get(key, ("", 0.0))
        phase = phases.get(key, "Pending" if key in since else "")
        if phase not in ("Pending", "Running") or (phase == "Pending" and key in unmodelled):
            continue
        labels = info.get(key, {})
        node = labels.get("node") or req_node.get(key) or None
        namespace, _, name = key.partition("/")
        pods.append(
            Pod(
                name,
                namespace,
                num_gpu=round(gpus),
                pool=pool if units else "",
                pool_units=round(units),
                priority_class=labels.get("priority_class", ""),
                phase=phase,
                node=node if node in nodes else None,
                pending_since=since.get(key) if phase == "Pending" else None,
            )
        )
    cluster = Cluster.build(nodes.values(), warnings=warnings)
    for pod in pods:
        try:
            cluster = cluster.with_pod_added(pod)
        except ModelError:
            continue
    return cluster


def _pod_key(labels: Mapping[str, str]) -> str:
    pod = labels.get("pod", "")
    return f"{labels.get('namespace', '')}/{pod}" if pod else ""


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
        assert isinstance(rule, IdleRule)
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
        assert isinstance(rule_, LeakRule)
        # suspects: every steady grower, however far its exhaustion (no horizon)
        params = replace(rule_.params(), horizon_s=math.inf)
        try:
            found = detect_leaks(leak_series(rule_, metrics, at), params, at)
        except MissingInput as exc:
            out.setdefault("skipped", {})[rule_.name] = str(exc)
            continue
        out["leak_suspects"] += [f.to_dict() for f in found]
    return out
