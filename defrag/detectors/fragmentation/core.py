"""Fragmentation findings (docs/concepts.md): fragmented nodes, and a fragmented cluster.

A node is fragmented when it is partly used and at least ``node_stranded_min_gpus`` of its free
GPUs are stranded for a job size that matters (no job of that size can use them). Sizes that
matter: the rule's ``sizes``, plus the sizes of pending GPU pods when ``include_waiting`` — only
shapes some node could hold: a size larger than every node, or a pending pod no node could ever
hold (:mod:`defrag.scoring.satisfiable`; the starvation detector reports it as
``unsatisfiable``), strands nothing, since no repack would ever place it. Sizes larger than a
node are skipped for that node too (they never fit there, fragmented or not).

The cluster is fragmented when its stranded GPUs for a size that matters reach
``cluster_stranded_min_gpus``, or when it has fewer whole free nodes than
``min_whole_free_nodes`` although its free GPUs would fill that many nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from annotated_types import Ge, Gt

from defrag.detect.findings import Finding, Severity
from defrag.detect.settings import INTERNAL, Action
from defrag.model.cluster import Cluster
from defrag.plan.waiting import waiting
from defrag.scoring.fragmentation import (
    DEFAULT_SIZES,
    FragmentationReport,
    NodeFragmentation,
    fragmentation_report,
)
from defrag.scoring.profile import ScoringProfile
from defrag.scoring.satisfiable import largest_gpu_node

Sizes = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FragmentationParams:
    """The fragmentation detector's settings (rule-file names and meaning: docs/rules.md)."""

    name: Annotated[str, INTERNAL] = "gpu-fragmentation"
    severity: Severity = "warning"
    action: Action = "alert"
    sizes: tuple[Annotated[int, Ge(1)], ...] = (8,)
    include_waiting: bool = True
    node_stranded_min_gpus: Annotated[float, Gt(0)] = 2.0
    cluster_stranded_min_gpus: Annotated[float, Gt(0)] = 8.0
    min_whole_free_nodes: Annotated[int, Ge(0)] = 1


def sizes_that_matter(cluster: Cluster, params: FragmentationParams) -> tuple[int, ...]:
    """The rule's sizes and (``include_waiting``) the pending whole-GPU pods' sizes, each one
    some node could hold: no larger than the largest node, and of a pod some emptied node
    admits (its GPU model, selector, CPU and memory included)."""
    sizes = set(params.sizes)
    if params.include_waiting:
        # the snapshot's pending pods and whether each shape could ever fit, found once for the
        # starvation rules, this rule and the planner
        found = waiting(cluster)
        sizes |= {
            p.num_gpu
            for p in found.pods
            if p.num_gpu and not p.is_sharing and p.num_gpu not in sizes and found.fits_ever(p)
        }
    largest = largest_gpu_node(cluster.arrays)
    return tuple(sorted(k for k in sizes if k <= largest))


def detect_fragmentation(
    cluster: Cluster,
    params: FragmentationParams,
    now: datetime,
    report: FragmentationReport | None = None,
    *,
    profile: ScoringProfile,
) -> list[Finding]:
    """Fragmented nodes and a fragmented cluster; the FGD figure in the evidence is measured
    against ``profile.mix`` (the snapshot's one mix: the same figure as ``/metrics`` and
    ``defrag report``). ``report``: one already measured with that mix, reused if it has
    every size that matters."""
    sizes = sizes_that_matter(cluster, params)
    # A report with more sizes gives the same findings (they read the sizes that matter
    # alone): the default sizes' report is the one the cycle measures for its own figures.
    measured = DEFAULT_SIZES if set(sizes) <= set(DEFAULT_SIZES) else sizes
    rep = report or fragmentation_report(cluster, profile.mix, measured)
    missing = [k for k in sizes if k not in rep.stranded]
    if missing:
        rep = fragmentation_report(cluster, profile.mix, sizes)
    fitting: dict[int, Sizes] = {}  # by node size: the sizes that fit it
    findings = [
        f
        for n in rep.nodes
        if n.partly_used  # no other node has a finding
        and (f := _node_finding(n, _fitting(fitting, n.total, sizes), params, now)) is not None
    ]
    cluster_finding = _cluster_finding(rep, sizes, params, now)
    if cluster_finding is not None:
        findings.insert(0, cluster_finding)
    return findings


