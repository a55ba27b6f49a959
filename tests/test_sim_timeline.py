"""The timeline protocol: arrivals, queue order, retry on departure, no head-of-line blocking."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from defrag.model.resources import Node, Pod
from defrag.sim.hooks import REQUEUE, Move
from defrag.sim.state import SimState
from defrag.sim.timeline import (
    Arrival,
    DurationModel,
    TimelineConfig,
    arrival_rate,
    generate_arrivals,
    replay_timeline,
    run_timeline,
)
from defrag.sim.trace import QOS_PRIORITY

NODE = (Node("n0", cpu_milli=64_000, memory_mib=65_536, num_gpu=8, gpu_model="G2"),)
CONFIG = TimelineConfig(hours=20.0, warmup_hours=0.0, sample_every_h=0.5)


def pod(name: str, gpus: int, qos: str = "BE") -> Pod:
    return Pod(name, num_gpu=gpus, cpu_milli=1000, qos=qos, priority=QOS_PRIORITY[qos])


def waits(run_arrivals: Sequence[Arrival]) -> dict[str, float]:
    """Start − arrival for each pod, read back from the per-class stats (one pod per class)."""
    run = replay_timeline(NODE, run_arrivals, "best-fit", config=CONFIG)
    return {c.name: c.mean_wait_h for c in run.by_priority}


def test_waiting_pods_are_retried_in_priority_order_when_capacity_frees() -> None:
    # t=0 an 8-GPU BE job fills the node until t=1. Waiting: a 1-GPU Burstable pod (t=0.1)
    # and an 8-GPU LS pod (t=0.2). At t=1 the LS pod goes first and takes all 8 GPUs, though
    # it arrived later; the Burstable pod waits for it to end at t=1 + 2 = 3.
    run = replay_timeline(
        NODE,
        [
            Arrival(0.0, pod("big", 8, "BE"), 1.0),
            Arrival(0.1, pod("small", 1, "Burstable"), 1.0),
            Arrival(0.2, pod("urgent", 8, "LS"), 2.0),
        ],
        "best-fit",
        config=CONFIG,
    )
    by_prio = {c.name: c for c in run.by_priority}
    assert by_prio["LS"].mean_wait_h == pytest.approx(1.0 - 0.2)
    assert by_prio["Burstable"].mean_wait_h == pytest.approx(3.0 - 0.1)
    assert by_prio["BE"].mean_wait_h == 0.0
    assert all(c.still_pending == 0 for c in run.by_priority)


def test_no_head_of_line_blocking() -> None:
    # Two 4-GPU BE jobs hold the node (until t=1 and t=10). An 8-GPU LS job waits from t=0.1,
    # a 1-GPU BE pod from t=0.2. At t=1 four GPUs free: the LS job still does not fit, the BE
    # pod does and starts at once (kube-scheduler does not hold it back). The LS job starts
    # at t=10 when the other 4-GPU job ends (the BE pod ran 1 → 3).
    w = waits(
        [
            Arrival(0.0, pod("x", 4), 1.0),
            Arrival(0.0, pod("y", 4, "Guaranteed"), 10.0),
            Arrival(0.1, pod("train", 8, "LS"), 1.0),
            Arrival(0.2, pod("tiny", 1, "Burstable"), 2.0),
        ]
    )
    assert w["Burstable"] == pytest.approx(1.0 - 0.2)
    assert w["LS"] == pytest.approx(10.0 - 0.1)


def test_fifo_within_a_priority_class() -> None:
    # Two 8-GPU BE pods wait behind a running one; the earlier one starts first (t=1), the
    # later one when it ends (t=2).
    run = replay_timeline(
        NODE,
        [
            Arrival(0.0, pod("run", 8), 1.0),
            Arrival(0.3, pod("first", 8), 1.0),
            Arrival(0.5, pod("second", 8), 1.0),
        ],
        "best-fit",
        config=CONFIG,
    )
    eight = next(c for c in run.by_gpus if c.name == "8")
    # Waits 0, 1 − 0.3 and 2 − 0.5: mean 2.2 / 3.
    assert eight.pods == 3 and eight.mean_wait_h == pytest.approx((0.7 + 1.5) / 3)


def test_pods_still_waiting_at_the_end_count_with_their_wait_so_far() -> None:
    config = TimelineConfig(hours=5.0, warmup_hours=0.0)
    run = replay_timeline(
        NODE,
        [Arrival(0.0, pod("hog", 8), 100.0), Arrival(1.0, pod("starved", 8, "LS"), 1.0)],
        "best-fit",
        config=config,
    )
    ls = next(c for c in run.by_priority if c.name == "LS")
    assert (ls.still_pending, ls.mean_wait_h) == (1, pytest.approx(5.0 - 1.0))
    assert run.series.queue[-1] == 1
    # Every sample has the node full: 8 of 8 GPUs.
    assert set(run.series.allocation) == {100.0}


def test_warmup_pods_are_not_measured() -> None:
    config = TimelineConfig(hours=5.0, warmup_hours=2.0)
    run = replay_timeline(
        NODE,
        [Arrival(0.5, pod("early", 1), 1.0), Arrival(2.5, pod("late", 2), 1.0)],
        "best-fit",
        config=config,
    )
    assert [c.name for c in run.by_gpus] == ["2", "multi"]
    assert run.series.time_h[0] == pytest.approx(2.0)


def test_window_hook_moves_are_applied_and_waiting_pods_retried() -> None:
    nodes = (
        Node("a", 64_000, 65_536, num_gpu=8, gpu_model="G2"),
        Node("b", 64_000, 65_536, num_gpu=8, gpu_model="G2"),
    )

    class Consolidate:
        """At the window, moves the 4-GPU pod on b next to the one on a."""

        calls = 0

        def on_unschedulable(self, state: SimState, p: Pod, now: float) -> Sequence[Move]:
            return ()

        def on_window(self, state: SimState, now: float) -> Sequence[Move]:
            Consolidate.calls += 1
            a, b = state.arrays.index["a"], state.arrays.index["b"]
            on_b = [pid for pid, pl in state.rows[b].items() if pl.pod.num_gpu == 4]
            if not on_b:
                return ()
            free = [g for g in range(8) if state.arrays.gpu_free[a, g] == 1000][:4]
            return [Move(on_b[0], b, a, tuple(free))]

    # least-allocated spreads two 4-GPU pods over a and b; an 8-GPU pod then waits. The
    # window at t=1 moves one 4-GPU pod, which frees b entirely: the 8-GPU pod starts at t=1.
    config = TimelineConfig(hours=10.0, warmup_hours=0.0, window_every_h=1.0)
    run = replay_timeline(
        nodes,
        [
            Arrival(0.0, pod("p", 4), 50.0),
            Arrival(0.0, pod("q", 4), 50.0),
            Arrival(0.2, pod("big", 8, "LS"), 5.0),
        ],
        "least-allocated",
        config=config,
        hook=Consolidate(),
    )
    ls = next(c for c in run.by_priority if c.name == "LS")
    assert ls.mean_wait_h == pytest.approx(1.0 - 0.2)
    assert (run.migrations, run.defrag) == (1, True)
    assert Consolidate.calls == 10  # windows at 1, 2, …, 10 h


def test_arrival_rate_offers_the_requested_load() -> None:
    shapes = [Pod("one", num_gpu=1), Pod("eight", num_gpu=8)]
    durations = DurationModel(
        small_median_h=2.0, small_sigma=0.0, multi_gpu_median_h=10.0, multi_gpu_sigma=0.0
    )
    config = TimelineConfig(load=0.5, durations=durations)
    # E[demand × run time] = (1 × 2 + 8 × 10) / 2 = 41 GPU·h per pod; 0.5 × 100 GPUs / 41.
    assert arrival_rate(shapes, 100, config) == pytest.approx(50 / 41)


def test_generated_arrivals_are_seeded_poisson() -> None:
    shapes = [Pod("one", num_gpu=1, qos="LS"), Pod("four", num_gpu=4)]
    config = TimelineConfig(hours=200.0, warmup_hours=0.0, prefill=False)
    a = generate_arrivals(shapes, 64, config, seed=42)
    assert a == generate_arrivals(shapes, 64, config, seed=42)
    assert a != generate_arrivals(shapes, 64, config, seed=43)
    times = np.array([x.time_h for x in a])
    assert (np.diff(times) >= 0).all() and times[-1] < 200.0
    rate = arrival_rate(shapes, 64, config)
    # A Poisson count over 200 h has mean and variance rate × 200: within 4 σ.
    assert abs(len(a) - rate * 200) < 4 * math.sqrt(rate * 200)
    multi = [x.duration_h for x in a if x.pod.num_gpu > 1]
    small = [x.duration_h for x in a if x.pod.num_gpu == 1]
    # Medians near 12 h and 2 h (log-normal medians of the defaults).
    assert 8 < float(np.median(multi)) < 18 and 1.4 < float(np.median(small)) < 2.8


def test_run_timeline_end_to_end_is_deterministic() -> None:
    nodes = [Node(f"n{i}", 64_000, 65_536, num_gpu=8, gpu_model="G2") for i in range(4)]
    shapes = [pod("one", 1, "LS"), pod("two", 2, "BE"), pod("eight", 8, "LS")]
    config = TimelineConfig(hours=6.0, warmup_hours=2.0)
    a = run_timeline(nodes, shapes, "least-allocated", 7, config=config)
    b = run_timeline(nodes, shapes, "least-allocated", 7, config=config)
    assert a.to_dict() | {"seconds": 0} == b.to_dict() | {"seconds": 0}
    assert 0 < a.mean_allocation <= 100
    assert {"pending_by_gpus", "pending_by_priority", "migrations"} <= set(a.to_dict())


@pytest.mark.parametrize(
    "bad",
    [
        {"load": 0.0},
        {"hours": 0.0},
        {"warmup_hours": -1.0},
        {"window_every_h": 0.0},
        {"tick_every_h": 0.0},
    ],
)
def test_bad_config_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        TimelineConfig(**bad)


def test_prefill_starts_in_steady_state() -> None:
    shapes = [Pod("one", num_gpu=1), Pod("four", num_gpu=4)]
    durations = DurationModel(
        small_median_h=2.0, small_sigma=0.5, multi_gpu_median_h=20.0, multi_gpu_sigma=0.5
    )
    config = TimelineConfig(load=0.8, hours=1.0, warmup_hours=0.0, durations=durations)
    arrivals = generate_arrivals(shapes, 1000, config, seed=1)
    initial = [a for a in arrivals if a.time_h == 0.0]
    rate = arrival_rate(shapes, 1000, config)
    # Mean runs: 2·e^{.125} = 2.27 h and 22.7 h; alive pods ≈ rate × mean run over the pool,
    # and the GPUs they hold ≈ the offered load, 0.8 × 1000 (Little's law).
    mean_small, mean_multi = durations.mean_h(False), durations.mean_h(True)
    expected = rate * (mean_small + mean_multi) / 2
    assert abs(len(initial) - expected) < 4 * math.sqrt(expected)
    held = sum(a.pod.gpu_demand_milli for a in initial) / 1000
    assert 0.8 * 1000 * 0.9 < held < 0.8 * 1000 * 1.1
    # Shapes are weighted by their mean run: 4-GPU pods are mean_multi / mean_small = 10× as
    # many as 1-GPU pods among those running.
    fours = sum(1 for a in initial if a.pod.num_gpu == 4)
    assert 8 < fours / (len(initial) - fours) < 12


class EvictFor:
    """At t=1 evicts ``blocker`` back to the queue, freeing its node for ``big`` (or for no
    one, when ``hold`` is False)."""

    def __init__(self, hold: bool) -> None:
        self.hold, self.done = hold, False

    def on_unschedulable(self, state: SimState, p: Pod, now: float) -> Sequence[Move]:
        return ()

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        return ()

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]:
        placed = state.placed.get("default/blocker")
        if placed is None or now < 1.0 - 1e-9 or self.done:
            return ()
        self.done = True
        return [Move(placed.pod.key, placed.row, REQUEUE, (), "default/big" if self.hold else None)]


@pytest.mark.parametrize(
    ("hold", "big_wait", "thief_wait"), [(True, 0.8, 50.9), (False, 50.8, 0.9)]
)
def test_room_made_for_a_pod_is_held_for_it(hold: bool, big_wait: float, thief_wait: float) -> None:
    # a: "blocker" (2 GPUs, 100 h) leaves 2 free; b: "other" (3 GPUs, 100 h) leaves 1.
    # "thief" (3 GPUs, t=0.1) and "big" (4 GPUs, t=0.2), both LS, wait; thief is first in
    # the queue. At t=1 the hook evicts blocker: a is empty. Held for big, big starts at 1
    # (wait 0.8) and thief waits for it to end at 1 + 50 (wait 50.9). Not held, thief takes
    # a at 1 (wait 0.9) and big waits for thief to end at 51 (wait 50.8).
    nodes = (
        Node("a", 64_000, 65_536, num_gpu=4, gpu_model="G2"),
        Node("b", 64_000, 65_536, num_gpu=4, gpu_model="G2"),
    )
    config = TimelineConfig(hours=100.0, warmup_hours=0.0, tick_every_h=0.5, hold_h=600 / 3600)
    run = replay_timeline(
        nodes,
        [
            Arrival(0.0, pod("blocker", 2, "BE"), 100.0),
            Arrival(0.0, pod("other", 3, "Guaranteed"), 100.0),
            Arrival(0.1, pod("thief", 3, "LS"), 50.0),
            Arrival(0.2, pod("big", 4, "LS"), 50.0),
        ],
        "least-allocated",
        config=config,
        hook=EvictFor(hold),
    )
    waits = {c.name: c.mean_wait_h for c in run.by_gpus}
    # class "3" also holds "other", which never waited: the mean is thief's wait / 2
    assert (waits["4"], waits["3"]) == pytest.approx((big_wait, thief_wait / 2))
    assert run.evictions == 1 and run.migrations == 0  # a re-queue is no migration
