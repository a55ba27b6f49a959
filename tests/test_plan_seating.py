"""The kept seating: a workspace made from the seating brought up to a cluster is the workspace
made from nothing, through any sequence of clusters.

``Workspace.from_cluster`` starts from :func:`defrag.plan.seating.seating`, which keeps the
last cluster's seating and changes only the pods whose object differs. The reference below is
the workspace as it was made before the seating was kept: every bound pod walked in key
order. Random sequences of changes (pods ending, starting, bound, pending, finished,
Terminating, in and out of gangs; nodes added and removed) must give the same rows in the same
order, the same seats, gangs, CPU sums and Terminating pods at every step.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from defrag.model.cluster import Cluster
from defrag.model.resources import RESERVED_FOR_ANNOTATION, Node, Pod
from defrag.plan import seating as seating_module
from defrag.plan.constraints import gang_of
from defrag.plan.departures import Departures
from defrag.plan.seating import Seat, departures_of, seating, seating_of
from defrag.plan.workspace import Workspace
from tests.test_plan_support import NOW, gpu_node, pending, running

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference(cluster: Cluster) -> Workspace:
    """The workspace made from nothing, as ``from_cluster`` made it before the seating was
    kept."""
    arrays = cluster.arrays.copy()
    rows: list[dict[str, Seat]] = [{} for _ in range(len(arrays))]
    gangs: dict[str, list[str]] = defaultdict(list)
    index = arrays.index
    for key, pod in sorted((p.key, p) for p in cluster.bound_pods()):
        row = index[pod.node]  # type: ignore[index]
        rows[row][key] = Seat(pod, row, pod.gpu_indices)
        gang = gang_of(pod)
        if gang:
            gangs[gang].append(key)
    for pod in cluster.pending_pods():
        gang = gang_of(pod)
        if gang:
            gangs[gang].append(pod.key)
    ws = Workspace(arrays, rows, {g: tuple(sorted(keys)) for g, keys in gangs.items()})
    ws.reserved_for = {
        index[n.name]: n.annotations[RESERVED_FOR_ANNOTATION]
        for n in cluster.nodes
        if n.annotations.get(RESERVED_FOR_ANNOTATION) and n.name in index
    }
    return ws


def _seats(seats: dict[str, Seat]) -> list[tuple[str, int, int, tuple[int, ...]]]:
    """A row (or ``where``) in order: key, the pod object's identity, row, GPUs."""
    return [(k, id(s.pod), s.row, s.gpus) for k, s in seats.items()]


def assert_same(made: Workspace, ref: Workspace) -> None:
    assert [_seats(r) for r in made.rows] == [_seats(r) for r in ref.rows]  # type: ignore[arg-type]
    # read by key, or walked into a set (moved_keys): the order of `where` is not kept
    assert sorted(_seats(made.where)) == sorted(_seats(ref.where))  # type: ignore[arg-type]
    assert sorted(_seats(made._initial)) == sorted(_seats(ref._initial))  # type: ignore[arg-type]
    assert made.moved_keys() == ref.moved_keys() == frozenset()
    assert made.leaving() == ref.leaving()
    for k, seat in made.where.items():  # the seats `moved` compares are the rows' own
        assert made.rows[seat.row][k] is seat and made._initial[k] is seat
    assert dict(made.gangs) == dict(ref.gangs)
    assert np.array_equal(made.gpuless_cpu, ref.gpuless_cpu)
    assert made._terminating == ref._terminating
    assert made.reserved_for == ref.reserved_for
    assert np.array_equal(made.arrays.gpu_free, ref.arrays.gpu_free)
    assert np.array_equal(made.arrays.cpu_free, ref.arrays.cpu_free)


NAMES = [f"n{i}" for i in range(5)]
ZONES = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
MOMENTS = st.one_of(
    st.none(),
    st.datetimes(datetime(2026, 11, 1), datetime(2026, 12, 1), timezones=st.sampled_from(ZONES)),
    st.datetimes(datetime(2026, 11, 1), datetime(2026, 12, 1)),  # naive: taken as UTC
)
"""When a pod started: unknown, aware in any zone, naive; to the microsecond; some after
``now`` (an age of 0)."""


def _pod(draw: st.DrawFn, i: int, nodes: list[str]) -> Pod:
    kind = draw(st.sampled_from(["running", "running", "cpu", "pending", "finished", "ending"]))
    gang = draw(st.sampled_from([None, None, "g1", "g2"]))
    labels = {"job-name": draw(st.sampled_from(["j1", "j2"]))} if draw(st.booleans()) else {}
    ns = draw(st.sampled_from(["default", "team"]))
    if kind == "pending" or not nodes:
        return replace(pending(f"p{i}", draw(st.sampled_from([1, 2])), gang=gang), namespace=ns)
    node = draw(st.sampled_from(nodes))
    gpus = 0 if kind == "cpu" else 1
    pod = running(
        f"p{i}", node, gpus, namespace=ns, gang=gang, labels=labels,
        cpu=draw(st.sampled_from([500, 1000])),
    )  # fmt: skip
    when = draw(MOMENTS)
    pod = replace(pod, created_at=when, scheduled_at=draw(st.sampled_from([None, when])))
    if kind == "finished":
        return replace(pod, phase="Succeeded")
    if kind == "ending":
        return replace(pod, deleting_since=NOW - timedelta(minutes=1))
    return pod


def _nodes(names: list[str], reserved: str | None) -> list[Node]:
    out = [gpu_node(n, 8) for n in names]
    if reserved in names:
        at = names.index(reserved)
        out[at] = replace(out[at], annotations={RESERVED_FOR_ANNOTATION: "default/p1"})
    return out


