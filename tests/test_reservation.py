"""Make-room plans reserve the room they free (``defrag.io/reserved-for``).

The planner marks the steps that free the room's node (``Step.for_pod``); the executor, with
the real client against the emulated API server, annotates that node before its first
eviction and removes the annotation once the pod runs there, on timeout, when the room was not
made, and on reconcile. Dry run writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import yaml

from defrag.adapters.kube import KubeActuator
from defrag.daemon.cycle import SystemClock
from defrag.execute.mode import RunMode
from defrag.execute.reconcile import Reconciler
from defrag.execute.reservation import RESERVED_AT_ANNOTATION, Reservation
from defrag.model.resources import RESERVED_FOR_ANNOTATION
from defrag.model.workload import WorkloadMix
from defrag.plan import make_plan
from defrag.plan.model import Plan, PlanFormatError, Step
from defrag.scoring.profile import ProfileConfig
from tests.support import kubeobjects as k
from tests.support.kubeapi import KubeApi, Request, running
from tests.test_execute_kube import FAST, OPEN, annotations, executor, small_cluster
from tests.test_plan_support import NOW, cluster, fill, gpu_node, pending
from tests.test_plan_support import running as running_pod

VIP = "inf/vip"


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running([*small_cluster(), k.pod("vip", "inf", 4, priority=1000)])


def room_plan(*pods: str, source: str = "gpu-1") -> Plan:
    """Make room on ``source`` for inf/vip by moving ``pods`` to gpu-2."""
    steps = tuple(
        Step("migrate", p, source, "gpu-2", f"make room for {VIP} on {source}", for_pod=VIP)
        for p in pods
    )
    return Plan("make-room", "reserve-binpack", steps, (), targets=(VIP,))


def reservation_patches(api: KubeApi, node: str) -> list[tuple[int, dict[str, Any]]]:
    """(index in the request log, annotations patched) for each reservation write on ``node``."""
    out = []
    for i, r in enumerate(api.requests):
        notes = _patched_annotations(r)
        if r.resource == "nodes" and r.name == node and RESERVED_FOR_ANNOTATION in notes:
            out.append((i, notes))
    return out


def _patched_annotations(r: Request) -> dict[str, Any]:
    if r.method != "PATCH" or not isinstance(r.body, dict):
        return {}
    notes = r.body.get("metadata", {}).get("annotations", {})
    return notes if isinstance(notes, dict) else {}


def first_eviction(api: KubeApi) -> int:
    """Where the first Eviction sent is in the request log (its dry-run preflight not counted)."""
    return next(
        i for i, r in enumerate(api.requests) if r.resource == "pods/eviction" and not r.dry_run
    )


def released_events(api: KubeApi, holder: str = VIP) -> list[str]:
    """The release Events of the reservations for ``holder`` (not the targets' seats)."""
    return [
        r.body["message"]
        for r in api.writes()
        if r.resource == "events"
        and r.body.get("reason") == "DefragReservationReleased"
        and r.body["message"].startswith(f"room no longer kept for {holder}:")
    ]


# --- the plan ------------------------------------------------------------------------------

DEFAULT_MIX = ProfileConfig().with_mix(WorkloadMix.default())


def test_step_for_pod_round_trips_through_json_and_yaml() -> None:
    plan = room_plan("inf/web-a", "inf/web-b")
    repack = Step("migrate", "inf/web-c", "gpu-1", "gpu-3", "repack")
    plan = Plan(plan.goal, plan.policy, (*plan.steps, repack), (), targets=plan.targets)
    for text in (json.dumps(plan.to_dict()), yaml.safe_dump(plan.to_dict())):
        back = Plan.from_dict(yaml.safe_load(text))
        assert back == plan
        assert [s.for_pod for s in back.steps] == [VIP, VIP, None]


def test_a_bad_for_pod_names_the_field() -> None:
    data = room_plan("inf/web-a").to_dict()
    data["steps"][0]["for_pod"] = 7
    with pytest.raises(PlanFormatError, match=r"plan\.steps\[0\]\.for_pod"):
        Plan.from_dict(data)


def test_only_the_room_nodes_victims_carry_for_pod() -> None:
    # A 4-pod gang spread over n1..n4 (one GPU each); n1/n2 also hold six, n5/n6 seven GPUs of
    # filler. The cheapest room is n3 or n4 (only one gang member there): the whole gang moves,
    # but only the member on the room's node frees it for the job.
    nodes = [gpu_node(f"n{i}") for i in range(1, 7)]
    gang = [running_pod(f"g{i}", f"n{i}", 1, gang="train", hours=1) for i in range(1, 5)]
    pods = [*gang, *fill("n1", 6, prefix="a"), *fill("n2", 6, prefix="b"),
            *fill("n5", 7, prefix="c"), *fill("n6", 7, prefix="d"), pending("job", 8)]  # fmt: skip
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW)
    assert len(plan.steps) == 4
    marked = [s for s in plan.steps if s.for_pod]
    assert len(marked) == 1 and marked[0].for_pod == "default/job"
    assert marked[0].source in ("n3", "n4")
    assert all(s.for_pod is None for s in plan.steps if s.source != marked[0].source)


