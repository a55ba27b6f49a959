"""The price of an eviction in the timeline: work since the last checkpoint + restart overhead."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from defrag.model.resources import Node, Pod
from defrag.sim.hooks import REQUEUE, Move
from defrag.sim.migration import Job, KindCost, MigrationCost, kind_of
from defrag.sim.state import SimState
from defrag.sim.timeline import Arrival, TimelineConfig, replay_timeline

NODE = (Node("n0", cpu_milli=64_000, memory_mib=65_536, num_gpu=8, gpu_model="G2"),)
HOURLY = MigrationCost(
    kinds={
        "training": KindCost(1.0, 1.0, 0.0, 10 / 60),  # a checkpoint every hour, 10 min restart
        "serving": KindCost(0.0, 0.0, 0.0, 3 / 60),
        "batch": KindCost(1.0, 1.0, 0.0, 5 / 60),
        "cpu": KindCost(0.0, 0.0, 0.0, 0.0),
    }
)


def pod(name: str, gpus: int, qos: str = "Burstable", milli: int = 1000) -> Pod:
    return Pod(name, num_gpu=gpus, gpu_milli=milli, cpu_milli=1000, qos=qos, priority=1)


class EvictAt:
    """Evicts ``victim`` back to the queue at the ticks at ``at`` hours."""

    def __init__(self, victim: str, *at: float) -> None:
        self.victim, self.at = victim, at

    def on_unschedulable(self, state: SimState, p: Pod, now: float) -> Sequence[Move]:
        return ()

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        return ()

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]:
        placed = state.placed.get(f"default/{self.victim}")
        if all(abs(now - t) > 1e-6 for t in self.at) or placed is None:
            return ()
        return [Move(placed.pod.key, placed.row, REQUEUE, ())]


def run(cost: MigrationCost, hook: EvictAt | None, tick: float = 1 / 6) -> dict[str, float]:
    # t=0 "train" (2 GPUs, 3 h of work, checkpoints at 1 h and 2 h of progress) starts.
    # t=1.5 "probe" (8 GPUs) arrives and waits for the node to empty: its wait tells when
    # "train" finished. The hook evicts "train" at t = 1 h 20 min, 20 min after its 1-h
    # checkpoint: it keeps 1 h, loses 20 min, restarts at once (the node is free) and runs
    # 10 min of overhead + 2 h of work: it ends at 1:20 + 0:10 + 2:00 = 3:30, i.e. 30 min =
    # 20 min lost + 10 min overhead later than the 3:00 it would have ended.
    config = TimelineConfig(
        hours=10.0, warmup_hours=0.0, tick_every_h=tick, sample_every_h=0.5, cost=cost
    )
    result = replay_timeline(
        NODE,
        [Arrival(0.0, pod("train", 2), 3.0), Arrival(1.5, pod("probe", 8), 1.0)],
        "best-fit",
        config=config,
        hook=hook,
        defragmenter="test" if hook else None,
    )
    return {
        "probe_wait": next(c for c in result.by_gpus if c.name == "8").mean_wait_h,
        "lost_work": result.lost_work_gpu_hours,
        "overhead": result.overhead_gpu_hours,
        "evictions": result.evictions,
        "max": result.max_evictions,
        "goodput_gap": result.mean_allocation - result.goodput_pct,
    }


def test_a_pod_evicted_20_min_after_its_checkpoint_finishes_20_min_plus_overhead_later() -> None:
    base = run(HOURLY, None)
    assert base["probe_wait"] == pytest.approx(3.0 - 1.5)
    moved = run(HOURLY, EvictAt("train", 4 / 3))
    assert moved["probe_wait"] == pytest.approx(3.5 - 1.5)
    # lost: 2 GPUs × 20 min = 0.667 GPU·h of work; overhead 2 GPUs × 10 min = 0.333 GPU·h
    assert moved["lost_work"] == pytest.approx(2 * 20 / 60)
    assert moved["overhead"] == pytest.approx(2 * 10 / 60)
    assert (moved["evictions"], moved["max"]) == (1, 1)
    # goodput = allocation − 100 × 1 GPU·h / (8 GPUs × 10 h) = allocation − 1.25 points
    assert moved["goodput_gap"] == pytest.approx(1.25)


def test_an_eviction_during_the_restart_overhead_charges_only_what_was_spent() -> None:
    # Evicted at 1:20 (20 min lost, as above), restarted at once, evicted again at 1:25 — 5
    # min into its 10-min overhead: no work lost, 5 min of overhead spent. Restarted at 1:25,
    # it spends 10 min more and runs its 2 h: it ends at 3:35, the probe waits 3:35 − 1:30.
    # Overhead: 2 GPUs × (5 + 10) min = 0.5 GPU·h.
    twice = run(HOURLY, EvictAt("train", 16 / 12, 17 / 12), tick=1 / 12)
    assert twice["probe_wait"] == pytest.approx(3 + 35 / 60 - 1.5)
    assert twice["lost_work"] == pytest.approx(2 * 20 / 60)
    assert twice["overhead"] == pytest.approx(2 * 15 / 60)
    assert (twice["evictions"], twice["max"]) == (2, 2)


def test_free_migrations_lose_nothing() -> None:
    free = run(MigrationCost(free=True), EvictAt("train", 4 / 3))
    assert free["probe_wait"] == pytest.approx(3.0 - 1.5)
    assert free["lost_work"] == free["overhead"] == 0.0


@pytest.mark.parametrize(
    ("interval", "progress_h", "lost_h", "kept_h"),
    [
        (1.0, 4 / 3, 1 / 3, 1.0),  # checkpoint at 1 h: 20 min lost
        (0.5, 1.4, 0.4, 1.0),  # checkpoints at 0.5 and 1.0 h: 0.4 h lost
        (None, 1.4, 1.4, 0.0),  # never checkpoints: everything lost
        (0.0, 1.4, 0.0, 1.4),  # nothing to lose (serving): all progress kept
    ],
)
def test_job_loses_the_work_since_its_last_checkpoint(
    interval: float | None, progress_h: float, lost_h: float, kept_h: float
) -> None:
    job = Job(pod("j", 2), 0.0, work_h=5.0, interval_h=interval, overhead_h=0.25)
    job.start(0.0, overhead=False)
    assert job.evict(progress_h) == pytest.approx(lost_h)
    assert job.saved_h == pytest.approx(kept_h)
    # restart at t=2: 0.25 h overhead, then the 5 − kept hours left
    assert job.start(2.0, overhead=True) == pytest.approx(2.0 + 0.25 + 5.0 - kept_h)


def test_progress_only_starts_after_the_restart_overhead() -> None:
    job = Job(pod("j", 2), 0.0, work_h=5.0, interval_h=1.0, overhead_h=0.5)
    job.start(0.0, overhead=False)
    job.evict(1.0)  # kept 1 h
    job.start(2.0, overhead=True)
    assert job.progress_h(2.4) == 0.0  # still in its overhead
    assert job.last_checkpoint(2.4) == 2.0
    assert job.evict(2.4) == 0.0 and job.saved_h == 1.0  # nothing more lost, nothing gained
    assert job.evictions == 2


@pytest.mark.parametrize(
    ("p", "kind"),
    [
        (pod("t", 2), "training"),
        (pod("s", 1, "LS"), "serving"),
        (pod("h", 1, "LS", milli=300), "serving"),
        (pod("b", 1, "BE"), "batch"),
        (Pod("c", cpu_milli=1000), "cpu"),
    ],
)
def test_pod_kinds(p: Pod, kind: str) -> None:
    assert kind_of(p) == kind


def test_defaults_draw_within_their_ranges_and_scale() -> None:
    rng = np.random.default_rng(0)
    cost = MigrationCost()
    draws = [cost.draw(pod("t", 4), rng) for _ in range(200)]
    assert all(i is not None and 0.5 <= i <= 1.0 for i, _ in draws)  # training: 30–60 min
    batch = [cost.draw(pod("b", 1, "BE"), rng)[0] for _ in range(400)]
    never = sum(i is None for i in batch) / len(batch)
    assert 0.4 < never < 0.6  # half the batch pods never checkpoint
    double = cost.scaled(interval=2.0)
    assert double.kinds["training"].interval_hi_h == 2.0
    assert double.kinds["training"].overhead_h == cost.kinds["training"].overhead_h


@pytest.mark.parametrize(
    ("share", "lost_work", "probe_wait"),
    [
        # Off: as above, 20 min of 2 GPUs lost; "train" ends at 3:30.
        (0.0, 2 * 20 / 60, 3.5 - 1.5),
        # On, every training pod answers: asked at 1:20, it checkpoints, loses nothing, and
        # pays only its 10-min restart: it ends at 1:20 + 0:10 + 1:40 left = 3:10.
        (1.0, 0.0, 3 + 10 / 60 - 1.5),
    ],
)
def test_with_the_handshake_an_evicted_pod_loses_only_its_restart(
    share: float, lost_work: float, probe_wait: float
) -> None:
    cost = MigrationCost(kinds=HOURLY.kinds, handshake_share=share)
    moved = run(cost, EvictAt("train", 4 / 3))
    assert moved["lost_work"] == pytest.approx(lost_work)
    assert moved["overhead"] == pytest.approx(2 * 10 / 60)  # the restart is paid either way
    assert moved["probe_wait"] == pytest.approx(probe_wait)


def test_which_pods_answer_is_fixed_and_the_draws_do_not_move() -> None:
    """The handshake share picks pods by name (no draw), only of the kinds with state, and
    the rng stream is the same on and off: the runs of one seed differ by the handshake alone."""
    from defrag.sim.migration import answers_handshake

    pods = [pod(f"p{i}", 2) for i in range(2000)] + [pod(f"s{i}", 1, qos="LS") for i in range(50)]
    on, off = MigrationCost(handshake_share=0.3), MigrationCost()
    rng_on, rng_off = np.random.default_rng(7), np.random.default_rng(7)
    answered = 0
    for p in pods:
        drawn_on, drawn_off = on.draw(p, rng_on), off.draw(p, rng_off)
        if kind_of(p) == "training" and answers_handshake(p, 0.3):
            answered += 1
            assert drawn_on == (0.0, drawn_off[1])  # nothing to lose, the same restart
        else:
            assert drawn_on == drawn_off
    # About 30% of the 2,000 training pods (CRC-32 spreads names evenly): 600 ± 3 sigma (61).
    assert 539 <= answered <= 661
    assert answers_handshake(pods[0], 1.0) and not answers_handshake(pods[0], 0.0)
    with pytest.raises(ValueError, match="handshake_share"):
        MigrationCost(handshake_share=1.5)
