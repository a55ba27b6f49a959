"""The planner's make-room knobs are the operator's: settings reach the daemon's planner
(`defrag run` wiring), so the documented way back to the earlier behaviour works."""

from __future__ import annotations

import pytest

from defrag.cli.run import _planner
from defrag.scoring.profile import ProfileConfig
from defrag.settings import Settings
from tests.test_plan_support import NOW, cluster, fill, gpu_node, pending, running


@pytest.mark.parametrize(
    ("settings", "steps", "blocked_by"),
    [
        # n1 holds a low-priority 8-GPU job, n2 is full: the only room for the 8-GPU job is
        # preempting "big" — a swap (it frees no more than it takes), refused by default
        ({}, [], "no-room"),
        ({"make_room_swaps": True}, [("preempt", "default/big")], None),
        # allowed, but the pod's GPUs × wait (8 × its pending hours) is under 1e6 × the cost
        ({"make_room_swaps": True, "make_room_worth": 1e6}, [], "not-worth-it"),
    ],
)
def test_make_room_settings_reach_the_daemons_planner(
    settings: dict[str, object], steps: list[tuple[str, str]], blocked_by: str | None
) -> None:
    nodes = [gpu_node("n1"), gpu_node("n2")]
    pods = [running("big", "n1", 8, priority=0), *fill("n2", 8, priority=0), pending("job", 8)]
    snapshot = cluster(nodes, pods)
    plan = _planner(Settings(planner=settings))(
        snapshot, "make-room", NOW, profile=ProfileConfig().for_cluster(snapshot)
    )
    assert [(s.kind, s.pod) for s in plan.steps] == steps
    if blocked_by is not None:
        assert blocked_by in {b.constraint for b in plan.blocked}
