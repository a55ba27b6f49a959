"""Repack's drains weighed like rooms when a plan repacks for starved pods make-room left without
room (defrag.plan.drainworth): kept only when the pods a drain seats are worth its cost, each
pod counted once, the node kept for the first; a preempted victim's wait in a room's cost."""

from __future__ import annotations

from datetime import timedelta

import pytest

from defrag.model.resources import CHECKPOINT_ANNOTATION, EVICTABLE_ANNOTATION
from defrag.model.workload import WorkloadMix
from defrag.plan import PlanOptions, make_plan
from defrag.plan.config import UNLIMITED, Constraints
from defrag.plan.model import Plan
from defrag.scoring.profile import ProfileConfig
from tests.test_plan_support import NOW, cluster, fill, gpu_node, pending, running

ANY_BUDGET = Constraints(budget=UNLIMITED)
KEEP = {EVICTABLE_ANNOTATION: "false"}
DEFAULT_MIX = ProfileConfig().with_mix(WorkloadMix.default())
"""Repack measures its gain against the default workload mix (8-GPU jobs among them)."""


def _cluster(*, checkpoint_h: float | None = None, drainable: int = 1):
    """n0: two pods that may not move (make-room's only candidate with ``candidates=1``: the
    fewest GPUs to free, but blocked); ``drainable`` nodes n1… each with three 1-GPU pods that
    may move (checkpointed ``checkpoint_h`` ago: their work since is at risk); r1, r2: four
    pinned pods each (room for the moved ones). An 8-GPU job waits."""
    since = (
        {}
        if checkpoint_h is None
        else {CHECKPOINT_ANNOTATION: (NOW - timedelta(hours=checkpoint_h)).isoformat()}
    )
    nodes = [gpu_node("n0"), gpu_node("r1"), gpu_node("r2")]
    pods = [*fill("n0", 2, annotations=KEEP), *fill("r1", 4, annotations=KEEP)]
    pods += fill("r2", 4, annotations=KEEP)
    for i in range(1, drainable + 1):
        nodes.append(gpu_node(f"n{i}"))
        pods += [running(f"p{i}-{k}", f"n{i}", annotations=since) for k in range(3)]
    return cluster(nodes, [*pods, pending("job", 8)])


def _plan(c, *, on_demand: bool = True, margin: float = 1.0) -> Plan:
    options = PlanOptions(
        candidates=1, min_gain_per_cost=0.0, repack_on_demand=on_demand, room_worth=margin
    )
    return make_plan(
        c, "all", now=NOW, options=options, constraints=ANY_BUDGET, profile=DEFAULT_MIX
    )


def test_a_drain_that_seats_a_starved_pod_is_kept_reserved_for_it_and_weighed() -> None:
    plan = _plan(_cluster())
    drained = {s.source for s in plan.steps}
    assert drained == {"n1"} and all(s.kind == "migrate" for s in plan.steps)
    assert {s.for_pod for s in plan.steps} == {"default/job"}  # the node is kept for it
    (drain,) = [r for r in plan.rooms if r.kind == "drain"]
    # 8 GPUs × the horizon (the scheduler spreads) against 3 × the 5-minute restart
    assert (drain.pod, drain.node, drain.wait_h) == ("default/job", "n1", 24.0)
    assert drain.value == pytest.approx(192.0) and drain.cost == pytest.approx(3 * 5 / 60, abs=1e-5)
    assert "the drain seats default/job (8 GPU), worth 192.0 GPU-hours" in plan.steps[0].reason
    assert plan.to_dict()["rooms"][-1]["kind"] == "drain"
    assert Plan.from_dict(plan.to_dict()).to_dict()["rooms"] == plan.to_dict()["rooms"]


def test_a_drain_worth_less_than_its_cost_is_refused() -> None:
    """Each victim loses 100 h since its checkpoint: 3 × 100 GPU-hours against the 192 the
    job's wait is worth. Unweighed (a repack the findings ask for) the drain is made."""
    c = _cluster(checkpoint_h=100.0)
    assert _plan(c).steps == ()
    assert {s.source for s in _plan(c, on_demand=False).steps} == {"n1"}
    # the margin weighs the same way: worth 192 against 0.25 of restarts, at a margin of 1000
    assert _plan(_cluster(), margin=1000.0).steps == ()


def test_a_starved_pod_is_counted_by_one_drain_only() -> None:
    plan = _plan(_cluster(drainable=3))
    assert len({s.source for s in plan.steps}) == 1
    assert [r.kind for r in plan.rooms] == ["drain"]


def test_a_preempted_victim_waits_and_its_wait_is_part_of_the_room_cost() -> None:
    """n1: one 4-GPU pod of low priority that fits nowhere else (r1, r2 have 3 GPUs free), so
    making room for the 8-GPU job preempts it; the forecast says a seat frees for it once r1's
    youngest pods leave, and its GPUs × that wait join the room's cost."""
    nodes = [gpu_node("n1"), gpu_node("r1"), gpu_node("r2")]
    low = running("low", "n1", 4, priority=0, hours=0.5)
    pods = [low, *fill("r1", 5, annotations=KEEP), *fill("r2", 5, annotations=KEEP)]
    plan = make_plan(
        cluster(nodes, [*pods, pending("job", 8)]), "make-room", now=NOW,
        constraints=ANY_BUDGET,
    )  # fmt: skip
    assert [(s.kind, s.pod) for s in plan.steps] == [("preempt", "default/low")]
    (room,) = plan.rooms
    assert room.victims_wait > 0
    lost = 2 * 4 * 10 / 60  # a preemption: twice the known price (4 GPUs × the restart)
    assert room.cost == pytest.approx(lost + room.victims_wait)