def test_repack_steps_reserve_nothing() -> None:
    # n1 and n2 hold 2 GPUs each: against 1/2/4/8-GPU jobs, repack drains one into the other,
    # for no pod in particular. (The cluster's own mix, 1-GPU pods only, sees no fragmentation.)
    nodes = [gpu_node("n1"), gpu_node("n2"), gpu_node("n3")]
    pods = [*fill("n1", 2), *fill("n2", 2, prefix="b")]
    plan = make_plan(cluster(nodes, pods), now=NOW, profile=DEFAULT_MIX)
    assert plan.steps and all(s.for_pod is None for s in plan.steps)


# --- the executor against the emulated API -------------------------------------------------


def test_reserved_before_the_first_eviction_and_released_once_the_pod_runs_there(
    api: KubeApi,
) -> None:
    seen: list[str | None] = []

    def scheduler(server: KubeApi, evicted: dict[str, Any]) -> None:
        seen.append(annotations(server, "gpu-1").get(RESERVED_FOR_ANNOTATION))
        if len(server.evicted) == 2:  # the room is free: the scheduler binds the pod there
            server.put(k.pod("vip", "inf", 4, node_name="gpu-1", priority=1000))

    api.on_eviction = scheduler
    ex = executor(api)
    result = ex.execute(room_plan("inf/web-a", "inf/web-b"), ex.source.snapshot(), OPEN)
    assert result.counts == {"evicted": 2} and not result.problems
    (set_at, set_to), (cleared_at, cleared_to) = reservation_patches(api, "gpu-1")
    assert set_to[RESERVED_FOR_ANNOTATION] == VIP and set_to[RESERVED_AT_ANNOTATION]
    assert set_at < first_eviction(api) < cleared_at
    assert cleared_to == {RESERVED_FOR_ANNOTATION: None, RESERVED_AT_ANNOTATION: None}
    assert seen == [VIP, VIP]  # every eviction happened with the room reserved
    assert RESERVED_FOR_ANNOTATION not in annotations(api, "gpu-1")
    assert RESERVED_AT_ANNOTATION not in annotations(api, "gpu-1")
    assert released_events(api) == [f"room no longer kept for {VIP}: {VIP} is bound to gpu-1"]
    # The migrations' target is seated for the victims' owners before the first eviction (the
    # seat before the move), and released: here no scheduler binds their replacements, so at
    # the replacement timeout.
    (seat_at, seat_to), (_, seat_cleared) = reservation_patches(api, "gpu-2")
    assert seat_to[RESERVED_FOR_ANNOTATION] == (
        "owner:inf/ReplicaSet/web-a,owner:inf/ReplicaSet/web-b"
    )
    assert seat_at < first_eviction(api)
    assert seat_cleared == {RESERVED_FOR_ANNOTATION: None, RESERVED_AT_ANNOTATION: None}


def test_released_when_the_pod_stays_pending_past_the_timeout(api: KubeApi) -> None:
    ex = executor(api, timeout_s=0.2)
    result = ex.execute(room_plan("inf/web-a"), ex.source.snapshot(), OPEN)
    assert result.counts == {"evicted": 1}
    assert len(reservation_patches(api, "gpu-1")) == 2  # set, then cleared
    assert RESERVED_FOR_ANNOTATION not in annotations(api, "gpu-1")
    assert released_events(api) == [
        f"room no longer kept for {VIP}: {VIP} still Pending after 0.2 s"
    ]


