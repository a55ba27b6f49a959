"""What a room is worth: the wait it saves, from the running pods' ages (defrag.plan.departures),
against its known cost; the anti-thrash guard (defrag.plan.recent)."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest

from defrag.model.resources import CHECKPOINT_ANNOTATION, EVICTABLE_ANNOTATION, OwnerRef
from defrag.plan import PlanOptions, make_plan
from defrag.plan.config import UNLIMITED, Constraints
from defrag.plan.constraints import NOT_WORTH
from defrag.plan.departures import MIN_PODS, Departures
from defrag.plan.history import History
from defrag.plan.recent import RECENTLY_EVICTED, RecentEvictions, eviction_keys
from tests.test_plan_support import NOW, cluster, fill, gpu_node, pending, running

DAY = timedelta(days=1)
ANY_BUDGET = Constraints(budget=UNLIMITED)


def test_few_pods_run_as_long_again_as_they_have_at_least_the_bandwidth_up_to_the_horizon() -> None:
    deps = Departures(np.sort(np.array([1.0, 2.0, 3.0])))
    assert len(deps.ages_h) < MIN_PODS
    assert deps.residual(0.2) == 1.0
    assert deps.residual(5.0) == 5.0
    assert deps.residual(40.0) == 24.0


@pytest.mark.parametrize(("age", "within"), [(0.0, 0.15), (3.0, 0.06), (10.0, 0.06)])
def test_exponential_run_times_leave_their_mean_whatever_the_age(age: float, within: float) -> None:
    """Ages of pods whose run times are exponential (mean 5 h) are exponential too; what is
    left is the mean, counted up to the horizon, at any age (the 1 h window, one-sided at age
    0, reads the density there 10% low)."""
    ages = np.sort(np.random.default_rng(7).exponential(5.0, 20_000))
    truth = 5.0 * (1 - math.exp(-24 / 5))
    assert Departures(ages).residual(age) == pytest.approx(truth, rel=within)


def test_heavy_tailed_run_times_leave_more_the_older_the_pod() -> None:
    rng = np.random.default_rng(11)
    lifetimes = (rng.pareto(1.5, 50_000) + 1) * 0.5  # Pareto, 30 min at least
    ages = np.sort(rng.uniform(0, 1, lifetimes.size) * lifetimes)  # an age inside each run
    deps = Departures(ages)
    left = [deps.residual(a) for a in (0.5, 2.0, 8.0)]
    assert left[0] < left[1] < left[2] <= 24.0


def test_a_room_frees_once_enough_pods_have_left_in_the_order_they_are_expected_to() -> None:
    deps = Departures()  # too few pods: a pod runs as long again as it has
    pods = [running(f"p{i}", "n", hours=float(i + 1)) for i in range(8)]
    seats = [(p, (i,)) for i, p in enumerate(pods)]
    full = np.zeros(8, dtype=np.int64)
    assert deps.room_wait(pending("four", 4), full, seats, NOW) == 4.0  # the 4 youngest go
    assert deps.room_wait(pending("eight", 8), full, seats, NOW) == 8.0
    assert deps.room_wait(pending("one", 1), full + 1000, seats, NOW) == 0.0  # fits now
    # a pod that never leaves within the horizon holds its GPU: never by itself
    old = [(replace(p, created_at=NOW - timedelta(hours=48)), g) for p, g in seats]
    assert deps.room_wait(pending("eight", 8), full, old, NOW) == 24.0


def _room_cluster(victim_hours: float = 1.5):
    """n1: eight 1-GPU pods running ``victim_hours``, checkpointed when they started (their
    work since is at risk); n2 and n3 each half full of pods that may not be evicted, 4 GPUs
    free each: n1's pods re-fit there, the 8-GPU job fits nowhere."""
    since = {CHECKPOINT_ANNOTATION: (NOW - timedelta(hours=victim_hours)).isoformat()}
    keep = {EVICTABLE_ANNOTATION: "false"}
    pods = [
        *fill("n1", 8, hours=victim_hours, annotations=since),
        *fill("n2", 4, annotations=keep),
        *fill("n3", 4, annotations=keep),
        pending("job", 8),
    ]
    return cluster([gpu_node("n1"), gpu_node("n2"), gpu_node("n3")], pods)


