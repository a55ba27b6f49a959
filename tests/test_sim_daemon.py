"""The daemon in the simulator's loop: its own decision through the simulator's ports, and the
planner's make-room in the fill protocol."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from defrag.detect.findings import Finding
from defrag.model.resources import CHECKPOINT_ANNOTATION, Node, Pod
from defrag.model.workload import WorkloadMix
from defrag.scoring.framework import Placement
from defrag.scoring.policies import make_policy
from defrag.scoring.scheduler import schedule
from defrag.settings import SettingsError
from defrag.sim.daemon_driver import DaemonDriver, daemon_setup, window_schedule
from defrag.sim.daemon_view import QOS_CLASS_PRIORITY, ClusterView, moment
from defrag.sim.defragmenters import make_room_now
from defrag.sim.fill_hook import FillHook
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


# --- the fill protocol ---------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["reserve-binpack", "fgd", "least-allocated"])
def test_fill_hook_consolidates_shares_so_a_whole_gpu_pod_fits(policy: str) -> None:
    state = shared_state(policy)
    pod = Pod("whole", num_gpu=1, cpu_milli=1000)
    assert not isinstance(schedule(pod, state.arrays, state.policy), Placement)
    moves = FillHook().on_unschedulable(state, pod, 0.0)
    assert len(moves) == 1  # one 300-milli pod joins another GPU: 600 ≤ 1000
    applied = state.apply_moves(moves)  # raises InvalidMove if the hook lied
    assert applied == 1 and state.migrations == 1
    assert len(state.placed) == 4  # nothing lost
    assert isinstance(schedule(pod, state.arrays, state.policy), Placement)


def test_fill_hook_empties_a_node_for_a_two_gpu_pod() -> None:
    state = shared_state("reserve-binpack")
    pod = Pod("pair", num_gpu=2, cpu_milli=1000)
    moves = FillHook().on_unschedulable(state, pod, 0.0)
    assert len(moves) == 2 and len({m.source_row for m in moves}) == 1
    state.apply_moves(moves)
    assert isinstance(schedule(pod, state.arrays, state.policy), Placement)


def test_fill_hook_gives_up_when_the_cluster_is_too_full() -> None:
    state = shared_state("reserve-binpack", milli=700)  # 4 × 0.3 = 1.2 GPUs free in all
    assert FillHook().on_unschedulable(state, Pod("pair", num_gpu=2, cpu_milli=1000), 0.0) == ()


# --- the daemon: its rules, windows, rooms, budgets, patience --------------------------------

NOW = 11 / 6  # 1 h 50 min
OPEN = [{"cron": "0 0 * * *", "length_s": 7200}]  # 00:00–02:00: open at NOW
CLOSED = [{"cron": "0 12 * * *", "length_s": 3600}]  # 12:00–13:00: closed at NOW


def driver(policy: str = "reserve-binpack", *, urgent: bool = False, **sets: Any) -> DaemonDriver:
    """The daemon with the simulator's settings, a window open at NOW unless ``sets`` say
    otherwise (dotted keys with ``__`` for ``.``)."""
    overrides = {"windows.schedule": OPEN, **{k.replace("__", "."): v for k, v in sets.items()}}
    checkpoints = overrides.pop("view.checkpoints", True)
    setup = daemon_setup(None, overrides, policy=policy)
    if urgent:
        setup = replace(setup, rules=make_room_now(setup.rules))
    return DaemonDriver(setup, view=ClusterView(checkpoints=bool(checkpoints)), record=True)


def daemon_state(policy: str = "reserve-binpack") -> SimState:
    """Three 4-GPU nodes. a and b each run one 1-GPU BE pod; c runs a 3-GPU LS pod (1 free).

    ``stale`` on a checkpointed 50 min ago (started at 0, checkpoints every hour of work);
    ``fresh`` on b checkpointed 1 min ago (started at 49 min: 61 min of work at NOW). Either BE
    pod can move to c's free GPU to empty a node for a 4-GPU pod.
    """
    nodes = [Node(n, cpu_milli=32_000, memory_mib=0, num_gpu=4, gpu_model="G2") for n in "abc"]
    mix = WorkloadMix.default()
    state = SimState.new(nodes, make_policy(policy, mix=mix), policy, mix)

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


def starved(d: DaemonDriver, state: SimState) -> list[str]:
    """The pods the daemon's rules find and make room for, in the order its plan serves them."""
    decision, findings = d.decide(state, NOW)
    found = {f.subject.removeprefix("pod/default/") for f in findings if f.kind == "starvation"}
    held = {k.removeprefix("default/") for k in decision.held_back}
    return sorted(found - held)


