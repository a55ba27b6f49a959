"""Spreading: does the cluster's scheduler spread GPU pods over nodes instead of packing them?

The answer is read from the placements the scheduler made, never guessed from its config:

1. **The window**: GPU pods bound in the last ``window`` (the bind time is the ``PodScheduled``
   condition's ``lastTransitionTime``, else the pod's creation), the latest
   ``max_placements``. Pods without either time are left out and counted.
2. **The replay**: from the cluster as it is, minus the window's pods (the state before the
   first of them), the window's pods are bound again in bind order, each on the node it
   really got. Before each bind, the scheduler's own score functions (:mod:`defrag.scoring`)
   rank the feasible nodes: ``least-allocated`` (the kube-scheduler default: it spreads) and
   the packing scores — ``most-allocated``, and the profile's policy (defrag's score) when
   that is not ``least-allocated``. The node the pod got *matches* a score when it ranks in
   that score's best ``top_share`` of the feasible nodes (its rank: the share of the other
   feasible nodes scoring higher, equals counted half). A placement is *informative* when it
   matches the spreading score or a packing score but not both (on an empty or uniform
   cluster every node ranks 0.5 and the placement says nothing); ``infeasible`` counts the
   placements whose node the replay finds infeasible (cordoned or changed since).
3. **The state**: free GPUs on partly used GPU nodes now, against the same free capacity
   ideally packed (at most one partly free node per node size, :func:`packed_bound`): the GPUs
   the placements strand beyond what packing could. O(nodes), like the replay's O(window ×
   nodes): the detector runs every cycle.

A finding when at least ``min_placements`` placements are informative, at least
``min_spread_share`` of them match the spreading score, and the cluster strands at least
``min_stranded_gpus`` GPUs more than the ideal packing. Fewer informative placements is thin
evidence: no finding, and the verdict says why (the rule is listed as skipped).

What the replay cannot see: pods that left since they were bound (in the window or before it)
are absent from the replayed states, so a node looks emptier in the replay than the scheduler
saw it. That is why a placement is judged by its node's rank, not by whether it was exactly a
score's top node: departures since move the top, rarely the half a node was in. The shares
are evidence, not proof; the bench (bench/bench_spreading.py,
docs/benchmarks.md) measures them on simulated clusters whose scheduler is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Literal

import numpy as np
from annotated_types import Ge, Gt, Le

from defrag.detect.findings import Finding, Severity
from defrag.detect.settings import INTERNAL, RuleName, Seconds
from defrag.detectors.spreading.placements import held, placements
from defrag.model.arrays import NodeArrays
from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.model.status import Status
from defrag.model.units import GPU_MILLI
from defrag.plan.patience import PACKING_KIND, SPREADING_KIND
from defrag.scoring.filters import feasible_mask
from defrag.scoring.framework import Policy
from defrag.scoring.profile import ScoringProfile
from defrag.scoring.scheduler import node_scores

SPREADING_POLICY = "least-allocated"
PACKING_POLICY = "most-allocated"
EXTENDER_DOCS = "docs/operations.md#scheduling-through-defrags-extender"
MOST_ALLOCATED_DOCS = "docs/kubernetes.md#mostallocated-for-gpus-without-the-extender"
MOST_ALLOCATED_COMPONENT = "deploy/components/most-allocated"

Match = Literal["spreading", "packing", "infeasible", "uninformative"]


@dataclass(frozen=True, slots=True)
class SpreadingParams:
    """The spreading detector's settings (rule-file names and meaning: docs/rules.md)."""

    name: Annotated[str, INTERNAL] = "gpu-pods-spread"
    severity: Severity = "info"
    action: Literal["alert"] = "alert"
    window_s: Annotated[Seconds, RuleName("window"), Gt(0)] = 86400.0
    max_placements: Annotated[int, Ge(1)] = 300
    min_placements: Annotated[int, Ge(1)] = 20
    min_spread_share: Annotated[float, Gt(0), Le(1)] = 0.6
    min_stranded_gpus: Annotated[float, Ge(0)] = 4.0
    min_pack_share: Annotated[float, Gt(0), Le(1)] = 0.85
    """The packing finding: share of the informative placements matching a packing score. In
    the simulator a packing scheduler's placements match 0.88–1.00 (0.76 at worst on one
    trace's held-out seed), placements at random among feasible nodes 0.64–0.82
    (docs/benchmarks.md, "Spreading scheduler detection")."""
    top_share: Annotated[float, Gt(0), Le(0.5)] = 0.5
    """A placement matches a score when its node ranks in the score's best ``top_share``."""


