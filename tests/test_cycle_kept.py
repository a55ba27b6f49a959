"""What a later cycle keeps from the last snapshot gives what was made from nothing, through any
sequence of clusters.

- the fragmentation report: kept per cluster, and its node rows reused where a node's figures
  did not change (from the last report: the snapshot before, or a plan's workspace);
- the workload mix (``WorkloadMix.observed``): the GPU pods' shape counts brought up to the
  next snapshot by the pods that changed;
- the spreading rule's window (``window_pods``): the bound GPU pods kept in bind order;
- the fragmentation rule: its sizes asked per pod shape, the cycle's report reused, each node
  judged without a key function per size;
- the nodes emptied (and whether each pod shape could ever fit them), kept while the parts of
  the nodes they are made from are the same;
- the pods that changed between two mappings (``changed_keys``), shared by those that keep.

Each reference below is the code as it was before anything was kept: a walk over every pod or
node. The sequences are tests/test_plan_seating.py's (pods ending, starting, finished,
Terminating, replaced; nodes added and removed; every pod rebuilt as a new object).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from defrag.detect.findings import Finding
from defrag.detectors.fragmentation import core as fragmentation_core
from defrag.detectors.fragmentation.core import FragmentationParams, detect_fragmentation
from defrag.detectors.spreading.core import SpreadingParams, window_pods
from defrag.model.arrays import NodeArrays
from defrag.model.cluster import Cluster, occupies
from defrag.model.podchanges import changed_keys, walked
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.plan.waiting import EMPTIED_FROM, Waiting
from defrag.scoring.fragmentation import (
    DEFAULT_SIZES,
    FragmentationReport,
    NodeFragmentation,
    fgd_node_fragmentation,
    fragmentation_report,
    placeable_per_node,
    pool_usage,
)
from defrag.scoring.profile import ProfileConfig
from defrag.scoring.satisfiable import empty_nodes, largest_gpu_node, satisfiable
from tests.test_plan_seating import sequences
from tests.test_plan_support import NOW, gpu_node, running
from tests.test_pod_shapes import with_pending

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_report(
    target: Cluster | NodeArrays, mix: WorkloadMix, sizes: Sequence[int] = DEFAULT_SIZES
) -> FragmentationReport:
    """The report as it was measured before anything was kept: a row made per node."""
    arrays = target.arrays if isinstance(target, Cluster) else target
    gpu_rows = arrays.gpu_total > 0
    free_whole = arrays.free_whole_count()
    share = arrays.free_share() / GPU_MILLI
    largest = arrays.largest_job()
    placeable = {k: placeable_per_node(arrays, k) for k in sizes}
    stranded = {k: free_whole - k * placeable[k] for k in sizes}
    frag = fgd_node_fragmentation(arrays, mix) / GPU_MILLI
    idle = float(share[gpu_rows].sum())
    nodes = tuple(
        NodeFragmentation(
            name=arrays.names[i],
            total=int(arrays.gpu_total[i]),
            free=int(free_whole[i]),
            free_share=float(share[i]),
            largest_job=int(largest[i]),
            stranded={k: int(stranded[k][i]) for k in sizes},
            fgd_fragmented=float(frag[i]),
        )
        for i in np.flatnonzero(gpu_rows)
    )
    fragmented = float(frag[gpu_rows].sum())
    return FragmentationReport(
        total_gpus=int(arrays.gpu_total.sum()),
        free_gpus=int(free_whole.sum()),
        free_gpu_share=float(share.sum()),
        whole_free_nodes=int(((free_whole == arrays.gpu_total) & gpu_rows).sum()),
        gpu_nodes=int(gpu_rows.sum()),
        largest_placeable_job=int(largest.max(initial=0)),
        placeable={k: int(v.sum()) for k, v in placeable.items()},
        stranded={k: int(v.sum()) for k, v in stranded.items()},
        fgd_fragmented_gpus=fragmented,
        fgd_frag_pct_of_idle=100.0 * fragmented / idle if idle > 0 else 0.0,
        nodes=nodes,
        pools=pool_usage(arrays),
    )


def reference_dict(node: NodeFragmentation) -> dict[str, object]:
    """A node row's dict as ``to_dict`` made it each time."""
    return {
        "name": node.name,
        "total": node.total,
        "free": node.free,
        "free_share": round(node.free_share, 3),
        "largest_job": node.largest_job,
        "stranded": {str(k): v for k, v in node.stranded.items()},
        "fgd_fragmented": round(node.fgd_fragmented, 3),
    }