def _build(nodes: list[Node], pods: dict[str, Pod]) -> Cluster:
    return Cluster.build(nodes, pods.values(), on_misfit=lambda pod, exc: None)


@st.composite
def sequences(draw: st.DrawFn) -> list[Cluster]:
    """A cluster and 1–6 changed versions of it, each sharing the unchanged pod objects."""
    names = NAMES[: draw(st.integers(1, 4))]
    reserved = draw(st.sampled_from([None, "n0"]))
    pods: dict[str, Pod] = {}
    for i in range(draw(st.integers(0, 14))):
        pod = _pod(draw, i, names)
        pods[pod.key] = pod
    clusters = [_build(_nodes(names, reserved), pods)]
    made = 100
    for _ in range(draw(st.integers(1, 6))):
        c = clusters[-1]
        for _ in range(draw(st.integers(0, 4))):
            step = draw(st.sampled_from(["remove", "add", "add", "replace", "same"]))
            keys = sorted(c.pods)
            if step == "remove" and keys:
                c = c.with_pod_removed(draw(st.sampled_from(keys)))
            elif step == "add":
                made += 1
                pod = _pod(draw, made, [n.name for n in c.nodes])
                if pod.key not in c.pods:
                    try:
                        c = c.with_pod_added(pod)
                    except Exception:  # GPUs overcommitted: not a cluster the source gives
                        continue
            elif step == "replace" and keys:
                key = draw(st.sampled_from(keys))
                old = c.pods[key]
                new = draw(
                    st.sampled_from(
                        [
                            replace(old, labels={"job-name": "j3"}),
                            replace(old, gang="g9"),
                            replace(old, gang=None, labels={}),
                            replace(old, deleting_since=NOW),
                            replace(old, phase="Failed"),
                        ]
                    )
                )
                c = c.with_pod_removed(key).with_pod_added(new)
            elif step == "same":
                c = Cluster.build(c.nodes, c.pods.values(), c.pdbs)  # same pods, new objects
        if draw(st.integers(0, 5)) == 0:  # other nodes: a row added or one taken away
            names = NAMES[: draw(st.integers(1, 5))]
            kept = {k: p for k, p in c.pods.items() if p.node is None or p.node in names}
            c = _build(_nodes(names, reserved), kept)
        clusters.append(c)
    return clusters


@SETTINGS
@given(sequences())
def test_workspaces_through_a_sequence_of_clusters_are_the_ones_made_from_nothing(
    clusters: list[Cluster],
) -> None:
    for c in clusters:
        assert_same(Workspace.from_cluster(c), reference(c))


@SETTINGS
@given(sequences())
def test_the_kept_seating_is_the_one_made_from_nothing(clusters: list[Cluster]) -> None:
    for c in clusters:
        kept, fresh = seating(c), seating_of(c)
        assert [_seats(r) for r in kept.rows] == [_seats(r) for r in fresh.rows]
        assert sorted(_seats(kept.where)) == sorted(_seats(fresh.where))
        assert kept.gangs == fresh.gangs and kept.gang_by_pod == fresh.gang_by_pod
        assert kept.terminating == fresh.terminating
        assert kept.started_us == fresh.started_us
        assert np.array_equal(kept.gpuless_cpu, fresh.gpuless_cpu)


@SETTINGS
@given(
    sequences(), st.datetimes(datetime(2026, 11, 20), datetime(2026, 12, 2), timezones=st.just(UTC))
)
def test_departures_from_the_seating_are_the_ones_from_the_pods(
    clusters: list[Cluster], now: datetime
) -> None:
    """The forecast's ages read from the kept seating's starts are the ages of the bound pods,
    to the bit, at every step."""
    for c in clusters:
        kept = departures_of(c, now, 12.0).ages_h
        walked = Departures.of(c.bound_pods(), now, 12.0).ages_h
        assert kept.dtype == walked.dtype and kept.tobytes() == walked.tobytes()


def test_a_cluster_seen_again_after_another_gets_its_own_seating() -> None:
    """Going back to an earlier snapshot (a planner asked of two clusters in turn) changes the
    kept seating back: it follows the pods it is asked about, not the order of the asks."""
    a = Cluster.build([gpu_node("n0"), gpu_node("n1")], [running("x", "n0"), running("y", "n1")])
    b = a.with_pod_removed("default/x").with_pod_added(running("z", "n0", 2))
    for c in (a, b, a, b, b, a):
        assert_same(Workspace.from_cluster(c), reference(c))


def test_a_workspace_changes_nothing_of_the_kept_seating() -> None:
    """The plan moves pods in its workspace; the next workspace of the same cluster starts
    from the cluster as it is."""
    c = Cluster.build([gpu_node("n0"), gpu_node("n1")], [running("x", "n0"), running("y", "n1")])
    ws = Workspace.from_cluster(c)
    seat = ws.remove("default/x")
    ws.place(seat.pod, 1, (3,))
    assert_same(Workspace.from_cluster(c), reference(c))


def test_many_changes_make_it_from_nothing() -> None:
    """Past REBUILD_SHARE of the pods changed, the seating is not brought up but made anew
    (the answer is the same either way)."""
    pods = [running(f"p{i}", "n0", 0) for i in range(40)]
    a = Cluster.build([gpu_node("n0")], pods)
    first = seating(a)
    b = Cluster.build([gpu_node("n0")], [replace(p, cpu_milli=200) for p in pods])
    assert seating_module.updated(first, b) is None
    assert_same(Workspace.from_cluster(b), reference(b))
