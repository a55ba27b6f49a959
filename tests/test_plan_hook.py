"""The planner's simulator hook: moves that the simulator can apply, pods never lost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from defrag.detect.findings import Finding
from defrag.model.resources import Node, Pod
from defrag.model.workload import WorkloadMix
from defrag.scoring.framework import Placement
from defrag.scoring.policies import make_policy
from defrag.scoring.scheduler import schedule
from defrag.sim.defrag_hook import PlannerHook, make_defrag_hook, starvation_rules
from defrag.sim.hooks import DefragHook, Move
from defrag.sim.migration import Job
from defrag.sim.state import SimState
from defrag.sim.trace import QOS_PRIORITY


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


def test_unknown_option_or_protocol_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown defrag hook option"):
        make_defrag_hook("fgd", "fill", bogus=1)
    with pytest.raises(ValueError, match="unknown protocol"):
        make_defrag_hook("fgd", "replay")


def test_timeline_never_acts_on_arrival_the_daemon_waits_for_its_rule() -> None:
    state = shared_state("reserve-binpack")
    hook = make_defrag_hook("reserve-binpack", "timeline")
    assert hook.on_unschedulable(state, Pod("pair", num_gpu=2, cpu_milli=1000), 1.0) == ()


# --- the daemon in the timeline: rule, windows, holds, checkpoint-aware cost --------------------

NOW = 11 / 6  # 1 h 50 min


def daemon_state() -> SimState:
    """Three 4-GPU nodes. a and b each run one 1-GPU BE pod; c runs a 3-GPU LS pod (1 free).

    ``stale`` on a checkpointed 50 min ago (started at 0, checkpoints every hour of work);
    ``fresh`` on b checkpointed 1 min ago (started at 49 min: 61 min of work at NOW). A 4-GPU
    LS pod waits since 1 h 20 min: either BE pod can move to c's free GPU to empty a node.
    """
    nodes = [Node(n, cpu_milli=32_000, memory_mib=0, num_gpu=4, gpu_model="G2") for n in "abc"]
    mix = WorkloadMix.default()
    state = SimState.new(nodes, make_policy("reserve-binpack", mix=mix), "reserve-binpack", mix)

    def run(name: str, gpus: int, qos: str, row: int, started: float) -> None:
        pod = Pod(name, num_gpu=gpus, cpu_milli=1000, qos=qos, priority=QOS_PRIORITY[qos])
        state.place(pod, row, tuple(range(gpus)), started)
        job = Job(pod, started, work_h=50.0, interval_h=1.0, overhead_h=0.1)
        job.start(started, overhead=False)
        state.jobs[pod.key] = job

    run("stale", 1, "BE", 0, 0.0)
    run("fresh", 1, "BE", 1, 49 / 60)
    run("fill", 3, "LS", 2, 0.0)
    return state


def wait(state: SimState, name: str, gpus: int, qos: str, since: float) -> Pod:
    pod = Pod(name, num_gpu=gpus, cpu_milli=1000, qos=qos, priority=QOS_PRIORITY[qos])
    job = Job(pod, since, work_h=5.0, interval_h=1.0, overhead_h=0.1)
    job.queued_at = since
    state.jobs[pod.key] = job
    state.pending[pod.key] = pod
    return pod


def test_the_shipped_rules_find_high_priority_pods_and_fragmented_pods_of_any_priority() -> None:
    high, fragmented = starvation_rules(None)
    assert (high.for_s, high.min_priority, high.action) == (900.0, 1000, "make-room")
    assert (fragmented.for_s, fragmented.any_priority, fragmented.action) == (
        1800.0,
        True,
        "make-room",
    )
    assert fragmented.reasons == {"fragmented"}
    state = daemon_state()  # free GPUs: a 3, b 3, c 1 — 7 in all, at most 3 on one node
    wait(state, "ls-20min", 4, "LS", NOW - 20 / 60)
    wait(state, "ls-10min", 4, "LS", NOW - 10 / 60)  # under the 15 min of `for:`
    wait(state, "burstable-1h", 2, "Burstable", NOW - 1.0)  # 1000: at the threshold
    # best effort (priority 0 < 1000): only the fragmented rule, 30 min, `fragmented` only
    wait(state, "be-1h", 4, "BE", NOW - 1.0)  # 4 ≤ 7 free, no node has 4: fragmented
    wait(state, "be-20min", 4, "BE", NOW - 20 / 60)  # fragmented, but under 30 min
    wait(state, "be-huge", 8, "BE", NOW - 1.0)  # 8 > 7 free: insufficient-gpus, not taken
    wait(state, "be-pair", 2, "BE", NOW - 1.0)  # fits on a now: placeable, not taken
    hook = make_defrag_hook("reserve-binpack", "timeline")
    assert isinstance(hook, PlannerHook)
    found = [p.name for p in hook.starved(state, NOW)]
    assert found == ["ls-20min", "burstable-1h", "be-1h"]  # priority first, then pending since


def test_shipped_rule_makes_room_only_inside_windows_and_holds_the_node() -> None:
    state = daemon_state()
    big = wait(state, "big", 4, "LS", NOW - 0.5)
    hook = make_defrag_hook("reserve-binpack", "timeline")
    assert isinstance(hook, PlannerHook)
    assert hook.on_tick(state, NOW) == ()  # action make-room: no window open, nothing done
    moves = hook.on_window(state, NOW)  # a window opens: make-room for the starved pod
    assert len(moves) == 1
    assert moves[0].for_pod == big.key  # the node it frees is held for the pod
    assert moves[0].target_row == state.arrays.index["c"]
    state.apply_moves(moves)
    assert isinstance(schedule(big, state.arrays, state.policy), Placement)
    now_hook = make_defrag_hook("reserve-binpack", "timeline", make_room_now=True)
    assert len(daemon_hook_moves(now_hook)) == 1  # make-room-now: at any cycle


def daemon_hook_moves(hook: DefragHook) -> Sequence[Move]:
    assert isinstance(hook, PlannerHook)
    state = daemon_state()
    wait(state, "big", 4, "LS", NOW - 0.5)
    return hook.on_tick(state, NOW)


@pytest.mark.parametrize(
    ("aware", "victim"),
    [
        # aware: stale would lose 50 min (cost 1 + 1 GPU × 0.833 h), fresh 1 min (1 + 0.017):
        # fresh moves. Blind: both cost 1 (the per-eviction constant): the first row, a.
        (True, "fresh"),
        (False, "stale"),
    ],
)
def test_checkpoint_aware_planning_evicts_the_pod_that_loses_least(
    aware: bool, victim: str
) -> None:
    hook = make_defrag_hook(
        "reserve-binpack", "timeline", make_room_now=True, checkpoint_aware=aware
    )
    moves = daemon_hook_moves(hook)
    assert [m.pod_id for m in moves] == [f"default/{victim}"]


def test_migrations_of_any_priority_make_room_where_strict_victims_cannot() -> None:
    # daemon_state with both 1-GPU pods made LS (priority 3); a Burstable (priority 1) 4-GPU
    # pod waits. Strictly lower victims only (the planner before issue 17): none, nothing
    # moves. The daemon's planner now moves pods of any priority that re-fit: one LS pod
    # moves to c.
    state = daemon_state()
    for key in ("default/stale", "default/fresh"):
        placed = state.placed[key]
        state.remove(key)
        ls = Pod(placed.pod.name, num_gpu=1, cpu_milli=1000, qos="LS", priority=3)
        state.place(ls, placed.row, placed.gpus, placed.since)
        state.jobs[key] = replace(state.jobs[key], pod=ls)
    wait(state, "big", 4, "Burstable", NOW - 0.5)
    strict = make_defrag_hook(
        "reserve-binpack", "timeline", make_room_now=True, migrate_any_priority=False
    )
    assert isinstance(strict, PlannerHook) and strict.on_tick(state, NOW) == ()
    daemon = make_defrag_hook("reserve-binpack", "timeline", make_room_now=True)
    assert isinstance(daemon, PlannerHook)
    moves = daemon.on_tick(state, NOW)
    assert len(moves) == 1 and moves[0].target_row == state.arrays.index["c"]


def test_eviction_budgets_per_window_opening_and_per_day_outside_windows() -> None:
    hook = make_defrag_hook("reserve-binpack", "timeline", window_evictions=2)
    assert isinstance(hook, PlannerHook)
    assert hook._budget(1.0, False, ()) == 2
    hook.spent[hook.budget_key] = 2  # day 0 spent outside windows
    hook.open_until = 7.0
    assert hook._budget(6.5, True, ()) == 2  # a window opening has its own budget
    assert hook._budget(8.0, False, ()) == 0  # back outside it: day 0 stays spent
    assert hook._budget(25.0, False, ()) == 2  # a new day


@pytest.mark.parametrize(
    ("follow", "starved_gpus", "budget"),
    [
        # the backlog's GPUs × 1 eviction per GPU, at least the fixed 10, at most 512:
        (True, [8, 8, 4], 20),  # 8 + 8 + 4 = 20 GPUs asked: 20 evictions
        (True, [2], 10),  # 2 GPUs: the floor, 10
        (True, [8] * 70, 512),  # 560 GPUs: the ceiling, 512
        (False, [8, 8, 4], 10),  # the fixed budget
    ],
)
def test_a_window_budget_follows_its_backlog(
    follow: bool, starved_gpus: list[int], budget: int
) -> None:
    hook = make_defrag_hook("least-allocated", "timeline", follow_demand=follow)
    assert isinstance(hook, PlannerHook)
    starved = [Pod(f"p{i}", num_gpu=g, qos="LS") for i, g in enumerate(starved_gpus)]
    hook.open_until = 7.0
    assert hook._budget(6.5, True, starved) == budget
    hook.spent[hook.budget_key] = 3
    # fixed when the window opens: a smaller backlog later in it does not shrink it
    assert hook._budget(6.8, True, starved[:1]) == budget - 3
    assert hook._budget(8.0, False, starved) == 10  # outside windows: the fixed budget


@pytest.mark.parametrize(
    ("on_demand", "starved", "repacks"),
    [
        # Four 0.3-GPU shares, one per GPU of two 2-GPU nodes: a window's repack packs them.
        # On demand (the default), nobody waits for the GPUs it would free: no drain.
        (True, False, False),
        (False, False, True),  # every window repacks (the hook before issue 25)
        # A 4-GPU LS pod starved for an hour cannot get room on 2-GPU nodes: demand is
        # unmet, the window repacks.
        (True, True, True),
    ],
)
def test_a_window_repacks_only_for_starved_pods_left_without_room(
    on_demand: bool, starved: bool, repacks: bool
) -> None:
    state = shared_state("reserve-binpack")
    if starved:
        wait(state, "huge", 4, "LS", NOW - 1.0)
    hook = make_defrag_hook("reserve-binpack", "timeline", repack_on_demand=on_demand)
    moves = hook.on_window(state, NOW)
    assert all(m.for_pod is None for m in moves)  # no room could be made: only drains
    assert bool(moves) is repacks


PACKS = Finding("packing", "cluster", "info", "the scheduler packs GPU pods: of 280 …")


@pytest.mark.parametrize(
    ("packing", "patience_h", "found"),
    [
        # no packing finding: the rules' pods, as in the test above
        (None, 24.0, ["ls-20min", "burstable-1h", "be-1h"]),
        # the scheduler packs: nobody has waited 24 h
        (PACKS, 24.0, []),
        # patience 0.5 h: the two pods pending 1 h (≥ 0.5 h) get room, the 20-minute one waits
        (PACKS, 0.5, ["burstable-1h", "be-1h"]),
        # patience 0: off
        (PACKS, 0.0, ["ls-20min", "burstable-1h", "be-1h"]),
    ],
)
def test_while_the_scheduler_packs_a_starved_pod_waits_out_the_patience(
    packing: Finding | None, patience_h: float, found: list[str]
) -> None:
    state = daemon_state()
    wait(state, "ls-20min", 4, "LS", NOW - 20 / 60)
    wait(state, "burstable-1h", 2, "Burstable", NOW - 1.0)
    wait(state, "be-1h", 4, "BE", NOW - 1.0)
    hook = make_defrag_hook("reserve-binpack", "timeline", packing_patience_h=patience_h)
    assert isinstance(hook, PlannerHook)
    hook.packing = packing
    assert [p.name for p in hook.starved(state, NOW)] == found


def test_the_hook_reads_the_packing_finding_off_the_state_as_the_daemon_does() -> None:
    # 10 pods of 1 GPU placed one after another on the fullest node that fits (a packing
    # scheduler) over 3 nodes: with a 2-placement bar the spreading rule says "packs".
    nodes = [Node(n, cpu_milli=32_000, memory_mib=0, num_gpu=4, gpu_model="G2") for n in "abc"]
    mix = WorkloadMix.default()
    state = SimState.new(nodes, make_policy("most-allocated", mix=mix), "most-allocated", mix)
    for i in range(10):
        pod = Pod(f"p{i}", num_gpu=1, cpu_milli=1000)
        placed = schedule(pod, state.arrays, state.policy)
        assert isinstance(placed, Placement)
        state.place(pod, placed.row, placed.gpus, i / 10)
    hook = make_defrag_hook("most-allocated", "timeline")
    assert isinstance(hook, PlannerHook)
    hook.spreading = (replace(hook.spreading[0], min_placements=2),)
    found = hook._packing(state, 1.0, None)
    assert found is not None and found.kind == "packing"
    # the same pods spread one per node (least-allocated's choice): no packing finding
    spread = SimState.new(nodes, make_policy("least-allocated", mix=mix), "least-allocated", mix)
    for i in range(3):
        spread.place(Pod(f"q{i}", num_gpu=1, cpu_milli=1000), i, (0,), i / 10)
    assert hook._packing(spread, 1.0, None) is None
    # an earlier opening's finding stands on a state with too few placements to judge, for the
    # memory (24 h) and no longer: 1.0 + 24 h ≤ 24 h after it, 1.0 + 24.1 h is not
    few = SimState.new(nodes, make_policy("most-allocated", mix=mix), "most-allocated", mix)
    assert hook._packing(few, 25.0, found) is found
    assert hook._packing(few, 25.1, found) is None