def assert_same_report(made: FragmentationReport, ref: FragmentationReport) -> None:
    assert made == ref
    assert [(type(n.free_share), type(n.fgd_fragmented)) for n in made.nodes] == [
        (float, float) for _ in ref.nodes
    ]
    assert made.to_dict() == ref.to_dict(with_nodes=False) | {
        "nodes": [reference_dict(n) for n in ref.nodes]
    }
    assert made.to_dict(with_nodes=False) == ref.to_dict(with_nodes=False)


SIZES = st.sampled_from([DEFAULT_SIZES, (8,), (2, 3), (), (1, 2, 4, 8, 16)])


@SETTINGS
@given(sequences(), SIZES, st.data())
def test_reports_through_a_sequence_of_clusters_are_the_ones_measured_from_nothing(
    clusters: list[Cluster], sizes: tuple[int, ...], data: st.DataObject
) -> None:
    """At each step: the cluster's report (asked twice: the second is the kept one), then a
    workspace's arrays changed from it (a plan's after: a pod moved off, another put on)."""
    for c in clusters:
        mix = WorkloadMix.observed(c.pods.values())
        first = fragmentation_report(c, mix, sizes)
        assert fragmentation_report(c, mix, sizes) is first
        assert_same_report(first, reference_report(c, mix, sizes))
        bound = sorted(c.bound_pods(), key=lambda p: p.key)
        if not bound:
            continue
        arrays = c.arrays.copy()
        pod = data.draw(st.sampled_from(bound))
        arrays.release(arrays.index[pod.node], pod, pod.gpu_indices)  # type: ignore[index]
        assert_same_report(
            fragmentation_report(arrays, mix, sizes), reference_report(arrays, mix, sizes)
        )
        row = data.draw(st.integers(0, len(arrays) - 1))
        arrays.gpu_free[row] = arrays.gpu_total[row] * 0  # changed in place after a measure
        arrays.share_free[row] = 0
        arrays.whole_count[row] = 0
        arrays.domain_whole[row] = 0
        assert_same_report(
            fragmentation_report(arrays, mix, sizes), reference_report(arrays, mix, sizes)
        )


def test_a_report_for_another_mix_or_sizes_is_measured_again() -> None:
    c = Cluster.build([gpu_node("n0"), gpu_node("n1")], [running("a", "n0", 3)])
    mix = WorkloadMix.observed(c.pods.values())
    kept = fragmentation_report(c, mix, (1, 2))
    assert fragmentation_report(c, WorkloadMix.default(), (1, 2)) is not kept
    assert fragmentation_report(c, mix, (1, 2, 4)).stranded.keys() == {1, 2, 4}
    other = c.with_pod_added(running("b", "n1", 5))
    assert fragmentation_report(other, mix, (1, 2)) == reference_report(other, mix, (1, 2))


def reference_mix(pods: Sequence[Pod]) -> WorkloadMix:
    """``observed`` as it counted every pod each time."""
    gpu_pods = [p for p in pods if p.num_gpu]
    return WorkloadMix.from_pods(gpu_pods) if gpu_pods else WorkloadMix.default()


@SETTINGS
@given(sequences(), st.data())
def test_the_kept_mix_is_the_one_counted_from_every_pod(
    clusters: list[Cluster], data: st.DataObject
) -> None:
    """Through the snapshots, back to an earlier one, and for a plain dict changed in place
    between two asks (the kept count is of a copy)."""
    order = [*clusters, *data.draw(st.lists(st.sampled_from(clusters), max_size=3))]
    for c in order:
        assert WorkloadMix.observed(c.pods.values()) == reference_mix(list(c.pods.values()))
    pods = dict(order[-1].pods)
    assert WorkloadMix.observed(pods.values()) == reference_mix(list(pods.values()))
    for key in data.draw(st.lists(st.sampled_from(sorted(pods) or ["none"]), max_size=3)):
        pod = pods.pop(key, None)
        if pod is not None and data.draw(st.booleans()):
            pods[key] = replace(pod, num_gpu=pod.num_gpu + 1)
    assert WorkloadMix.observed(pods.values()) == reference_mix(list(pods.values()))
    assert WorkloadMix.observed(list(pods.values())) == reference_mix(list(pods.values()))


