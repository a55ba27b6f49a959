"""Repack's lazy candidates: the bound never under-rates a drain, and the lazy search makes the
same plan as the exhaustive one (hypothesis, random small clusters)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from defrag.model.cluster import Cluster
from defrag.model.resources import Node, OwnerRef, Pod
from defrag.model.workload import WorkloadMix
from defrag.plan import Constraints, EvictionBudget
from defrag.plan.constraints import Ledger
from defrag.plan.cost import DEFAULT_COST, CostModel
from defrag.plan.drains import Drains, bounds, candidates, virtual_job
from defrag.plan.repack import RepackResult, repack
from defrag.plan.room import Room, SearchContext, find_room
from defrag.plan.workspace import Workspace
from defrag.scoring.fgd_model import FragModel
from defrag.scoring.policies import make_policy
from tests.test_plan_support import NOW, cluster, fill, gpu_node, running

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    """2–8 nodes of 4 or 8 GPUs (some in two NVLink domains), filled with 1/2/4-GPU and
    GPU-sharing pods of random age, priority and checkpoint, some protected."""
    n = draw(st.integers(2, 8))
    nodes: list[Node] = []
    pods: list[Pod] = []
    for i in range(n):
        gpus = draw(st.sampled_from([4, 8, 8]))
        domains = ((0, 1, 2, 3), (4, 5, 6, 7)) if gpus == 8 and draw(st.booleans()) else ()
        nodes.append(gpu_node(f"n{i}", gpus, domains=domains))
        slot = 0
        while slot < gpus and draw(st.integers(0, 9)) < 8:
            size = draw(st.sampled_from([0, 1, 1, 2, 4]))  # 0: two pods sharing one GPU
            annotations = {}
            if draw(st.integers(0, 9)) == 0:
                annotations = {"defrag.io/evictable": "false"}
            elif draw(st.integers(0, 4)) == 0:
                annotations = {"defrag.io/last-checkpoint": "2026-11-29T11:30:00Z"}
            kw = dict(
                hours=draw(st.sampled_from([0.05, 1.0, 5.0, 30.0])),
                priority=draw(st.sampled_from([0, 100, 1000])),
                annotations=annotations,
            )
            if size == 0:
                for j in range(2):
                    pod = running(f"s{i}-{slot}-{j}", f"n{i}", 1, gpu_milli=400, **kw)  # type: ignore[arg-type]
                    pods.append(replace(pod, gpu_indices=(slot,)))
                slot += 1
                continue
            if slot + size > gpus:
                break
            pod = running(f"p{i}-{slot}", f"n{i}", size, **kw)  # type: ignore[arg-type]
            pods.append(replace(pod, gpu_indices=tuple(range(slot, slot + size))))
            slot += size
    return cluster(nodes, pods)


def _run(
    c: Cluster, *, exhaustive: bool, budget: int | None, gain: float, mix: WorkloadMix | None = None
) -> RepackResult:
    constraints = Constraints(
        min_age=timedelta(minutes=10), budget=EvictionBudget(budget, None, None)
    )
    ws = Workspace.from_cluster(c)
    mix = mix or WorkloadMix.from_pods(p for p in c.pods.values() if p.num_gpu)
    ctx = SearchContext(make_policy("fgd", mix=mix), Ledger(c.pdbs, constraints), constraints,
                  DEFAULT_COST, NOW)  # fmt: skip
    return repack(ws, ctx, mix, min_gain_per_cost=gain, exhaustive=exhaustive)


@SETTINGS
@given(
    clusters(),
    st.sampled_from([None, 0, 1, 3, 10]),
    st.sampled_from([0.0, 0.02, 0.05, 0.25]),
)
def test_lazy_search_makes_the_exhaustive_plan(c: Cluster, budget: int | None, gain: float) -> None:
    if not any(p.num_gpu for p in c.pods.values()):
        return
    lazy = _run(c, exhaustive=False, budget=budget, gain=gain)
    full = _run(c, exhaustive=True, budget=budget, gain=gain)
    assert lazy.steps == full.steps
    assert lazy.blocked == full.blocked
    assert lazy.drained == full.drained
    assert lazy.gain == full.gain
    assert lazy.searched <= full.searched
    event(f"steps: {bool(full.steps)}, pruned: {lazy.searched < full.searched}")


@SETTINGS
@given(clusters())
def test_the_bound_is_above_every_candidates_ratio(c: Cluster) -> None:
    if not any(p.num_gpu for p in c.pods.values()):
        return
    ws = Workspace.from_cluster(c)
    mix = WorkloadMix.from_pods(p for p in c.pods.values() if p.num_gpu)
    fm = FragModel.build(mix, ws.arrays.models)
    a = ws.arrays
    frag_now = fm.node_frag(a.gpu_free, a.cpu_free, a.model_code) / 1000
    constraints = Constraints(min_age=timedelta(minutes=10))
    ctx = SearchContext(make_policy("fgd", mix=mix), Ledger(c.pdbs, constraints), constraints,
                  DEFAULT_COST, NOW)  # fmt: skip
    rows, ks = candidates(ws, mix)
    b = bounds(ws, rows, ks, frag_now, lambda pods: DEFAULT_COST.floors(pods, NOW))
    drains = Drains(ws, ctx, mix, fm, frag_now, ctx.victim_filter(None), bar=0.0)
    for row, k, bound in zip(b.rows.tolist(), b.ks.tolist(), b.bound.tolist(), strict=True):
        room = find_room(ws, row, virtual_job(k), ctx.victim_filter(None), ctx.cost)
        if not isinstance(room, Room) or not room.victims:
            continue
        (gain,) = drains._gains([(row, room)]).tolist()
        assert gain / max(room.cost, 1e-9) <= bound


def test_cost_floors_are_below_each_eviction_cost() -> None:
    # Three pods, each priced by CostModel.eviction at NOW:
    # (restart: batch 5 min, training 10 min; RESTART_HOURS)
    #   young: 1 GPU × (5/60 + 2 h) × (1 + 0/1000)      = 2.083333
    #   high:  2 GPU × (10/60 + 5 h) × (1 + 1000/1000)  = 20.666667
    #   saved: 1 GPU × (5/60 + 0.5 h) × 1 (checkpoint 30 min ago) = 0.583333; floor counts
    #          the restart alone: 0.083333
    pods = [
        running("young", "n1", 1, hours=2.0),
        running("high", "n1", 2, hours=5.0, priority=1000),
        running("saved", "n1", 1, hours=30.0,
                annotations={"defrag.io/last-checkpoint": "2026-11-29T11:30:00Z"}),
    ]  # fmt: skip
    model = CostModel()
    exact = [model.eviction(p, NOW) for p in pods]
    assert exact == pytest.approx([2.083333, 20.666667, 0.583333])
    floors = model.floors(pods, NOW)
    assert np.allclose(floors, [2.083333, 20.666667, 0.083333], atol=1e-5)
    assert all(f <= e for f, e in zip(floors.tolist(), exact, strict=True))


def test_a_spent_budget_searches_no_room() -> None:
    # Four 8-GPU nodes with two 1-GPU pods each: every node is a candidate, but with no
    # eviction left in the budget repack stops before its first search.
    c = cluster([gpu_node(f"n{i}") for i in range(4)],
                [p for i in range(4) for p in fill(f"n{i}", 2)])  # fmt: skip
    mix = WorkloadMix.default()
    spent = _run(c, exhaustive=False, budget=0, gain=0.05, mix=mix)
    assert (spent.steps, spent.searched) == ((), 0)
    some = _run(c, exhaustive=False, budget=4, gain=0.05, mix=mix)
    assert some.steps and some.searched > 0


def test_the_bound_prunes_rooms_on_a_larger_cluster() -> None:
    # 40 nodes, half lightly used by old (costly) pods and half by young (cheap) ones: the
    # cheap drains rank first, so the costly nodes' rooms are never searched.
    nodes = [gpu_node(f"n{i:02d}") for i in range(40)]
    pods = [
        running(f"p{i}-{j}", f"n{i:02d}", 1, hours=0.5 if i % 2 else 100.0,
                owner=OwnerRef("ReplicaSet", f"rs{i}"))
        for i in range(40) for j in range(2)
    ]  # fmt: skip
    c = cluster(nodes, pods)
    mix = WorkloadMix.default()
    lazy = _run(c, exhaustive=False, budget=6, gain=0.05, mix=mix)
    full = _run(c, exhaustive=True, budget=6, gain=0.05, mix=mix)
    assert lazy.steps == full.steps and lazy.steps
    assert lazy.searched < full.searched
