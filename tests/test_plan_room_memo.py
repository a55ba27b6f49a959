"""Room searches kept under the workspace's version: the same rooms as searching every time.

A workspace names its state (``Workspace.version``): a change gives a new number, a rollback
the number of the state it restores. :meth:`SearchContext.room` keeps :func:`find_room`'s
answer under that number, and make-room asks it for every candidate row; the workspace keeps
the CPU that GPU-less pods hold per row (``gpuless_cpu``) for make-room's candidate ranking.
These are speed changes only: make-room with them must make exactly the plan it makes without.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from defrag.model.cluster import Cluster
from defrag.model.resources import OwnerRef, Pod
from defrag.model.workload import WorkloadMix
from defrag.plan import Constraints, EvictionBudget, MakeRoomMode, PlanOptions
from defrag.plan.constraints import Ledger
from defrag.plan.cost import DEFAULT_COST
from defrag.plan.makeroom import placeable_elsewhere
from defrag.plan.model import Blocked
from defrag.plan.planner import Rooms, make_rooms
from defrag.plan.room import Room, SearchContext, _Search, find_room
from defrag.plan.workspace import Workspace, cpu_of_gpuless
from defrag.scoring.policies import make_policy
from tests.test_plan_drains import clusters
from tests.test_plan_support import NOW, cluster, gpu_node, running

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _Searching(SearchContext):
    """The reference: every room searched afresh, none kept; counts the searches."""

    __slots__ = ("searches",)
    searches: int

    def room(self, *args: Any, **kwargs: Any) -> Room | tuple[Blocked, ...]:
        """The search with its rules dropped (None: never kept), counted."""
        self.searches += 1
        ws, row, pod, _, *rest = args
        return super().room(ws, row, pod, None, *rest, **kwargs)


def _context(c: Cluster, kind: type[SearchContext], budget: int | None) -> SearchContext:
    constraints = Constraints(
        min_age=timedelta(minutes=10), budget=EvictionBudget(budget, None, None)
    )
    mix = WorkloadMix.from_pods(p for p in c.pods.values() if p.num_gpu) if c.pods else None
    policy = make_policy("least-allocated", mix=mix or WorkloadMix.default())
    ctx = kind(policy, Ledger(c.pdbs, constraints), constraints, DEFAULT_COST, NOW)
    if isinstance(ctx, _Searching):
        ctx.searches = 0
    return ctx


@st.composite
def starved(draw: st.DrawFn) -> list[Pod]:
    """1–8 pending pods, most of one or two shapes (the case the kept searches serve), waiting
    1 min to 30 h (room_worth weighs a room against that wait)."""
    shapes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=2))
    pods = []
    for i in range(draw(st.integers(1, 8))):
        hours = draw(st.sampled_from([1 / 60, 0.5, 3.0, 30.0]))
        pods.append(
            Pod(
                f"wait-{i}", num_gpu=draw(st.sampled_from(shapes)),
                cpu_milli=draw(st.sampled_from([1000, 1000, 60_000])),
                priority=draw(st.sampled_from([100, 1000])), owner=OwnerRef("Job", f"j{i}"),
                created_at=NOW - timedelta(hours=hours),
                pending_since=NOW - timedelta(hours=hours),
            )
        )  # fmt: skip
    return pods


def _with_cpu_pods(c: Cluster, where: list[int]) -> Cluster:
    """``c`` with one CPU-only pod (8 CPUs) on each node of ``where`` (by index)."""
    names = [n.name for n in c.nodes]
    extra = [
        running(f"cpu-{j}", names[i % len(names)], 0, cpu=8000, hours=3.0)
        for j, i in enumerate(where)
        if names
    ]
    return cluster(c.nodes, [*c.pods.values(), *extra], c.pdbs)


@SETTINGS
@given(
    clusters(),
    starved(),
    st.lists(st.integers(0, 7), max_size=4),
    st.sampled_from(
        [
            MakeRoomMode.of(preempt=False, migrate_any_priority=True),
            MakeRoomMode.of(preempt=True, migrate_any_priority=True),
            MakeRoomMode.of(preempt=True, migrate_any_priority=False),
            MakeRoomMode.FILL,
        ]
    ),
    st.sampled_from([0.0, 1.0]),
    st.sampled_from([None, 2, 10]),
)
def test_kept_room_searches_make_the_plan_of_searching_every_time(
    c: Cluster,
    pods: list[Pod],
    cpu_pods: list[int],
    mode: MakeRoomMode,
    worth: float,
    budget: int | None,
) -> None:
    c = _with_cpu_pods(c, cpu_pods)
    options = PlanOptions(mode=mode, room_worth=worth, candidates=4, tries=2)
    groups = [[p] for p in pods]
    done: list[tuple[Rooms, Workspace]] = []
    searches = []
    for kind in (SearchContext, _Searching):
        ws, ctx = Workspace.from_cluster(c), _context(c, kind, budget)
        done.append((make_rooms(ws, ctx, groups, options), ws))
        searches.append(len(ctx._rooms) if kind is SearchContext else ctx.searches)  # type: ignore[attr-defined]
    (kept, kept_ws), (fresh, fresh_ws) = done
    assert kept == fresh  # steps, blocked (with their reasons), targets
    assert np.array_equal(kept_ws.arrays.gpu_free, fresh_ws.arrays.gpu_free)
    assert kept_ws.where.keys() == fresh_ws.where.keys()
    assert searches[0] <= searches[1]
    # the kept CPU of GPU-less pods is the sum over the seats, after every move and rollback
    n = len(kept_ws.arrays)
    assert np.array_equal(kept_ws.gpuless_cpu, cpu_of_gpuless(kept_ws.where.values(), n))
    event(f"searches kept: {searches[0] < searches[1]}, rooms made: {bool(fresh.steps)}")


def _four_nodes() -> Workspace:
    nodes = [gpu_node(f"n{i}", 4) for i in range(4)]
    pods = [
        replace(running("a", "n0", 2), gpu_indices=(0, 1)),
        replace(running("b", "n1", 1), gpu_indices=(0,)),
        running("cpu", "n1", 0, cpu=6000),
    ]
    return Workspace.from_cluster(cluster(nodes, pods))


@pytest.mark.parametrize(
    "change",
    [
        lambda ws: ws.remove("default/a"),
        lambda ws: ws.place(Pod("new", num_gpu=1, cpu_milli=500), 2, (3,)),
        lambda ws: ws.reserve(Pod("held", num_gpu=4, cpu_milli=500), 3, (0, 1, 2, 3)),
        lambda ws: ws.forbid(2),
        lambda ws: ws.remove("default/cpu"),
    ],
    ids=["remove", "place", "reserve", "forbid", "remove a CPU-only pod"],
)
def test_a_change_names_a_new_state_and_a_rollback_the_one_it_restores(
    change: Callable[[Workspace], object],
) -> None:
    ws, other = _four_nodes(), _four_nodes()
    assert ws.version != other.version  # two workspaces never share a number
    start, mark, cpu = ws.version, ws.mark(), ws.gpuless_cpu.copy()
    change(ws)
    changed = ws.version
    assert changed not in (start, other.version)
    ws.rollback(mark)
    assert ws.version == start
    assert np.array_equal(ws.gpuless_cpu, cpu)  # n1 holds the CPU-only pod's 6 CPUs
    assert cpu.tolist() == [0, 6000, 0, 0]
    change(ws)
    assert ws.version not in (start, changed)  # the same change again: a new number


def test_a_forbid_that_changes_nothing_keeps_the_state_and_releasing_names_a_new_one() -> None:
    ws = _four_nodes()
    ws.forbid(1)
    forbidden = ws.version
    ws.forbid(1)  # already out of reach: nothing changed
    assert ws.version == forbidden
    ws.reserve(Pod("held", num_gpu=2, cpu_milli=500), 2, (0, 1))
    held = ws.version
    ws.release_reservations()
    assert ws.version not in (forbidden, held)


def test_a_failed_room_leaves_its_searches_kept_for_the_next_pod_of_its_shape() -> None:
    # n0–n3: 4 GPUs each, every GPU held by a priority-1000 1-GPU pod (as high as the pods
    # waiting): no victim may be preempted and none fits elsewhere, so both 4-GPU pods fail.
    # The second asks the same rows on the same (rolled back) state: 4 rows × 2 passes are
    # searched once, not twice.
    nodes = [gpu_node(f"n{i}", 4) for i in range(4)]
    pods = [
        replace(running(f"p{i}{g}", f"n{i}", 1, priority=1000), gpu_indices=(g,))
        for i in range(4)
        for g in range(4)
    ]
    c = cluster(nodes, pods)
    waiting = [
        Pod(f"w{i}", num_gpu=4, cpu_milli=1000, priority=1000, owner=OwnerRef("Job", f"w{i}"),
            pending_since=NOW - timedelta(hours=1))
        for i in range(2)
    ]  # fmt: skip
    options = PlanOptions(mode=MakeRoomMode.of(preempt=True, migrate_any_priority=True))
    kept, fresh = _context(c, SearchContext, None), _context(c, _Searching, None)
    a = make_rooms(Workspace.from_cluster(c), kept, [[w] for w in waiting], options)
    b = make_rooms(Workspace.from_cluster(c), fresh, [[w] for w in waiting], options)
    assert a == b and a.steps == ()
    assert (len(kept._rooms), fresh.searches) == (4 * 2, 2 * 4 * 2)  # type: ignore[attr-defined]


@SETTINGS
@given(
    clusters(),
    st.lists(st.integers(0, 7), max_size=4),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([None, 100, 1000]),
    st.booleans(),
)
def test_a_room_search_dismissed_as_hopeless_is_one_the_greedy_could_not_make(
    c: Cluster, cpu_pods: list[int], gpus: int, below: int | None, movable: bool
) -> None:
    # _hopeless: fewer GPUs whole or held by usable pods only than the pod asks. The search
    # with it and without it (the greedy run to its end) find the same room, or the same
    # blockers, on every row.
    c = _with_cpu_pods(c, cpu_pods)
    ws, ctx = Workspace.from_cluster(c), _context(c, SearchContext, None)
    pod = Pod("wait", num_gpu=gpus, cpu_milli=1000, priority=1000)
    allowed = ctx.victim_filter(below)
    fits = placeable_elsewhere(ws) if movable else None
    rows = range(len(ws.arrays))
    hopeless = []
    hopeless_of = _Search._hopeless

    def counted(search: _Search, gpus: list[int], r: int, have: int) -> bool:
        hopeless.append(hopeless_of(search, gpus, r, have))
        return hopeless[-1]

    with patch.object(_Search, "_hopeless", counted):
        bounded = [find_room(ws, row, pod, allowed, ctx.cost, fits) for row in rows]
    with patch.object(_Search, "_hopeless", lambda *_: False):
        greedy = [find_room(ws, row, pod, allowed, ctx.cost, fits) for row in rows]
    assert bounded == greedy
    event(f"dismissed: {any(hopeless)}")