def test_the_view_shows_the_cluster_a_daemon_would_read() -> None:
    state = daemon_state()
    pod = wait(state, "big", 4, "LS", NOW - 0.5)
    cluster = ClusterView().cluster(state, NOW)
    fresh = cluster.pods["default/fresh"]
    assert fresh.node == "b" and fresh.phase == "Running"
    assert fresh.created_at == moment(49 / 60)  # its start
    assert fresh.annotations[CHECKPOINT_ANNOTATION] == moment(49 / 60 + 1.0).isoformat()
    assert fresh.priority == QOS_CLASS_PRIORITY["BE"] == 0
    assert fresh.owner is not None and (fresh.owner.kind, fresh.owner.controller) == ("Job", True)
    waiting = cluster.pods[pod.key]
    assert waiting.node is None and waiting.pending_since == moment(NOW - 0.5)
    assert waiting.priority == 2000 and waiting.owner is not None
    assert waiting.owner.kind == "Job"  # four whole GPUs: a training job
    serving = wait(state, "web", 1, "LS", NOW)
    shown = ClusterView().cluster(state, NOW).pods[serving.key]
    assert shown.owner is not None and shown.owner.kind == "ReplicaSet"  # LS, one GPU: serving
    blind = ClusterView(checkpoints=False).cluster(state, NOW)
    assert CHECKPOINT_ANNOTATION not in blind.pods["default/fresh"].annotations


def test_the_shipped_rules_find_high_priority_pods_and_fragmented_pods_of_any_priority() -> None:
    state = daemon_state()  # free GPUs: a 3, b 3, c 1 — 7 in all, at most 3 on one node
    wait(state, "ls-20min", 4, "LS", NOW - 20 / 60)
    wait(state, "ls-10min", 4, "LS", NOW - 10 / 60)  # under the 15 min of `for:`
    wait(state, "burstable-1h", 2, "Burstable", NOW - 1.0)  # 1000: at the threshold
    # best effort (priority 0 < 1000): only the fragmented rule, 30 min, `fragmented` only
    wait(state, "be-1h", 4, "BE", NOW - 1.0)  # 4 ≤ 7 free, no node has 4: fragmented
    wait(state, "be-20min", 4, "BE", NOW - 20 / 60)  # fragmented, but under 30 min
    wait(state, "be-huge", 8, "BE", NOW - 1.0)  # 8 > 7 free: insufficient-gpus, not taken
    assert starved(driver(), state) == ["be-1h", "burstable-1h", "ls-20min"]


def test_the_daemon_makes_room_only_inside_windows_and_holds_the_node() -> None:
    state = daemon_state()
    big = wait(state, "big", 4, "LS", NOW - 0.5)
    closed = driver(windows__schedule=CLOSED)
    assert closed.on_tick(state, NOW) == ()  # action make-room: no window open
    assert closed.history == []  # a cycle that cannot act is not simulated
    moves = driver().on_tick(state, NOW)
    assert len(moves) == 1
    assert moves[0].for_pod == big.key  # the node it frees is held for the pod
    assert moves[0].target_row == state.arrays.index["c"]
    state.apply_moves(moves)
    assert isinstance(schedule(big, state.arrays, state.policy), Placement)
    # make-room-now: at any cycle, on the day's budget
    now = driver(windows__schedule=CLOSED, urgent=True)
    state = daemon_state()
    wait(state, "big", 4, "LS", NOW - 0.5)
    assert len(now.on_tick(state, NOW)) == 1
    assert now.history is not None and now.history[0].decision.window.key.startswith(
        "outside-windows/2026-01-01"
    )