def _fitting(
    known: dict[int, tuple[int, ...]], total: int, sizes: tuple[int, ...]
) -> tuple[int, ...]:
    """The sizes no larger than a node of ``total`` GPUs (kept in ``known`` by node size)."""
    found = known.get(total)
    if found is None:
        found = known[total] = tuple(k for k in sizes if k <= total)
    return found


def _node_finding(
    node: NodeFragmentation, fitting: tuple[int, ...], params: FragmentationParams, now: datetime
) -> Finding | None:
    """A partly used node's finding, judged on the sizes that matter and fit it (ascending,
    each once, as :func:`sizes_that_matter` gives them)."""
    stranded = node.stranded
    worst, most = 0, -1
    for k in fitting:  # the most stranded, the larger size on a tie
        n = stranded.get(k, 0)
        if n >= most:
            worst, most = k, n
    if most < 0 or most < params.node_stranded_min_gpus:
        return None
    return Finding(
        kind="fragmentation",
        subject=f"node/{node.name}",
        severity=params.severity,
        summary=(
            f"node {node.name}: {stranded[worst]} of its {node.free} free GPU(s) are stranded for "
            f"{worst}-GPU jobs (largest placeable job {node.largest_job} of {node.total})"
        ),
        evidence={
            "total": node.total,
            "free": node.free,
            "free_share": round(node.free_share, 3),
            "largest_job": node.largest_job,
            "stranded": {str(k): node.stranded[k] for k in fitting},
            "size": worst,
            "fgd_fragmented": round(node.fgd_fragmented, 3),
        },
        since=now,
        labels={"node": node.name, "detector": "fragmentation", "rule": params.name},
        action=params.action,
    )


def _cluster_finding(
    rep: FragmentationReport, sizes: tuple[int, ...], params: FragmentationParams, now: datetime
) -> Finding | None:
    problems = []
    worst = max(sizes, key=lambda k: (rep.stranded.get(k, 0), k), default=None)
    if worst is not None and rep.stranded.get(worst, 0) >= params.cluster_stranded_min_gpus:
        problems.append(f"{rep.stranded[worst]} free GPU(s) stranded for {worst}-GPU jobs")
    node_size = max((n.total for n in rep.nodes), default=0)
    possible = rep.free_gpus // node_size if node_size else 0
    if rep.whole_free_nodes < params.min_whole_free_nodes <= possible:
        problems.append(
            f"{rep.whole_free_nodes} whole free node(s), below the target "
            f"{params.min_whole_free_nodes} although {rep.free_gpus} free GPUs would fill "
            f"{possible}"
        )
    if not problems:
        return None
    return Finding(
        kind="fragmentation",
        subject="cluster",
        severity=params.severity,
        summary="cluster fragmented: " + "; ".join(problems),
        evidence={
            "free_gpus": rep.free_gpus,
            "total_gpus": rep.total_gpus,
            "whole_free_nodes": rep.whole_free_nodes,
            "largest_placeable_job": rep.largest_placeable_job,
            "stranded": {str(k): rep.stranded[k] for k in sizes},
            "placeable": {str(k): rep.placeable[k] for k in sizes},
            # rounded as FragmentationReport.to_dict rounds it: the figure /metrics and
            # `defrag report` show, to the last digit
            "fgd_frag_pct_of_idle": round(rep.fgd_frag_pct_of_idle, 3),
            "sizes": list(sizes),
        },
        since=now,
        labels={"detector": "fragmentation", "rule": params.name},
        action=params.action,
    )