def reference_window(
    cluster: Cluster, params: SpreadingParams, now: datetime
) -> tuple[list[Pod], int]:
    """``window_pods`` as it walked every pod each cycle."""
    since = now - timedelta(seconds=params.window_s)
    dated: list[tuple[datetime, str, Pod]] = []
    undated = 0
    for pod in cluster.pods.values():
        if pod.node is None or not (pod.num_gpu or pod.pool_units) or not occupies(pod):
            continue
        at = pod.scheduled_at or pod.created_at
        if at is None:
            undated += 1
        elif since <= at <= now:
            dated.append((at, pod.name, pod))
    latest = heapq.nlargest(
        params.max_placements, dated, key=lambda e: (e[0], e[2].namespace, e[1])
    )
    return [p for _, _, p in reversed(latest)], undated


ZONES = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
BASE = NOW - timedelta(hours=30)
MOMENTS = st.one_of(
    st.none(),
    st.builds(
        lambda h, zone: (BASE + timedelta(hours=h)).astimezone(zone),
        st.sampled_from([0, 6, 10, 20, 20, 29, 30, 31]),  # ties, the window's edges, the future
        st.sampled_from(ZONES),
    ),
)


@st.composite
def bound_sequences(draw: st.DrawFn) -> list[Cluster]:
    """A cluster of bound pods (GPU and not, finished, with bind times or without, many at one
    moment) and 1–6 changed versions of it."""
    nodes = [gpu_node(f"n{i}", 8) for i in range(3)]

    def pod(i: int) -> Pod:
        p = running(
            f"p{i}", f"n{draw(st.integers(0, 2))}", draw(st.sampled_from([0, 1, 1])),
            namespace=draw(st.sampled_from(["a", "b"])), cpu=100,
        )  # fmt: skip
        when = draw(MOMENTS)
        p = replace(p, created_at=when, scheduled_at=draw(st.sampled_from([None, when])))
        return replace(p, phase="Succeeded") if draw(st.integers(0, 6)) == 0 else p

    c = Cluster.build(nodes, [pod(i) for i in range(draw(st.integers(0, 20)))])
    out = [c]
    made = 100
    for _ in range(draw(st.integers(1, 6))):
        for _ in range(draw(st.integers(0, 4))):
            keys = sorted(c.pods)
            if keys and draw(st.booleans()):
                c = c.with_pod_removed(draw(st.sampled_from(keys)))
            else:
                made += 1
                try:
                    c = c.with_pod_added(pod(made))
                except Exception:  # GPUs overcommitted: not a cluster the source gives
                    continue
        if draw(st.integers(0, 4)) == 0:
            c = Cluster.build(c.nodes, c.pods.values())  # every pod a new object
        out.append(c)
    return out


@SETTINGS
@given(bound_sequences(), st.integers(1, 6), st.sampled_from([3600.0, 86400.0]))
def test_the_kept_window_is_the_one_walked(
    clusters: list[Cluster], most: int, window_s: float
) -> None:
    params = SpreadingParams(max_placements=most, window_s=window_s)
    for c in [*clusters, clusters[0]]:
        pods, undated = window_pods(c, params, NOW)
        ref, ref_undated = reference_window(c, params, NOW)
        assert [p.key for p in pods] == [p.key for p in ref]
        assert all(a is b for a, b in zip(pods, ref, strict=True))
        assert undated == ref_undated


@SETTINGS
@given(sequences(), st.integers(0, 5))
def test_the_changed_keys_are_the_pods_that_differ(clusters: list[Cluster], limit: int) -> None:
    for old, new in pairwise(clusters):
        differ = {
            k for k in old.pods.keys() | new.pods.keys() if old.pods.get(k) is not new.pods.get(k)
        }
        assert sorted(walked(old.pods, new.pods)) == sorted(differ)
        for _ in range(2):  # the second ask is the kept answer
            found = changed_keys(old.pods, new.pods, limit)
            assert found == (None if len(differ) > limit else walked(old.pods, new.pods))
    assert changed_keys(clusters[0].pods, clusters[0].pods, 0) == []