@pytest.mark.parametrize(
    ("checkpoints", "victim"),
    [
        # "old" started at 0 and checkpointed a minute ago; "young" started 20 min ago and has
        # not checkpointed yet. Shown its checkpoint, old loses a minute: it moves. Blind (no
        # pod shows one), each is priced since it started: young moves.
        (True, "old"),
        (False, "young"),
    ],
)
def test_checkpoint_aware_planning_evicts_the_pod_that_loses_least(
    checkpoints: bool, victim: str
) -> None:
    state = daemon_state()
    for key, started, interval in (
        ("default/stale", 0.0, NOW - 1 / 60),
        ("default/fresh", NOW - 1 / 3, 1.0),
    ):
        placed = state.placed[key]
        state.remove(key)
        name = "old" if key.endswith("stale") else "young"
        pod = Pod(name, num_gpu=1, cpu_milli=1000, qos="BE", priority=0)
        state.place(pod, placed.row, placed.gpus, started)
        job = Job(pod, started, work_h=50.0, interval_h=interval, overhead_h=0.1)
        job.start(started, overhead=False)
        state.jobs[pod.key] = job
        del state.jobs[key]
    wait(state, "big", 4, "LS", NOW - 0.5)
    moves = driver(view__checkpoints=checkpoints).on_tick(state, NOW)
    assert [m.pod_id for m in moves] == [f"default/{victim}"]


def test_migrations_of_any_priority_make_room_where_strict_victims_cannot() -> None:
    # both 1-GPU pods made LS; a Burstable 4-GPU pod waits. Strictly lower victims only: none.
    state = daemon_state()
    for key in ("default/stale", "default/fresh"):
        placed = state.placed[key]
        state.remove(key)
        ls = Pod(placed.pod.name, num_gpu=1, cpu_milli=1000, qos="LS", priority=3)
        state.place(ls, placed.row, placed.gpus, placed.since)
        state.jobs[key] = replace(state.jobs[key], pod=ls)
    wait(state, "big", 4, "Burstable", NOW - 0.5)
    # make-room-now outside the windows: make-room alone (no repack for the pod left waiting)
    closed = {"urgent": True, "windows__schedule": CLOSED}
    strict = driver(planner__make_room_moves_any_priority=False, **closed)
    assert strict.on_tick(state, NOW) == ()
    moves = driver(**closed).on_tick(state, NOW)
    assert len(moves) == 1 and moves[0].target_row == state.arrays.index["c"]


def test_a_window_opening_spends_its_budget_once_across_its_cycles() -> None:
    # a budget of 1 per window, not following demand: the first cycle's room spends it; a
    # second starved pod in the same opening waits for the next.
    d = driver(windows__max_evictions_per_window=1, windows__budget_follows_demand=False)
    state = daemon_state()
    wait(state, "big", 4, "LS", NOW - 0.5)
    moves = d.on_tick(state, NOW)
    assert len(moves) == 1
    state.apply_moves(moves)
    big = state.pending.pop("default/big")
    state.place(big, state.arrays.index["b"], (0, 1, 2, 3))  # it takes its room
    wait(state, "next", 4, "LS", NOW - 0.5)
    assert d.on_tick(state, NOW + 1 / 60) == ()
    assert d.history is not None
    plan = d.history[-1].decision.plan
    assert plan is not None and any(b.constraint == "budget-window" for b in plan.blocked)
    assert d.ledger.ledger(d.history[-1].decision.window.key).total == 1


PACKS = Finding("packing", "cluster", "info", "the scheduler packs GPU pods: of 280 …")


