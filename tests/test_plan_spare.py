"""Make-room spares a multi-GPU job that cannot checkpoint on request when the pod it would make
room for is another multi-GPU pod of equal or lower priority (defrag.plan.spare, issue 25)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from defrag.model.resources import CHECKPOINT_ANNOTATION, CHECKPOINT_SUPPORT_ANNOTATION, Pod
from defrag.plan import PlanOptions, make_plan
from defrag.plan.spare import spared
from defrag.sim.daemon_driver import daemon_setup
from tests.test_plan_support import NOW, cluster, gpu_node, pending, running

HANDSHAKE = {CHECKPOINT_SUPPORT_ANNOTATION: "supported"}


@pytest.mark.parametrize(
    ("victim", "pod", "kept"),
    [
        # an 8-GPU job (training kind: ≥ 2 whole GPUs), no handshake, for an 8-GPU pod of the
        # same priority: spared
        (running("v", "n1", 8, priority=100), pending("p", 8, priority=100), True),
        # … or of a lower one
        (running("v", "n1", 8, priority=100), pending("p", 2, priority=50), True),
        # a higher-priority pending pod may still move it
        (running("v", "n1", 8, priority=100), pending("p", 8, priority=101), False),
        # a job that answers the handshake is asked to checkpoint first: it may move
        (running("v", "n1", 8, priority=100, annotations=HANDSHAKE), pending("p", 8), False),
        # a one-GPU victim is not a multi-GPU job
        (running("v", "n1", 1, priority=100), pending("p", 8, priority=100), False),
        # four half GPUs are shares, not a multi-GPU job (workload_kind: batch)
        (running("v", "n1", 4, gpu_milli=500, priority=100), pending("p", 8), False),
        # the pending pod asks one GPU: not a multi-GPU pod
        (running("v", "n1", 8, priority=100), pending("p", 1, priority=100), False),
    ],
)  # fmt: skip
def test_which_victims_are_spared(victim: Pod, pod: Pod, kept: bool) -> None:
    status = spared(victim, pod)
    assert status.ok is not kept
    if kept:
        assert status.reasons[0].startswith("spared: ")


def _checkpointed(hours_ago: float) -> dict[str, str]:
    return {CHECKPOINT_ANNOTATION: (NOW - timedelta(hours=hours_ago)).isoformat()}


@pytest.mark.parametrize(
    ("priority", "notes", "spare", "moved"),
    [
        # n1 holds a 4-GPU job of priority 100; the 8-GPU pod fits only on n1 (n2 has 4 GPUs):
        # the one room moves the job to n2. Its price is small — 4 GPUs × (10/60 restart +
        # 0.1 h since its checkpoint) × (1 + 100/1000) = 1.17 GPU·h, under the pod's wait,
        # 8 GPUs × 1 h = 8 — yet the job loses its work and restart for a pod no more urgent:
        # spared for a pod of equal priority …
        (100, {}, True, False),
        # … or lower,
        (50, {}, True, False),
        # moved for a higher one,
        (200, {}, True, True),
        # moved when it answers the handshake (it checkpoints first: 4 × 10/60 × 1.1 = 0.73),
        (100, HANDSHAKE, True, True),
        # and moved as before with the rule off (PlanOptions.spare_jobs=False).
        (100, {}, False, True),
    ],
)  # fmt: skip
def test_make_room_spares_a_job_that_cannot_checkpoint_on_request(
    priority: int, notes: dict[str, str], spare: bool, moved: bool
) -> None:
    nodes = [gpu_node("n1"), gpu_node("n2", gpus=4)]
    job = running("train", "n1", 4, priority=100, annotations={**_checkpointed(0.1), **notes})
    pods = [job, pending("big", 8, priority=priority)]
    plan = make_plan(cluster(nodes, pods), "make-room", now=NOW,
                     options=PlanOptions(spare_jobs=spare))  # fmt: skip
    assert [(s.kind, s.pod, s.target) for s in plan.steps] == (
        [("migrate", "default/train", "n2")] if moved else []
    )
    if not moved:
        reasons = {b.pod: (b.constraint, b.detail) for b in plan.blocked}
        assert reasons["default/train"][0] == "spared"
        assert "does not answer the checkpoint handshake" in reasons["default/train"][1]


@pytest.mark.parametrize(("value", "expected"), [(None, False), (False, False), (True, True)])
def test_the_simulator_takes_the_rule_as_a_daemon_setting(
    value: bool | None, expected: bool
) -> None:
    sets = {} if value is None else {"planner.make_room_spares_jobs": value}
    assert daemon_setup(None, sets).planner.options.spare_jobs is expected


@pytest.mark.parametrize(("value", "expected"), [(None, 0.0), (0.5, 0.5)])
def test_the_simulator_takes_the_unknown_work_cap_as_a_daemon_setting(
    value: float | None, expected: float
) -> None:
    sets = {} if value is None else {"planner.unknown_hours": value}
    assert daemon_setup(None, sets).planner.options.cost.unknown_hours == expected
