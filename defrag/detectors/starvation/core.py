"""Starvation: high-priority pods pending longer than the rule allows, and why they wait.

The reason is told with the scheduler's own filter (docs/concepts.md), never guessed:

* ``fragmented`` — enough free GPUs in total on the nodes it may use, yet no node can place it;
  repacking (or make-room) helps;
* ``insufficient-gpus`` — fewer free GPUs than it asks, anywhere: only preemption helps;
* ``constrained`` — GPUs would fit, other filters (CPU, memory, taints, model) reject every node;
* ``placeable`` — the scheduler's filter finds a node now (the pod waits for something the model
  does not see, or the scheduler has not retried yet).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

import numpy as np

from defrag.detect.findings import Finding, Severity
from defrag.detect.settings import INTERNAL, RuleName, Seconds, StarvationAction
from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.scoring.filters import R_GPU, R_POOL, R_TOPOLOGY, node_mask
from defrag.scoring.framework import Placement, Policy
from defrag.scoring.profile import ScoringProfile
from defrag.scoring.scheduler import schedule

Reason = Literal["fragmented", "insufficient-gpus", "constrained", "placeable"]


@dataclass(frozen=True, slots=True)
class StarvationParams:
    """The starvation detector's settings (rule-file names and meaning: docs/rules.md). The
    scheduler policy is not one of them: it is the scoring profile's (settings ``policy``)."""

    name: Annotated[str, INTERNAL] = "high-priority-starved"
    severity: Severity = "warning"
    action: StarvationAction = "alert"
    for_s: Annotated[Seconds, RuleName("for")] = 900.0
    min_priority: int = 1000
    priority_classes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Diagnosis:
    reason: Reason
    detail: str
    needed_gpus: float
    free_gpus: float


def priority_of(pod: Pod, cluster: Cluster) -> int:
    """The pod's priority, or its class's value when the pod does not carry one."""
    return pod.priority or int(cluster.priority_classes.get(pod.priority_class, 0))


def is_high_priority(pod: Pod, cluster: Cluster, params: StarvationParams) -> bool:
    return (
        priority_of(pod, cluster) >= params.min_priority
        or pod.priority_class in params.priority_classes
    )


def pending_since(pod: Pod) -> datetime | None:
    return pod.pending_since or pod.created_at


def diagnose(pod: Pod, cluster: Cluster, policy: Policy) -> Diagnosis:
    """Why ``pod`` cannot be placed right now, by the scheduler's own filter and the score
    function of the cluster's profile (``ScoringProfile.policy``)."""
    arrays = cluster.arrays
    usable = node_mask(pod, arrays) & arrays.model_allowed(pod)  # nodes it may ever use
    if pod.pool:
        needed = float(pod.pool_units)
        free = float(arrays.pool_free_for(pod)[usable].sum())
    elif pod.is_sharing:
        needed = pod.gpu_milli / GPU_MILLI
        free = float(arrays.free_share()[usable].sum()) / GPU_MILLI
    else:
        needed = float(pod.num_gpu)
        free = float(arrays.free_whole_count()[usable].sum())
    verdict = schedule(pod, cluster, policy)
    if isinstance(verdict, Placement):
        return Diagnosis("placeable", f"fits on {verdict.node} now", needed, free)
    summary = verdict.summary
    gpu_bound = any(r in (R_GPU, R_TOPOLOGY, R_POOL) for r in verdict.reasons)
    if pod.uses_gpu and free < needed:
        detail = f"asks {needed:g} GPU(s), only {free:g} free in total ({summary})"
        return Diagnosis("insufficient-gpus", detail, needed, free)
    if pod.uses_gpu and gpu_bound:
        detail = f"{free:g} GPU(s) free in total, but no node can place {needed:g} ({summary})"
        return Diagnosis("fragmented", detail, needed, free)
    return Diagnosis("constrained", summary, needed, free)


def detect_starvation(
    cluster: Cluster,
    params: StarvationParams,
    now: datetime,
    pods: Iterable[Pod] | None = None,
    *,
    profile: ScoringProfile,
) -> list[Finding]:
    """Findings for high-priority pods pending at least ``for_s`` (``pods``: default all),
    diagnosed with ``profile`` — the one built for this snapshot, which the planner and the
    extender score with too."""
    findings = []
    candidates = cluster.pending_pods() if pods is None else pods
    policy = profile.policy
    for pod in candidates:
        since = pending_since(pod)
        if since is None or pod.is_gated or not is_high_priority(pod, cluster, params):
            continue  # a gated pod waits for its gates (Kueue admission, …), not for room
        waited = (now - since).total_seconds()
        if waited < params.for_s:
            continue
        why = diagnose(pod, cluster, policy)
        prio = priority_of(pod, cluster)
        findings.append(
            Finding(
                kind="starvation",
                subject=f"pod/{pod.key}",
                severity=params.severity,
                summary=(
                    f"pod {pod.key} (priority {prio}) pending {_human(waited)}: "
                    f"{why.reason} — {why.detail}"
                ),
                evidence={
                    "reason": why.reason,
                    "detail": why.detail,
                    "priority": prio,
                    "priority_class": pod.priority_class,
                    "pending_s": round(waited, 1),
                    "for_s": params.for_s,
                    "gpus": pod.num_gpu,
                    "gpu_milli": pod.gpu_milli,
                    "needed_gpus": why.needed_gpus,
                    "free_gpus": why.free_gpus,
                    "policy": profile.name,
                },
                since=since,
                labels={
                    "namespace": pod.namespace,
                    "pod": pod.name,
                    "detector": "starvation",
                    "rule": params.name,
                    "reason": why.reason,
                },
                action=params.action,
            )
        )
    return sorted(findings, key=lambda f: f.subject)


def _human(seconds: float) -> str:
    minutes = float(np.floor(seconds / 60))
    if minutes < 120:
        return f"{minutes:.0f} min"
    return f"{seconds / 3600:.1f} h"