@dataclass(frozen=True, slots=True)
class Stranded:
    """Free GPUs on partly used GPU nodes, and how many such nodes."""

    gpus: int
    nodes: int


@dataclass(frozen=True, slots=True)
class Replay:
    """What replaying the window's placements found (the module's docstring)."""

    placements: int
    """GPU pods bound in the window, replayed."""
    undated: int
    """Bound GPU pods with neither a bind time nor a creation time (left out)."""
    informative: int
    """Placements that match the spreading score or a packing score, not both."""
    spreading: int
    packing: int
    infeasible: int
    """Placements on a node the replay finds infeasible (cordoned or changed since)."""
    stranded: Stranded
    packed: Stranded
    """The same free capacity ideally packed (:func:`packed_bound`)."""
    packing_policies: tuple[str, ...]
    packing_by: tuple[int, ...] = ()
    """Of the ``packing`` placements, how many ranked in each packing policy's best share (in
    the order of ``packing_policies``)."""

    @property
    def spread_share(self) -> float:
        return self.spreading / self.informative if self.informative else 0.0

    @property
    def pack_share(self) -> float:
        return self.packing / self.informative if self.informative else 0.0

    @property
    def excess_stranded(self) -> int:
        return self.stranded.gpus - self.packed.gpus


@dataclass(frozen=True, slots=True)
class Verdict:
    """The replay, whether it is enough evidence (``evidence``: the reasons when not), and the
    findings (one at most)."""

    replay: Replay
    evidence: Status
    findings: tuple[Finding, ...]


def window_pods(cluster: Cluster, params: SpreadingParams, now: datetime) -> tuple[list[Pod], int]:
    """The bound GPU pods of the window in bind order (ties by namespace and name), the latest
    ``max_placements``, and how many bound GPU pods have no time at all. The daemon runs this
    every cycle: the bound GPU pods are kept in bind order from snapshot to snapshot
    (:mod:`~defrag.detectors.spreading.placements`)."""
    since = now - timedelta(seconds=params.window_s)
    with held():
        found = placements(cluster)
        return found.latest(since, now, params.max_placements), found.undated