def test_under_a_spreading_scheduler_a_room_is_worth_the_horizon_of_waiting() -> None:
    plan = make_plan(_room_cluster(), "make-room", now=NOW, constraints=ANY_BUDGET)
    assert [(s.kind, s.source) for s in plan.steps] == [("migrate", "n1")] * 8
    (room,) = plan.rooms
    # 8 GPUs × 24 h, against 8 × (5 min restart + 1.5 h since the checkpoint) = 12.67
    assert (room.pod, room.node, room.wait_h) == ("default/job", "n1", 24.0)
    assert room.value == pytest.approx(192.0) and room.cost == pytest.approx(8 * (5 / 60 + 1.5))
    assert "the room is worth 192.0 GPU-hours" in plan.steps[0].reason
    assert plan.to_dict()["rooms"] == [room.to_dict()]


@pytest.mark.parametrize(("margin", "made"), [(1.0, False), (0.9, True)])
def test_under_a_packing_scheduler_a_room_is_worth_the_wait_until_departures_free_one(
    margin: float, made: bool
) -> None:
    """The scheduler packs: n1 frees itself once its pods leave, in 1.5 h (they have run
    1.5 h): the room saves 8 × 1.5 = 12 GPU-hours and costs 12.67 — not worth it at a margin
    of 1, worth it at 0.9."""
    plan = make_plan(
        _room_cluster(), "make-room", now=NOW, options=PlanOptions(room_worth=margin),
        constraints=ANY_BUDGET, history=History(packing=True),
    )  # fmt: skip
    assert bool(plan.steps) is made
    if made:
        assert plan.rooms[0].value == pytest.approx(12.0) and plan.rooms[0].wait_h == 1.5
    else:
        (why,) = [b for b in plan.blocked if b.constraint == NOT_WORTH]
        assert "costs 12.67 GPU-hours" in why.detail
        assert "8 GPU × 1.50 h until the cluster frees such a room by itself" in why.detail


def test_a_pod_evicted_within_the_guard_is_not_evicted_again() -> None:
    c = _room_cluster()
    victims = [p for p in c.pods.values() if p.node == "n1"]
    recent = RecentEvictions().record(victims[:1], NOW - timedelta(hours=3))
    plan = make_plan(
        c, "make-room", now=NOW, constraints=ANY_BUDGET, history=History(evicted=recent)
    )
    assert plan.steps == ()
    (why,) = [b for b in plan.blocked if b.constraint == RECENTLY_EVICTED]
    assert why.pod == victims[0].key and "planner.evict_again_after_s (24 h)" in why.detail
    # evicted more than a day ago, it may go again
    older = RecentEvictions().record(victims[:1], NOW - DAY - timedelta(hours=1))
    later = make_plan(c, "make-room", now=NOW, constraints=ANY_BUDGET, history=History(older))
    assert len(later.steps) == 8


def test_a_restarted_run_is_its_workload_a_replica_is_only_itself() -> None:
    job = running("train-0", "n1", owner=OwnerRef("Job", "train"))
    replica = running("web-abc", "n1", owner=OwnerRef("ReplicaSet", "web"))
    assert eviction_keys(job) == ("default/train-0", "default/Job/train")
    assert eviction_keys(replica) == ("default/web-abc",)
    recent = RecentEvictions().record([job, replica], NOW)
    again = replace(job, name="train-0-retry")  # the Job's new pod for the same run
    assert not recent.check(again, NOW + timedelta(hours=1), DAY).ok
    assert recent.check(replace(replica, name="web-xyz"), NOW + timedelta(hours=1), DAY).ok
    assert recent.check(job, NOW + timedelta(hours=1), None).ok  # no guard
    assert len(recent.pruned(NOW + DAY, DAY)) == 0 and len(recent.pruned(NOW, DAY)) == 3
