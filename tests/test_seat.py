"""The seat before the move (defrag/execute/reservation.py): a migration's planned target is
reserved for the moved pod's owner (``defrag.io/reserved-for: owner:<ns>/<Kind>/<name>``) before
the eviction, and released once a replacement made since is bound, at the timeout, when the move
did not happen, or by reconcile."""

from __future__ import annotations

from datetime import timedelta

import pytest

from defrag.adapters.simcluster import SIM_START, SimClock, SimCluster, fragmented_cluster
from defrag.execute import EvictionBudget, Executor, ExecutorSettings, WindowStatus
from defrag.execute.mode import RunMode
from defrag.execute.reconcile import Reconciler
from defrag.execute.reservation import RESERVED_AT_ANNOTATION, Reservation
from defrag.model.resources import (
    RESERVED_FOR_ANNOTATION,
    OwnerRef,
    Pod,
    owner_holder,
    reservation_admits,
    reservation_holders,
)
from defrag.plan.model import Plan, Step
from defrag.ports import EvictionResult

OPEN = WindowStatus(True, "test window", SIM_START)
TIMEOUT = timedelta(seconds=120)


def make() -> tuple[SimCluster, Executor]:
    clock = SimClock(speedup=0)
    sim = SimCluster(fragmented_cluster(), clock)
    settings = ExecutorSettings(
        budgets=EvictionBudget(50, 50, 50), batch_size=2, replacement_timeout_s=120,
        poll_interval_s=10,
    )  # fmt: skip
    return sim, Executor(sim, sim, clock, settings, mode=RunMode.live(), sleep=clock.sleep)


def moves(sim: SimCluster, names: tuple[str, ...], target: str) -> Plan:
    cluster = sim.snapshot()
    steps = tuple(
        Step("migrate", f"inference/{n}", cluster.pods[f"inference/{n}"].node or "", target, "r")
        for n in names
    )
    return Plan("repack", "reserve-binpack", steps, ())


