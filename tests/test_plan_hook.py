"""The planner's simulator hook: moves that the simulator can apply, pods never lost."""

from __future__ import annotations

import pytest

from defrag.model.resources import Node, Pod
from defrag.model.workload import WorkloadMix
from defrag.scoring.framework import Placement
from defrag.scoring.policies import make_policy
from defrag.scoring.scheduler import schedule
from defrag.sim.defrag_hook import make_defrag_hook
from defrag.sim.state import SimState


def shared_state(policy: str, milli: int = 300) -> SimState:
    # Two 2-GPU nodes; every GPU holds one pod of ``milli``: no GPU whole.
    nodes = [Node(n, cpu_milli=32_000, memory_mib=0, num_gpu=2, gpu_model="T4") for n in "ab"]
    mix = WorkloadMix.default()
    state = SimState.new(nodes, make_policy(policy, mix=mix), policy, mix)
    for row in range(2):
        for gpu in range(2):
            pod = Pod(f"s{row}{gpu}", num_gpu=1, gpu_milli=milli, cpu_milli=1000)
            state.place(pod, row, (gpu,))
    return state


@pytest.mark.parametrize("policy", ["reserve-binpack", "fgd", "least-allocated"])
def test_fill_hook_consolidates_shares_so_a_whole_gpu_pod_fits(policy: str) -> None:
    state = shared_state(policy)
    pod = Pod("whole", num_gpu=1, cpu_milli=1000)
    assert not isinstance(schedule(pod, state.arrays, state.policy), Placement)
    hook = make_defrag_hook(policy, "fill")
    moves = hook.on_unschedulable(state, pod, 0.0)
    assert len(moves) == 1  # one 300-milli pod joins another GPU: 600 ≤ 1000
    applied = state.apply_moves(moves)  # raises InvalidMove if the hook lied
    assert applied == 1 and state.migrations == 1
    assert len(state.placed) == 4  # nothing lost
    assert isinstance(schedule(pod, state.arrays, state.policy), Placement)


def test_fill_hook_empties_a_node_for_a_two_gpu_pod() -> None:
    state = shared_state("reserve-binpack")
    pod = Pod("pair", num_gpu=2, cpu_milli=1000)
    moves = make_defrag_hook("reserve-binpack", "fill").on_unschedulable(state, pod, 0.0)
    assert len(moves) == 2 and len({m.source_row for m in moves}) == 1
    state.apply_moves(moves)
    assert isinstance(schedule(pod, state.arrays, state.policy), Placement)


def test_fill_hook_gives_up_when_the_cluster_is_too_full() -> None:
    state = shared_state("reserve-binpack", milli=700)  # 4 × 0.3 = 1.2 GPUs free in all
    pod = Pod("pair", num_gpu=2, cpu_milli=1000)
    moves = make_defrag_hook("reserve-binpack", "fill").on_unschedulable(state, pod, 0.0)
    assert moves == ()


def test_timeline_window_makes_room_for_a_waiting_pod() -> None:
    state = shared_state("reserve-binpack")
    waiting = Pod("whole", num_gpu=1, cpu_milli=1000)
    state.pending[waiting.key] = waiting
    moves = make_defrag_hook("reserve-binpack", "timeline").on_window(state, 0.0)
    assert moves
    state.apply_moves(moves)
    assert isinstance(schedule(waiting, state.arrays, state.policy), Placement)


def test_unknown_option_or_protocol_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown defrag hook option"):
        make_defrag_hook("fgd", "fill", bogus=1)
    with pytest.raises(ValueError, match="unknown protocol"):
        make_defrag_hook("fgd", "replay")


def test_timeline_leaves_small_pods_to_departures_but_helps_multi_gpu_pods() -> None:
    state = shared_state("reserve-binpack")
    hook = make_defrag_hook("reserve-binpack", "timeline")
    assert hook.on_unschedulable(state, Pod("one", num_gpu=1, cpu_milli=1000), 1.0) == ()
    moves = hook.on_unschedulable(state, Pod("pair", num_gpu=2, cpu_milli=1000), 1.0)
    assert len(moves) == 2