def test_released_at_once_when_the_room_was_not_made(api: KubeApi) -> None:
    # web-b's eviction fails (500 on every try; its dry run passed): the room is short, so
    # nothing waits.
    api.fail("POST", "/pods/web-b/eviction$", 500, times=10, dry_run=False)
    ex = executor(api, timeout_s=60.0)
    result = ex.execute(room_plan("inf/web-a", "inf/web-b"), ex.source.snapshot(), OPEN)
    assert result.counts == {"evicted": 1, "failed": 1}
    assert RESERVED_FOR_ANNOTATION not in annotations(api, "gpu-1")
    assert released_events(api) == [
        f"room no longer kept for {VIP}: room not made, not evicted: inf/web-b"
    ]


def test_never_reserved_when_the_preflight_finds_the_room_cannot_be_made(api: KubeApi) -> None:
    # ledger-0's PDB allows no disruption: its server dry run answers 429 before anything is
    # written, so gpu-1 is neither reserved nor tainted, and web-a stays.
    ex = executor(api, timeout_s=60.0)
    result = ex.execute(room_plan("inf/web-a", "inf/ledger-0"), ex.source.snapshot(), OPEN)
    assert result.counts == {"blocked": 1, "skipped": 1}
    assert reservation_patches(api, "gpu-1") == [] and released_events(api) == []
    assert api.evicted == []


def test_dry_run_never_writes_a_reservation(api: KubeApi) -> None:
    ex = executor(api, mode=RunMode(dry_run=True, events=True))
    result = ex.execute(room_plan("inf/web-a", "inf/web-b"), ex.source.snapshot(), OPEN)
    assert result.counts == {"planned": 2}
    assert {(w.method, w.resource) for w in api.writes()} == {("POST", "events")}
    assert RESERVED_FOR_ANNOTATION not in annotations(api, "gpu-1")


@pytest.mark.parametrize(
    ("case", "action", "plan_id", "released"),
    [
        # a room made (no drain left on the node), its pod still Pending: kept for the pod, so
        # that the next leader makes it no second room while this one empties
        ("made", "kept", "", ""),
        # the same, reserved longer ago than the replacement timeout (2 s here): it has failed
        ("old", "released", "", "inf/vip still Pending after 2 s"),
        # a drain journal that cannot be read (a taint alone): the room is not proven made
        (
            "journal",
            "rolled-back",
            "plan-dead",
            "room not proven made: annotation defrag.io/drain-steps missing",
        ),
    ],
)
def test_reconcile_keeps_a_made_room_and_removes_defrags_other_reservations(
    api: KubeApi, case: str, action: str, plan_id: str, released: str
) -> None:
    actuator = KubeActuator(api.client(), retry=FAST)
    # The stopped daemon had reserved gpu-1 (and maybe left its drain journal); someone
    # reserved gpu-3 by hand (no reserved-at): that one is not defrag's to remove.
    since = SystemClock().now() - (timedelta(seconds=5) if case == "old" else timedelta(0))
    actuator.annotate_node("gpu-1", Reservation("gpu-1", VIP, since).annotations())
    if case == "journal":
        actuator.taint_node("gpu-1", "defrag.io/draining", "plan-dead", "NoSchedule")
    actuator.annotate_node("gpu-3", {RESERVED_FOR_ANNOTATION: "inf/manual"})
    outcomes = Reconciler(executor(api)).reconcile()
    assert [(o.node, o.action, o.plan_id, o.reservation) for o in outcomes] == [
        ("gpu-1", action, plan_id, VIP)
    ]
    kept = {RESERVED_FOR_ANNOTATION, RESERVED_AT_ANNOTATION} & set(annotations(api, "gpu-1"))
    assert bool(kept) is (action == "kept")
    assert annotations(api, "gpu-3")[RESERVED_FOR_ANNOTATION] == "inf/manual"
    expected = [f"room no longer kept for {VIP}: reconciled: {released}"] if released else []
    assert released_events(api) == expected


def test_a_leftover_reservation_whose_pod_is_bound_is_swept_on_the_next_execution(
    api: KubeApi,
) -> None:
    actuator = KubeActuator(api.client(), retry=FAST)
    actuator.annotate_node("gpu-3", Reservation("gpu-3", VIP, SystemClock().now()).annotations())
    api.put(k.pod("vip", "inf", 4, node_name="gpu-3", priority=1000))
    ex = executor(api)
    ex.execute(room_plan("inf/web-a"), ex.source.snapshot(), OPEN)
    assert RESERVED_FOR_ANNOTATION not in annotations(api, "gpu-3")