def test_the_target_is_seated_for_the_owners_before_the_eviction_and_freed_once_they_run() -> None:
    sim, ex = make()
    seen: list[str] = []
    evict = sim.evict

    def spy(namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        seen.append(sim.snapshot().node("gpu-01").annotations.get(RESERVED_FOR_ANNOTATION, ""))
        return evict(namespace, name, uid=uid)

    sim.evict = spy  # type: ignore[method-assign]
    plan = moves(sim, ("embed-001", "chat-004"), "gpu-01")
    owners = {
        owner_holder("inference", p.owner)
        for p in sim.snapshot().pods.values()
        if p.name in ("embed-001", "chat-004") and p.owner is not None
    }
    result = ex.execute(plan, sim.snapshot(), OPEN)
    assert result.counts == {"evicted": 2}
    # Both evictions went out with gpu-01 held for exactly the two owners.
    assert len(seen) == 2 and all(set(reservation_holders(v)) == owners for v in seen)
    after = sim.snapshot().node("gpu-01").annotations
    assert RESERVED_FOR_ANNOTATION not in after and RESERVED_AT_ANNOTATION not in after
    (released,) = [e for e in sim.events if e.reason == "DefragReservationReleased"]
    assert released.name == "gpu-01" and "is bound" in released.message


def test_a_target_reserved_by_someone_else_is_left_alone() -> None:
    sim, ex = make()
    sim.annotate_node("gpu-01", {RESERVED_FOR_ANNOTATION: "inference/by-hand"})
    result = ex.execute(moves(sim, ("embed-001",), "gpu-01"), sim.snapshot(), OPEN)
    assert result.counts == {"evicted": 1}
    assert sim.snapshot().node("gpu-01").annotations[RESERVED_FOR_ANNOTATION] == (
        "inference/by-hand"
    )
    assert not any(e.reason == "DefragReserved" for e in sim.events)


def test_a_move_refused_at_eviction_frees_its_seat_at_once() -> None:
    sim, ex = make()

    def refuse(namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        return EvictionResult(f"{namespace}/{name}", "blocked", "PDB says no")

    sim.evict = refuse  # type: ignore[method-assign]
    result = ex.execute(moves(sim, ("embed-001",), "gpu-01"), sim.snapshot(), OPEN)
    assert result.counts == {"blocked": 1}
    assert RESERVED_FOR_ANNOTATION not in sim.snapshot().node("gpu-01").annotations
    (released,) = [e for e in sim.events if e.reason == "DefragReservationReleased"]
    assert "move not made, not evicted: inference/embed-001" in released.message


SEAT_AT = SIM_START
OWNER = OwnerRef("ReplicaSet", "train-7d9f")
SEAT = Reservation("gpu-01", "owner:ml/ReplicaSet/train-7d9f", SEAT_AT + timedelta(seconds=0.6))


def replacement(node: str | None, created_s: float, owner: OwnerRef = OWNER) -> Pod:
    """A pod of ``owner`` made ``created_s`` after SEAT_AT (no GPUs: it fits anywhere)."""
    created = SEAT_AT + timedelta(seconds=created_s)
    return Pod("train-7d9f-new", "ml", 0, owner=owner, node=node, created_at=created,
               phase="Running" if node else "Pending")  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "after_s", "why"),
    [
        (replacement("gpu-01", 5), 10, "is bound"),  # bound where planned
        (replacement("gpu-02", 5), 10, "is bound"),  # bound elsewhere: the seat serves no one
        (replacement(None, 5), 10, ""),  # made, not bound yet: kept
        (replacement(None, 5), 121, "bound after 120 s"),  # the timeout (seat at +0.6 s)
        # The seat was written at SEAT_AT + 0.6 s; creationTimestamp has whole seconds, so a
        # pod stamped SEAT_AT (made in the seat's second) counts as made since.
        (replacement("gpu-01", 0), 10, "is bound"),
        (replacement("gpu-01", -1), 10, ""),  # bound before the seat: not a replacement
        (replacement("gpu-01", 5, OwnerRef("ReplicaSet", "other")), 10, ""),  # another owner
    ],
)
def test_seat_verdict(pod: Pod, after_s: float, why: str) -> None:
    cluster = fragmented_cluster().with_pod_added(pod)
    verdict = SEAT.verdict(cluster, SEAT_AT + timedelta(seconds=after_s), TIMEOUT)
    assert (why in verdict) and (bool(verdict) == bool(why)), verdict


@pytest.mark.parametrize(
    ("value", "pod", "admits"),
    [
        ("ml/vip", Pod("vip", "ml"), True),
        ("ml/vip", Pod("vip", "other"), False),
        ("owner:ml/ReplicaSet/train-7d9f", Pod("x", "ml", owner=OWNER), True),
        ("owner:ml/ReplicaSet/train-7d9f", Pod("x", "ml"), False),
        ("owner:ml/Job/train-7d9f", Pod("x", "ml", owner=OWNER), False),
        (" ml/vip , owner:ml/ReplicaSet/train-7d9f ", Pod("x", "ml", owner=OWNER), True),
        ("", Pod("vip", "ml"), False),
    ],
)
def test_reservation_admits(value: str, pod: Pod, admits: bool) -> None:
    assert reservation_admits(value, pod) is admits


def test_reconcile_removes_a_seat_left_behind() -> None:
    """A crashed run's seat (expired: an hour old) is removed by the next leader's reconcile;
    a reservation set by hand (no ``reserved-at``) stays."""
    sim, ex = make()
    old = Reservation("gpu-01", "owner:inference/ReplicaSet/embed", SIM_START - timedelta(hours=1))
    sim.annotate_node("gpu-01", old.annotations())
    sim.annotate_node("gpu-02", {RESERVED_FOR_ANNOTATION: "inference/by-hand"})
    outcomes = Reconciler(ex).reconcile()
    assert [(o.node, o.action, o.reservation) for o in outcomes] == [
        ("gpu-01", "released", "owner:inference/ReplicaSet/embed")
    ]
    notes = sim.snapshot().node("gpu-01").annotations
    assert RESERVED_FOR_ANNOTATION not in notes
    assert sim.snapshot().node("gpu-02").annotations[RESERVED_FOR_ANNOTATION] == "inference/by-hand"