def stranded(arrays: NodeArrays) -> Stranded:
    """Free GPUs (shares summed, rounded down) on GPU nodes that are partly used (some share in
    use, some free): capacity no job that needs a whole node can use."""
    capacity = arrays.gpu_total.astype(np.int64) * GPU_MILLI
    free = arrays.free_share()
    partly = (capacity > 0) & (free > 0) & (free < capacity)
    return Stranded(int(free[partly].sum()) // GPU_MILLI, int(partly.sum()))


def rank(pod: Pod, row: int, arrays: NodeArrays, policy: Policy, feasible: np.ndarray) -> float:
    """Where ``row`` stands among the feasible nodes by ``policy``'s score: the share of the
    other feasible nodes that score higher, those that score the same counted half (0: its
    top node; 1: its last; 0.5: all equal — kube-scheduler picks among equals at random)."""
    scores = node_scores(pod, arrays, policy, feasible)
    others = feasible.copy()
    others[row] = False
    n = int(others.sum())
    if n == 0:
        return 0.5
    mine = scores[row]
    higher = int((scores[others] > mine).sum())
    equal = int((scores[others] == mine).sum())
    return (higher + 0.5 * equal) / n


def classify(
    pod: Pod,
    row: int,
    arrays: NodeArrays,
    spread: Policy,
    packing: Sequence[Policy],
    share: float,
) -> tuple[Match, tuple[bool, ...]]:
    """Which score the bind of ``pod`` on ``row`` matches, on ``arrays`` (the state just before
    it): the node ranks in the best ``share`` of the feasible nodes by that score (strictly)
    and not by the other kind; uninformative when it does for both or neither kind. With a
    ``packing`` match, which of ``packing`` the node ranks in the best ``share`` of (all False
    otherwise)."""
    none = (False,) * len(packing)
    feasible = feasible_mask(pod, arrays)
    if not feasible[row]:
        return "infeasible", none
    spreads = rank(pod, row, arrays, spread, feasible) < share
    each = tuple(rank(pod, row, arrays, p, feasible) < share for p in packing)
    if spreads == any(each):
        return "uninformative", none
    return ("spreading", none) if spreads else ("packing", each)


def packing_policies(profile: ScoringProfile) -> tuple[str, ...]:
    names = [PACKING_POLICY]
    if profile.name not in (SPREADING_POLICY, PACKING_POLICY):
        names.append(profile.name)
    return tuple(names)


def replay(
    cluster: Cluster, params: SpreadingParams, now: datetime, profile: ScoringProfile
) -> Replay:
    """Replay the window's placements (the module's docstring, steps 1–3)."""
    pods, undated = window_pods(cluster, params, now)
    start = cluster.arrays.copy()
    rows = [start.index[p.node] for p in pods if p.node is not None]
    for pod, row in zip(pods, rows, strict=True):
        start.release(row, pod, pod.gpu_indices)
    names = packing_policies(profile)
    spread = profile.reference(SPREADING_POLICY)
    packers = [profile.reference(n) for n in names]
    counts = {"spreading": 0, "packing": 0, "infeasible": 0, "uninformative": 0}
    by_packer = [0] * len(packers)
    actual = start.copy()
    for pod, row in zip(pods, rows, strict=True):
        match, each = classify(pod, row, actual, spread, packers, params.top_share)
        counts[match] += 1
        by_packer = [n + hit for n, hit in zip(by_packer, each, strict=True)]
        actual.allocate(row, pod, pod.gpu_indices)
    return Replay(
        placements=len(pods),
        undated=undated,
        informative=counts["spreading"] + counts["packing"],
        spreading=counts["spreading"],
        packing=counts["packing"],
        infeasible=counts["infeasible"],
        stranded=stranded(actual),
        packed=packed_bound(actual),
        packing_policies=names,
        packing_by=tuple(by_packer),
    )


def packed_bound(arrays: NodeArrays) -> Stranded:
    """The same free capacity ideally packed: for each node size, the free GPU shares of its
    nodes filled into as few nodes as they make, so at most one node of each size is partly
    free (the remainder). A bound no scheduler beats; the constraints (models, taints) and the
    pods' shapes it ignores only make real packing strand more."""
    gpus, nodes = 0, 0
    capacity = arrays.gpu_total.astype(np.int64)
    free = arrays.free_share()
    for size in np.unique(capacity[capacity > 0]):
        rest = int(free[capacity == size].sum()) % (int(size) * GPU_MILLI)
        gpus += rest // GPU_MILLI
        nodes += rest > 0
    return Stranded(gpus, nodes)


def judge(rep: Replay, params: SpreadingParams) -> Status:
    """Whether the replay is enough evidence to decide: ok, or why not."""
    if rep.informative >= params.min_placements:
        return Status.success()
    window = _human(params.window_s)
    why = (
        f"insufficient evidence: {rep.informative} informative placement(s) of "
        f"{rep.placements} GPU pod(s) bound in the last {window} (spreading and packing scores "
        f"agree on the rest); the rule needs {params.min_placements}"
    )
    if rep.undated:
        why += f"; {rep.undated} bound GPU pod(s) have no bind or creation time"
    return Status.fail(why)


def detect_spreading(
    cluster: Cluster, params: SpreadingParams, now: datetime, *, profile: ScoringProfile
) -> Verdict:
    """The verdict on the cluster's scheduler (see the module's docstring)."""
    rep = replay(cluster, params, now, profile)
    evidence = judge(rep, params)
    spreads = (
        evidence.ok
        and rep.spread_share >= params.min_spread_share
        and rep.excess_stranded >= params.min_stranded_gpus
    )
    packs = evidence.ok and rep.pack_share >= params.min_pack_share
    findings = (
        (_finding(rep, params, now),)
        if spreads
        else (_packing_finding(rep, params, now),)
        if packs
        else ()
    )
    return Verdict(rep, evidence, findings)


PACKING = PACKING_KIND
"""The finding kind that says the scheduler packs GPU pods (never alerted): make-room's
patience reads it (:mod:`defrag.plan.patience`)."""


def _packing_finding(rep: Replay, params: SpreadingParams, now: datetime) -> Finding:
    """The scheduler packs: at least ``min_pack_share`` of the informative placements went to
    a node in a packing score's best ``top_share`` (the spreading finding's mirror)."""
    each = ", ".join(
        f"{n} in {name}'s" for name, n in zip(rep.packing_policies, rep.packing_by, strict=True)
    )
    summary = (
        f"the scheduler packs GPU pods: of {rep.informative} informative placement(s) in the "
        f"last {_human(params.window_s)}, {rep.packing} ({rep.pack_share:.0%}) went to a node "
        f"in a packing score's best {params.top_share:.0%} of the feasible nodes ({each}), "
        f"{rep.spreading} ({rep.spread_share:.0%}) to one in {SPREADING_POLICY}'s"
    )
    evidence = {
        **_counts(rep),
        "pack_share": round(rep.pack_share, 3),
        "packing_policies": list(rep.packing_policies),
        "packing_by": list(rep.packing_by),
        "window_s": params.window_s,
    }
    return _cluster_finding(PACKING, "info", summary, evidence, params, now)


def _finding(rep: Replay, params: SpreadingParams, now: datetime) -> Finding:
    packers = " / ".join(rep.packing_policies)
    best = f"best {params.top_share:.0%} of the feasible nodes"
    summary = (
        f"the scheduler spreads GPU pods: of {rep.informative} informative placement(s) in the "
        f"last {_human(params.window_s)}, {rep.spreading} ({rep.spread_share:.0%}) went to a "
        f"node in {SPREADING_POLICY}'s {best}, {rep.packing} ({rep.pack_share:.0%}) to one in "
        f"{packers}'s; {rep.stranded.gpus} free GPU(s) stranded on {rep.stranded.nodes} partly "
        f"used node(s), {rep.packed.gpus} on {rep.packed.nodes} were the free capacity ideally "
        f"packed. Remedies: install defrag's scheduler extender "
        f"({EXTENDER_DOCS}), or set MostAllocated weights for nvidia.com/gpu in the default "
        f"profile ({MOST_ALLOCATED_COMPONENT}, {MOST_ALLOCATED_DOCS})"
    )
    evidence = {
        **_counts(rep),
        "infeasible": rep.infeasible,
        "spread_share": round(rep.spread_share, 3),
        "pack_share": round(rep.pack_share, 3),
        "spreading_policy": SPREADING_POLICY,
        "packing_policies": list(rep.packing_policies),
        "stranded_gpus": rep.stranded.gpus,
        "partly_used_nodes": rep.stranded.nodes,
        "packed_stranded_gpus": rep.packed.gpus,
        "packed_partly_used_nodes": rep.packed.nodes,
        "window_s": params.window_s,
        "remedies": [
            f"install defrag's scheduler extender: {EXTENDER_DOCS}",
            "set MostAllocated weights for nvidia.com/gpu in the default profile: "
            f"{MOST_ALLOCATED_COMPONENT} ({MOST_ALLOCATED_DOCS})",
        ],
    }
    return _cluster_finding(SPREADING_KIND, params.severity, summary, evidence, params, now)


def _counts(rep: Replay) -> dict[str, int]:
    """The replay's placement counts, as both findings' evidence opens."""
    return {
        "placements": rep.placements,
        "informative": rep.informative,
        "spreading": rep.spreading,
        "packing": rep.packing,
    }


def _cluster_finding(
    kind: str,
    severity: Severity,
    summary: str,
    evidence: dict[str, object],
    params: SpreadingParams,
    now: datetime,
) -> Finding:
    """A finding of this rule about the cluster (the spreading and the packing one)."""
    return Finding(
        kind=kind,
        subject="cluster",
        severity=severity,
        summary=summary,
        evidence=evidence,
        since=now,
        labels={"detector": "spreading", "rule": params.name},
        action=params.action,
    )


def _human(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min"
