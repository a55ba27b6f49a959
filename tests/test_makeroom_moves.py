"""Make-room moves pods of any priority (only where they re-fit), prices rooms by lost work,
and repack weighs each drain against the work it loses (issue 17)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from defrag.model.resources import CHECKPOINT_ANNOTATION, Pod
from defrag.model.workload import WorkloadMix
from defrag.plan import PlanOptions, make_plan
from defrag.plan.config import RoomValue
from defrag.scoring.profile import ProfileConfig
from tests.test_plan_support import NOW, cluster, fill, gpu_node, pending, running


def _checkpointed(hours_ago: float) -> dict[str, str]:
    return {CHECKPOINT_ANNOTATION: (NOW - timedelta(hours=hours_ago)).isoformat()}


@pytest.mark.parametrize(
    ("n2_used", "steps", "reason"),
    [
        # n1 holds four priority-100 pods, the job (priority 100) needs all 8 GPUs of a node.
        # n2 has 4 free GPUs: n1's four pods re-fit there, they move (same priority: moved,
        # never preempted).
        (4, [("migrate", "n1", "n2")] * 4, None),
        # n2 has 3 free GPUs: the fourth pod would fit nowhere; it is as high as the job, so
        # it may not be preempted: no room, and the reason says it has nowhere to go.
        (5, [], "no-room"),
    ],
)
def test_same_priority_victims_move_only_when_they_re_fit(
    n2_used: int, steps: list[tuple[str, str, str]], reason: str | None
) -> None:
    nodes = [gpu_node("n1"), gpu_node("n2")]
    pods = [*fill("n1", 4, priority=100), *fill("n2", n2_used, priority=100), pending("job", 8)]
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW)
    assert [(s.kind, s.source, s.target) for s in plan.steps] == steps
    if reason is not None:
        assert reason in {b.constraint for b in plan.blocked}
        assert any("nowhere to move it" in b.detail for b in plan.blocked)


def test_lower_priority_pods_are_still_preempted_when_nothing_can_move() -> None:
    # n1: a priority-100 pod (as high as the job) and a priority-0 pod, 1 GPU each; n2 has
    # one GPU free. Room on n1 needs both gone: the peer takes n2's free GPU (it may only
    # move), the low pod fits nowhere and is preempted — 8 GPUs freed for 1 preempted (not a
    # swap). Re-placing the low pod first would take the seat the peer needs.
    nodes = [gpu_node("n1"), gpu_node("n2")]
    pods = [
        running("peer", "n1", priority=100),
        running("low", "n1", priority=0),
        *fill("n2", 7, priority=100),
        pending("job", 8),
    ]
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW)
    assert sorted((s.kind, s.pod, s.target) for s in plan.steps) == [
        ("migrate", "default/peer", "n2"),
        ("preempt", "default/low", None),
    ]


@pytest.mark.parametrize(
    ("fresh_on", "moved"),
    [
        # n1's pod checkpointed 6 min ago costs 1 GPU × (5/60 restart + 0.1 h) = 0.1833; n2's,
        # 3 h ago, 1 × (5/60 + 3) = 3.083: room is made on n1 by moving the fresh pod …
        ("n1", "default/a"),
        # … and on n2 when the fresh one sits there (the checkpoint decides, not row order).
        ("n2", "default/b"),
    ],
)
def test_checkpoint_aware_choice_moves_the_pod_just_checkpointed(fresh_on: str, moved: str) -> None:
    nodes = [gpu_node("n1"), gpu_node("n2"), gpu_node("n3")]
    hours = {"n1": 0.1, "n2": 3.0} if fresh_on == "n1" else {"n1": 3.0, "n2": 0.1}
    pods = [
        running("a", "n1", hours=5, annotations=_checkpointed(hours["n1"])),
        running("b", "n2", hours=5, annotations=_checkpointed(hours["n2"])),
        *fill("n3", 6),
        pending("job", 8),
    ]
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW)
    assert [(s.kind, s.pod, s.target) for s in plan.steps] == [("migrate", moved, "n3")]
    assert plan.steps[0].cost == pytest.approx(0.183333)


@pytest.mark.parametrize(
    ("pending_h", "checkpoint_h", "made"),
    [
        # A 4-GPU pod pending 6 min: its wait is worth 4 × 0.1 = 0.4 GPU-hour. Moving one
        # 1-GPU pod checkpointed 30 min ago costs 1 × (5/60 restart + 0.5) = 0.583 > 0.4: not
        # worth it yet.
        (0.1, 0.5, False),
        # Pending 1 h: worth 4 × 1 = 4 ≥ 0.583: the room is made.
        (1.0, 0.5, True),
        # Pending 6 min, the pod to move checkpointed just now: 1 × (5/60 + 0) = 0.083 ≤ 0.4.
        (0.1, 0.0, True),
    ],
)
def test_a_room_is_made_only_when_the_wait_outweighs_its_lost_work(
    pending_h: float, checkpoint_h: float, made: bool
) -> None:
    # n1 and n2 each hold five 1-GPU pods (3 free each): one pod must move for 4 GPUs.
    nodes = [gpu_node("n1"), gpu_node("n2")]
    notes = _checkpointed(checkpoint_h)
    pods: list[Pod] = [
        *fill("n1", 5, annotations=notes),
        *fill("n2", 5, annotations=notes),
        replace(pending("job", 4), pending_since=NOW - timedelta(hours=pending_h)),
    ]
    waited = PlanOptions(room_value=RoomValue.WAITED)  # the wait so far is what it is worth
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW, options=waited)
    assert (len(plan.steps) == 1) is made
    if not made:
        assert "not-worth-it" in {b.constraint for b in plan.blocked}
        # the check is off with room_worth=0
        lifted = make_plan(cluster(nodes, pods), "make-room", now=NOW,
                           options=PlanOptions(room_worth=0.0))  # fmt: skip
        assert len(lifted.steps) == 1


@pytest.mark.parametrize(("checkpoint_h", "drained"), [(0.0, True), (10.0, False)])
def test_a_repack_move_is_refused_when_its_lost_work_outweighs_the_gain(
    checkpoint_h: float, drained: bool
) -> None:
    # n1 holds one 1-GPU pod, n2 seven (created 2 h ago, no checkpoint: 1 GPU × (5/60
    # restart + 2) = 2.083 each). Draining n1 frees a whole node and fills n2: a
    # fragmentation gain g (measured below with the bar at 0). With the bar at g / 5, the
    # drain passes when n1's pod checkpointed just now (cost 5/60 + 0 = 0.083: ratio 12 g ≥
    # g / 5) and is refused when it checkpointed 10 h ago (cost 5/60 + 10 = 10.083: ratio
    # g / 10.083 < g / 5). Draining n2 instead costs 7 × 2.083 = 14.58.
    nodes = [gpu_node("n1"), gpu_node("n2")]
    pods = [running("solo", "n1", hours=12, annotations=_checkpointed(checkpoint_h)),
            *fill("n2", 7)]  # fmt: skip
    profile = ProfileConfig().with_mix(WorkloadMix.default())
    free = make_plan(cluster(nodes, pods), "repack", now=NOW, profile=profile,
                     options=PlanOptions(min_gain_per_cost=1e-9))  # fmt: skip
    gain = free.before["fgd_fragmented_gpus"] - free.after["fgd_fragmented_gpus"]
    assert gain > 0
    plan = make_plan(cluster(nodes, pods), "repack", now=NOW, profile=profile,
                     options=PlanOptions(min_gain_per_cost=gain / 5))  # fmt: skip
    assert [s.pod for s in plan.steps] == (["default/solo"] if drained else [])


@pytest.mark.parametrize(
    ("annotated", "ranking", "known"),
    [
        # docs/planning.md's example: 2 GPUs, priority 1000, checkpoint 3 h ago:
        # 2 GPUs (training, restart 10 min) × (10/60 + 3) × (1 + 1000/1000) = 12.667 for both.
        (True, 12.666667, 12.666667),
        # No annotation, created 3 h ago: ranked as if 3 h were lost (12.667), but the worth
        # check counts the restart alone: 2 × (10/60 + 0) × 2 = 0.667.
        (False, 12.666667, 0.666667),
    ],
)
def test_known_cost_counts_lost_work_only_from_the_annotation(
    annotated: bool, ranking: float, known: float
) -> None:
    from defrag.plan.cost import CostModel

    pod = running(
        "p", "n1", 2, priority=1000, hours=3, annotations=_checkpointed(3) if annotated else None
    )
    assert CostModel().eviction(pod, NOW) == pytest.approx(ranking)
    assert CostModel().known(pod, NOW) == pytest.approx(known)


@pytest.mark.parametrize(
    ("gpus", "milli", "qos", "hours", "known"),
    [
        # With CostModel(unknown_hours=0.5): a 1-GPU batch pod without a checkpoint, started
        # 10 min ago: all of it is at risk, 1 × (5/60 restart + 10/60) = 0.25
        (1, 1000, "", 10 / 60, 0.25),
        # … started 11 h ago (a job that never checkpoints): counted up to unknown_hours,
        # 1 × (5/60 + 0.5) = 0.583 (the ranking price counts all 11 h)
        (1, 1000, "", 11.0, 0.583333),
        # a 0.59-GPU share, 11 h: 0.59 × (5/60 + 0.5) = 0.344167
        (1, 590, "", 11.0, 0.344167),
        # a serving replica (QoS LS) keeps no state: its restart alone, 1 × 3/60 = 0.05
        (1, 1000, "LS", 11.0, 0.05),
        # no GPU, no GPU time lost: 0
        (0, 0, "", 11.0, 0.0),
    ],
)  # fmt: skip
def test_known_cost_by_kind_without_a_checkpoint(
    gpus: int, milli: int, qos: str, hours: float, known: float
) -> None:
    from defrag.plan.cost import CostModel

    pod = replace(running("p", "n1", gpus, gpu_milli=milli or 1000, hours=hours), qos=qos)
    assert CostModel(unknown_hours=0.5).known(pod, NOW) == pytest.approx(known)
    # by default (unknown_hours 0) the unannotated pod counts its restart alone
    restart = CostModel().restart(pod) * pod.gpu_demand_milli / 1000
    assert CostModel().known(pod, NOW) == pytest.approx(round(restart, 6))