def reference_node_finding(
    node: NodeFragmentation, sizes: tuple[int, ...], params: FragmentationParams, now: datetime
) -> Finding | None:
    """A node's finding as the rule judged it before (every node, a key function per size)."""
    if not node.partly_used:
        return None
    fitting = [k for k in sizes if k <= node.total]
    worst = max(fitting, key=lambda k: (node.stranded.get(k, 0), k), default=None)
    if worst is None or node.stranded.get(worst, 0) < params.node_stranded_min_gpus:
        return None
    return Finding(
        kind="fragmentation",
        subject=f"node/{node.name}",
        severity=params.severity,
        summary=(
            f"node {node.name}: {node.stranded[worst]} of its {node.free} free GPU(s) are "
            f"stranded for {worst}-GPU jobs (largest placeable job {node.largest_job} of "
            f"{node.total})"
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


def reference_fragmentation(c: Cluster, params: FragmentationParams) -> list[Finding]:
    """The fragmentation rule as it was: sizes asked pod by pod, a report of those sizes
    measured from nothing, every node judged."""
    sizes_set = set(params.sizes)
    if params.include_waiting:
        empty = empty_nodes(c)
        sizes_set |= {
            p.num_gpu
            for p in c.pending_pods()
            if p.num_gpu and not p.is_sharing and satisfiable(p, empty).ok
        }
    largest = largest_gpu_node(c.arrays)
    sizes = tuple(sorted(k for k in sizes_set if k <= largest))
    mix = ProfileConfig().for_cluster(c).mix
    rep = reference_report(c, mix, sizes)
    found = [f for n in rep.nodes if (f := reference_node_finding(n, sizes, params, NOW))]
    whole = fragmentation_core._cluster_finding(rep, sizes, params, NOW)
    return [whole, *found] if whole is not None else found


@SETTINGS
@given(
    with_pending(),
    st.sampled_from([(8,), (1, 2, 4, 8), (3,), (16, 2), (2, 4)]),
    st.booleans(),
    st.sampled_from([1.0, 2.0, 3.0]),
)
def test_the_fragmentation_rules_findings_are_the_ones_judged_node_by_node(
    c: Cluster, sizes: tuple[int, ...], waiting_too: bool, node_min: float
) -> None:
    params = FragmentationParams(
        sizes=sizes, include_waiting=waiting_too, node_stranded_min_gpus=node_min,
        cluster_stranded_min_gpus=4.0,
    )  # fmt: skip
    profile = ProfileConfig().for_cluster(c)
    fragmentation_report(c, profile.mix)  # the cycle's own figures first, as the daemon asks
    found = detect_fragmentation(c, params, NOW, profile=profile)
    assert found == reference_fragmentation(c, params)


def _same_arrays(a: NodeArrays, b: NodeArrays) -> None:
    for f in fields(NodeArrays):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


@SETTINGS
@given(sequences())
def test_the_kept_emptied_nodes_are_the_ones_emptied_now(clusters: list[Cluster]) -> None:
    """Through snapshots (nodes added and removed among them) and back to the first: the
    nodes emptied and each pending pod's answer, as made from the snapshot itself."""
    for c in [*clusters, clusters[0]]:
        found = Waiting(c)
        _same_arrays(found.empty(), empty_nodes(c))
        empty = empty_nodes(c)
        for pod in [*c.pending_pods(), *c.bound_pods()]:
            assert found.fits_ever(pod) == satisfiable(pod, empty).ok


def test_emptied_nodes_made_from_changed_values_are_made_again() -> None:
    """Kept while only pods change; a part changed in place (the same object, other values)
    is not served from the kept."""
    c = Cluster.build([gpu_node("n0", 8), gpu_node("n1", 4)], [running("a", "n0", 2)])
    first = Waiting(c).empty()
    later = c.with_pod_removed("default/a").with_pod_added(running("b", "n1", 1))
    assert Waiting(later).empty() is first
    c.arrays.cpu_total[1] = 1  # no cluster does this: the guard is for a source that would
    again = Waiting(c).empty()
    assert again is not first and int(again.cpu_free[1]) == 1


def test_every_part_of_the_arrays_is_read_by_emptied_or_made_free() -> None:
    """A field added to NodeArrays must be named here or in EMPTIED_FROM (emptied may read it:
    the kept emptied nodes would not see it change)."""
    made_free = {
        "gpu_free", "cpu_free", "mem_free", "schedulable", "tainted_rows", "pool_free",
        "whole_count", "share_free", "domain_whole", "share_max",
    }  # fmt: skip
    assert {f.name for f in fields(NodeArrays)} == set(EMPTIED_FROM) | made_free