@pytest.mark.parametrize(
    ("packing", "patience_s", "found"),
    [
        (None, 86400.0, ["be-1h", "burstable-1h", "ls-20min"]),
        (PACKS, 86400.0, []),  # the scheduler packs: nobody has waited 24 h
        (PACKS, 1800.0, ["be-1h", "burstable-1h"]),  # 30 min: the two pods pending 1 h
        (PACKS, 0.0, ["be-1h", "burstable-1h", "ls-20min"]),  # patience 0: off
    ],
)
def test_while_the_scheduler_packs_a_starved_pod_waits_out_the_patience(
    packing: Finding | None, patience_s: float, found: list[str]
) -> None:
    state = daemon_state()
    wait(state, "ls-20min", 4, "LS", NOW - 20 / 60)
    wait(state, "burstable-1h", 2, "Burstable", NOW - 1.0)
    wait(state, "be-1h", 4, "BE", NOW - 1.0)
    d = driver(planner__make_room_packing_patience_s=patience_s)
    d.packing = None if packing is None else replace(packing, since=moment(NOW))
    assert starved(d, state) == found


def test_the_packing_verdict_is_read_off_the_view_by_the_spreading_rule() -> None:
    # 10 pods of 1 GPU placed one after another on the fullest node that fits (a packing
    # scheduler) over 3 nodes, in the last hour.
    nodes = [Node(n, cpu_milli=32_000, memory_mib=0, num_gpu=4, gpu_model="G2") for n in "abc"]
    mix = WorkloadMix.default()
    state = SimState.new(nodes, make_policy("most-allocated", mix=mix), "most-allocated", mix)
    for i in range(10):
        pod = Pod(f"p{i}", num_gpu=1, cpu_milli=1000)
        placed = schedule(pod, state.arrays, state.policy)
        assert isinstance(placed, Placement)
        state.place(pod, placed.row, placed.gpus, 1.0 + i / 10)
    rules = daemon_setup(None, {"windows.schedule": OPEN}).rules
    spreading = [r for r in rules if r.rule.detector == "spreading"]
    assert spreading, "the shipped rules judge the scheduler"
    low = replace(spreading[0], rule=spreading[0].rule.model_copy(update={"min_placements": 2}))
    d = driver("most-allocated")
    d.setup = replace(d.setup, rules=type(rules)((low,)))
    d.detector = type(d).__init__.__globals__["cycle_detector"](d.setup.rules, None)
    decision, _ = d.decide(state, 2.0)
    assert decision.packing is not None and decision.packing.kind == "packing"


def test_the_simulator_windows_and_settings_are_the_daemons() -> None:
    assert window_schedule(6.0) == [{"cron": "0 */6 * * *", "length_s": 3600.0, "timezone": "UTC"}]
    assert window_schedule(24.0)[0]["cron"] == "0 0 * * *"
    with pytest.raises(ValueError, match="no crontab form"):
        window_schedule(5.0)
    with pytest.raises(SettingsError, match=r"planner\.bogus"):
        daemon_setup(None, {"planner.bogus": 1})
    with pytest.raises(SettingsError, match=r"windows\.max_evictions_per_window"):
        daemon_setup(None, {"max_evictions_per_window": 3})
    shipped = daemon_setup(None, {"windows.schedule": OPEN, "planner.make_room_worth": 3})
    assert shipped.planner.options.room_worth == 3.0
    assert shipped.planner.constraints.budget.per_namespace == 1_000_000


def test_the_deployments_settings_file_runs_in_the_simulator() -> None:
    from pathlib import Path

    setup = daemon_setup(Path("deploy/base/settings.yaml"), policy="least-allocated")
    assert [w.cron for w in setup.cycle.windows] == ["0 2 * * *"]  # the file's, not the sim's
    assert setup.planner.constraints.budget.per_namespace == 5  # the daemon's own limit
    assert setup.cycle.profile.policy == "least-allocated"
