"""The scheduler: filter → score → select. The one placement engine every part of defrag calls."""

from __future__ import annotations

from collections import Counter
from typing import cast

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays
from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.scoring.filters import feasible_mask, filter_masks, filter_reasons
from defrag.scoring.framework import (
    FreshScores,
    NodeVerdict,
    Placement,
    Policy,
    TieBreak,
    Unschedulable,
)
from defrag.scoring.policies.reserve_binpack import seed_score


def _arrays(target: Cluster | NodeArrays) -> NodeArrays:
    return target.arrays if isinstance(target, Cluster) else target


def schedule(
    pod: Pod,
    target: Cluster | NodeArrays,
    policy: Policy,
    *,
    exclude: BoolArray | None = None,
    why: bool = True,
) -> Placement | Unschedulable:
    """Where ``pod`` goes: the feasible node with the highest score; among equals the one the
    policy's :class:`~defrag.scoring.framework.TieBreak` ranks first, else the first name.

    ``why``: when no node fits, count each filter's rejections (:func:`unschedulable`); a
    caller that does not read them passes False and gets an ``Unschedulable`` without them.

    ``policy`` is a built score function — a :class:`~defrag.scoring.profile.ScoringProfile`'s
    ``policy``, never a name: the profile is built once per snapshot, so every caller scores
    with the same mix and arguments. Nothing is changed; apply a placement with
    ``NodeArrays.allocate`` or ``Cluster.with_pod_bound``.
    """
    arrays = _arrays(target)
    feasible = feasible_mask(pod, arrays, exclude)
    if not feasible.any():
        return _no_fit(pod, arrays, exclude, why)
    fresh = _fresh_scores(pod, arrays, policy)
    if fresh is not None:
        return _one_pass(pod, arrays, policy, feasible, fresh)
    scores = node_scores(pod, arrays, policy, feasible)
    row = select(scores, feasible, tie_order(pod, arrays, policy))
    if row is None:
        return _no_fit(pod, arrays, exclude, why)
    gpus = () if arrays.pool_use(pod, row) is not None else policy.choose_gpus(pod, arrays, row)
    return Placement(pod.key, arrays.names[row], row, gpus, int(scores[row]))


def _fresh_scores(pod: Pod, arrays: NodeArrays, policy: Policy) -> FloatArray | None:
    """The policy's scores for the one-pass path, or None where it does not apply: a policy
    without :class:`~defrag.scoring.framework.FreshScores`, or GPU pools in play (pooled rows
    are scored by the pool rule, :func:`node_scores`)."""
    if pod.pool or arrays.pool_names or not hasattr(policy, "fresh_scores"):
        return None
    return cast(FreshScores, policy).fresh_scores(pod, arrays)


def _one_pass(
    pod: Pod, arrays: NodeArrays, policy: Policy, feasible: BoolArray, scores: FloatArray
) -> Placement:
    """:func:`schedule` where some row is feasible and ``scores`` are fresh, numbers, ≥ 0 on
    every feasible row: truncated in place, the infeasible rows set below every feasible
    score, the first maximum taken —
    the row and score :func:`node_scores` and :func:`select` give, with no NaN pass, no copy
    of the scores and no pool rule."""
    np.trunc(scores, out=scores)
    masked = np.where(feasible, scores, -1.0)
    row = int(masked.argmax())  # argmax returns the first maximum
    ties = tie_order(pod, arrays, policy)
    if ties is not None:
        row = _first_in_tie_order(masked, float(masked[row]), ties)
    gpus = policy.choose_gpus(pod, arrays, row)
    return Placement(pod.key, arrays.names[row], row, gpus, int(scores[row]))


def select(scores: FloatArray, feasible: BoolArray, ties: FloatArray | None = None) -> int | None:
    """The row :func:`schedule` picks from computed scores: the feasible row with the highest
    score (NaN never wins); among equals the highest of ``ties`` (the policy's
    :func:`tie_order`), the first of equals (rows are sorted by name); None when none."""
    masked = np.where(feasible, scores, -np.inf)
    row = int(masked.argmax())  # argmax returns the first maximum
    best = float(masked[row])
    if best != best:  # a NaN (a policy's 0/0): argmax stops there; drop them and look again
        masked = np.where(np.isnan(masked), -np.inf, masked)
        row = int(masked.argmax())
        best = float(masked[row])
    if best == -np.inf:
        return None
    return row if ties is None else _first_in_tie_order(masked, best, ties)


def tie_order(pod: Pod, arrays: NodeArrays, policy: Policy) -> FloatArray | None:
    """The policy's order among nodes of equal score (:class:`TieBreak`); None: name order."""
    return cast(TieBreak, policy).tie_order(pod, arrays) if hasattr(policy, "tie_order") else None


def _first_in_tie_order(masked: FloatArray, best: float, ties: FloatArray) -> int:
    """Among the rows whose ``masked`` score is ``best``, the first of the highest ``ties``."""
    return int(np.where(masked == best, ties, -np.inf).argmax())


def _no_fit(pod: Pod, arrays: NodeArrays, exclude: BoolArray | None, why: bool) -> Unschedulable:
    return unschedulable(pod, arrays, exclude) if why else Unschedulable(pod.key, {}, len(arrays))


def node_scores(pod: Pod, arrays: NodeArrays, policy: Policy, feasible: BoolArray) -> FloatArray:
    """Every node's score for ``pod``: integers in 0..100, truncated as the seed's Go code and
    kube-scheduler (int64 scores) compute them — ``int(62.5)`` is 62.

    Rows where the pod draws from a GPU pool (a MIG profile, time-sliced replicas) are scored
    by the seed's bin-pack rule over that pool's units under every policy: the paper's
    policies know no pools.
    """
    pooled = arrays.pool_rows(pod)
    scores = np.zeros(len(arrays)) if pod.pool else policy.score(pod, arrays, feasible)
    if pooled is not None and pooled[0] >= 0:
        col, rows = pooled
        units = pod.pool_units if pod.pool else pod.num_gpu
        total, free = arrays.pool_total[:, col], arrays.pool_free[:, col]
        in_pool = seed_score(units, total, free, free >= total)
        scores = np.where(rows, in_pool, scores)
    return np.asarray(np.trunc(scores), dtype=np.float64)


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
    policy: Policy,
    *,
    exclude: BoolArray | None = None,
) -> list[NodeVerdict]:
    """Every node's verdict for ``pod``: its score, or why it was filtered out (``policy``: a
    profile's built score function, as for :func:`schedule`)."""
    arrays = _arrays(target)
    pol = policy
    reasons = filter_reasons(pod, arrays, exclude)
    feasible = np.array([not r for r in reasons], dtype=bool)
    scores = node_scores(pod, arrays, pol, feasible) if feasible.any() else np.zeros(len(arrays))
    return [
        NodeVerdict(name, int(scores[row]) if feasible[row] else None, reasons[row])
        for row, name in enumerate(arrays.names)
    ]


__all__ = [
    "explain",
    "feasible_mask",
    "node_scores",
    "schedule",
    "select",
    "tie_order",
    "unschedulable",
]
