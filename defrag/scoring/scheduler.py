"""The scheduler: filter → score → select. The one placement engine every part of defrag calls."""

from __future__ import annotations

from collections import Counter

import numpy as np

from defrag.model.arrays import BoolArray, NodeArrays
from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.scoring.filters import feasible_mask, filter_masks, filter_reasons
from defrag.scoring.framework import NodeVerdict, Placement, Policy, Unschedulable
from defrag.scoring.policies import DEFAULT_POLICY, make_policy


def _arrays(target: Cluster | NodeArrays) -> NodeArrays:
    return target.arrays if isinstance(target, Cluster) else target


def _policy(policy: Policy | str) -> Policy:
    return make_policy(policy) if isinstance(policy, str) else policy


def schedule(
    pod: Pod,
    target: Cluster | NodeArrays,
    policy: Policy | str = DEFAULT_POLICY,
    *,
    exclude: BoolArray | None = None,
) -> Placement | Unschedulable:
    """Where ``pod`` goes: the feasible node with the highest score, ties to the first name.

    Nothing is changed; apply a placement with ``NodeArrays.allocate`` or
    ``Cluster.with_pod_bound``.
    """
    arrays = _arrays(target)
    pol = _policy(policy)
    feasible = feasible_mask(pod, arrays, exclude)
    if not feasible.any():
        return unschedulable(pod, arrays, exclude)
    scores = pol.score(pod, arrays, feasible)
    masked = np.where(feasible & ~np.isnan(scores), scores, -np.inf)
    row = int(np.argmax(masked))  # argmax returns the first maximum: rows are sorted by name
    if masked[row] == -np.inf:
        return unschedulable(pod, arrays, exclude)
    gpus = pol.choose_gpus(pod, arrays, row)
    return Placement(pod.key, arrays.names[row], row, gpus, float(scores[row]))


def unschedulable(pod: Pod, arrays: NodeArrays, exclude: BoolArray | None = None) -> Unschedulable:
    """Count, for each filter, the nodes where it is the first to reject the pod."""
    remaining = np.ones(len(arrays), dtype=bool)
    counts: Counter[str] = Counter()
    for reason, mask in filter_masks(pod, arrays, exclude):
        rejected = remaining & ~mask
        if rejected.any():
            counts[reason] += int(rejected.sum())
        remaining &= mask
    return Unschedulable(pod.key, dict(counts), len(arrays))


def explain(
    pod: Pod,
    target: Cluster | NodeArrays,
    policy: Policy | str = DEFAULT_POLICY,
    *,
    exclude: BoolArray | None = None,
) -> list[NodeVerdict]:
    """Every node's verdict for ``pod``: its score, or why it was filtered out."""
    arrays = _arrays(target)
    pol = _policy(policy)
    reasons = filter_reasons(pod, arrays, exclude)
    feasible = np.array([not r for r in reasons], dtype=bool)
    scores = pol.score(pod, arrays, feasible) if feasible.any() else np.zeros(len(arrays))
    return [
        NodeVerdict(name, float(scores[row]) if feasible[row] else None, reasons[row])
        for row, name in enumerate(arrays.names)
    ]


__all__ = ["explain", "feasible_mask", "schedule", "unschedulable"]
