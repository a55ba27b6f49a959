"""Starvation: GPU pods pending longer than the rule allows, and why they wait.

A rule selects pods by priority (``min_priority``, ``priority_classes``; or ``any_priority``)
and by why they wait (``reasons``, default every reason). The shipped rules
(rules/starvation.yaml): ``high-priority-starved`` (priority ≥ 1000 or a named class, any
reason) and ``fragmented-starved`` (any priority, ``fragmented`` only: a cluster without
PriorityClasses still gets room for a job the free GPUs would hold, were they not scattered).
A pod several rules find is reported by the first of them in file order (:func:`first_per_pod`).

The reason is told with the scheduler's own filter (docs/concepts.md), never guessed:

* ``fragmented`` — enough free GPUs in total on the nodes it may use, yet no node can place it;
  repacking (or make-room) helps;
* ``insufficient-gpus`` — fewer free GPUs than it asks, anywhere: only preemption helps;
* ``constrained`` — GPUs would fit, other filters (CPU, memory, taints, model) reject every node;
* ``placeable`` — the scheduler's filter finds a node now (the pod waits for something the model
  does not see, or the scheduler has not retried yet);
* ``unsatisfiable`` — no node could hold it even with nothing on it (more GPUs than any node
  has, a GPU model or node selector no node offers, more CPU or memory than any node's
  allocatable: :mod:`defrag.scoring.satisfiable`). Reported as its own finding kind,
  ``unsatisfiable`` (alert ``GPUJobUnsatisfiable``), with the action ``alert`` whatever the
  rule's: no room made anywhere ever places it, and it is never called ``fragmented``.

A gated pod (``Pod.is_gated``: scheduling gates, e.g. Kueue's admission) is skipped before any
of this: it waits for its gates, not for room, and is reported nowhere (docs/rules.md).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

import numpy as np
from annotated_types import MinLen

from defrag.detect.findings import Finding, Severity
from defrag.detect.settings import INTERNAL, RuleName, Seconds, StarvationAction
from defrag.model.arrays import NodeArrays
from defrag.model.carried import KeptFor
from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.plan.shape import repeatable, shape_of
from defrag.plan.waiting import waiting
from defrag.scoring.filters import R_GPU, R_POOL, R_TOPOLOGY, node_mask
from defrag.scoring.framework import Placement, Policy
from defrag.scoring.profile import ScoringProfile
from defrag.scoring.satisfiable import empty_nodes, satisfiable
from defrag.scoring.scheduler import schedule

Reason = Literal["fragmented", "insufficient-gpus", "constrained", "placeable", "unsatisfiable"]
REASONS: tuple[Reason, ...] = (
    "fragmented",
    "insufficient-gpus",
    "constrained",
    "placeable",
    "unsatisfiable",
)
STARVATION_KIND = "starvation"
UNSATISFIABLE_KIND = "unsatisfiable"
"""The finding kind of a pending pod no node could ever hold (its own alert, never make-room)."""
POD_KINDS = frozenset({STARVATION_KIND, UNSATISFIABLE_KIND})


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
    any_priority: bool = False
    """Pods of every priority (``min_priority`` and ``priority_classes`` then select nothing
    more): for clusters whose GPU pods carry no PriorityClass."""
    reasons: Annotated[frozenset[Reason], MinLen(1)] = frozenset(REASONS)
    """Only pods waiting for one of these reasons (:class:`Diagnosis`); default every one."""

    @property
    def every_reason(self) -> bool:
        """Whether the rule takes every reason (no diagnosis is needed to select a pod)."""
        return self.reasons >= frozenset(REASONS)


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
    return selects_priority(priority_of(pod, cluster), pod.priority_class, params)


def selects_priority(priority: int, priority_class: str, params: StarvationParams) -> bool:
    """Whether the rule takes a pod of this priority (value and class name)."""
    return (
        params.any_priority
        or priority >= params.min_priority
        or priority_class in params.priority_classes
    )


def pending_since(pod: Pod) -> datetime | None:
    return pod.pending_since or pod.created_at


def diagnose(
    pod: Pod, cluster: Cluster | NodeArrays, policy: Policy, empty: NodeArrays | None = None
) -> Diagnosis:
    """Why ``pod`` cannot be placed right now, by the scheduler's own filter and the score
    function of the cluster's profile (``ScoringProfile.policy``); on a cluster or its arrays
    (the simulator's state). ``empty``: the nodes emptied
    (:func:`~defrag.scoring.satisfiable.empty_nodes`; built here when not given), on which a
    pod no node could ever hold is told ``unsatisfiable`` first."""
    arrays = cluster.arrays if isinstance(cluster, Cluster) else cluster
    ever = satisfiable(pod, empty if empty is not None else empty_nodes(arrays))
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
    if not ever.ok:
        return Diagnosis("unsatisfiable", str(ever), needed, free)
    verdict = schedule(pod, arrays, policy)
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
    """Findings for the pods the rule selects (priority, pending at least ``for_s``, waiting
    for one of its ``reasons``; ``pods``: default all pending), diagnosed with ``profile`` —
    the one built for this snapshot, which the planner and the extender score with too."""
    findings = []
    diagnosis = diagnoser(cluster, profile.policy)
    candidates = diagnosis.pending() if pods is None else pods
    for pod in candidates:
        since = pending_since(pod)
        if since is None or pod.is_gated or not is_high_priority(pod, cluster, params):
            # A gated pod waits for its gates (Kueue admission, …), not for room: no finding
            # of any kind (docs/rules.md, "Gated pods"), and the planner skips it too.
            continue
        waited = (now - since).total_seconds()
        if waited < params.for_s:
            continue
        why = diagnosis(pod)
        if why.reason not in params.reasons:
            continue
        prio = priority_of(pod, cluster)
        never = why.reason == "unsatisfiable"
        findings.append(
            Finding(
                kind=UNSATISFIABLE_KIND if never else STARVATION_KIND,
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
                # no room made anywhere ever places it: alerted, never given make-room
                action="alert" if never else params.action,
            )
        )
    return sorted(findings, key=lambda f: f.subject)


class Diagnoser:
    """:func:`diagnose` on one cluster with one policy, each pod shape once
    (:func:`~defrag.plan.shape.shape_of`): pods of one shape get one answer — the answer
    :func:`diagnose` gives each of them, since nothing it reads tells them apart. A policy
    that draws from a generator is asked for every pod, as before
    (:func:`~defrag.plan.shape.repeatable`)."""

    def __init__(self, cluster: Cluster, policy: Policy) -> None:
        self.cluster = cluster
        self.policy = policy
        self._reuse = repeatable(policy)
        self._waiting = waiting(cluster)
        self._known: dict[Hashable, Diagnosis] = {}
        self._by_pod: dict[str, tuple[Pod, Diagnosis]] = {}

    def __call__(self, pod: Pod) -> Diagnosis:
        if not self._reuse:
            return diagnose(pod, self.cluster, self.policy, self.empty())
        seen = self._by_pod.get(pod.key)
        if seen is not None and seen[0] is pod:  # the next rule asks of the same pod
            return seen[1]
        shape = shape_of(pod)
        known = self._known.get(shape)
        if known is None:
            known = diagnose(pod, self.cluster, self.policy, self.empty())
            self._known[shape] = known
        self._by_pod[pod.key] = (pod, known)
        return known

    def pending(self) -> tuple[Pod, ...]:
        """The cluster's pending pods (``Cluster.pending_pods``), found once per snapshot
        (:mod:`defrag.plan.waiting`: the planner asks for them too)."""
        return self._waiting.pods

    def empty(self) -> NodeArrays:
        """The nodes emptied (:func:`~defrag.scoring.satisfiable.empty_nodes`), built once per
        snapshot."""
        return self._waiting.empty()


_last: KeptFor[Diagnoser] = KeptFor()


def diagnoser(cluster: Cluster, policy: Policy) -> Diagnoser:
    """The :class:`Diagnoser` for this cluster and policy: the one the last call made when it
    was for the same two objects, else a new one (kept in its place). The shipped rules are
    three starvation rules over the same pending pods; each asks of the same snapshot with
    the same profile, so the second and third ask nothing new. A cluster is never changed in
    place (every change makes a new one), and the one kept is compared by identity and held,
    so its answers cannot be another cluster's."""
    return _last.get((cluster, policy), lambda: Diagnoser(cluster, policy))


def first_per_pod(findings: Iterable[Finding]) -> list[Finding]:
    """The findings with one starvation (or unsatisfiable) finding per pod: the first rule's
    (file order), so a high-priority pod that is also fragmented is reported (and alerted)
    once, by the high-priority rule when it comes first, as in the shipped file. Other kinds
    pass as they are."""
    seen: set[str] = set()
    out = []
    for f in findings:
        if f.kind in POD_KINDS:
            if f.subject in seen:
                continue
            seen.add(f.subject)
        out.append(f)
    return out


def _human(seconds: float) -> str:
    minutes = float(np.floor(seconds / 60))
    if minutes < 120:
        return f"{minutes:.0f} min"
    return f"{seconds / 3600:.1f} h"
