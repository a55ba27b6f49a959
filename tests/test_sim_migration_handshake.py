"""The checkpoint-capability model of defrag.sim.migration: who answers defrag's checkpoint
request, what an answering pod pays at an eviction (the requested checkpoint's stall, then its
restart; no work lost), and that the handshake changes nothing else in a run."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from defrag.model.resources import Node, Pod
from defrag.sim.migration import (
    CHECKPOINT_STALL_HOURS,
    HANDSHAKE_KINDS,
    HANDSHAKE_SHARE,
    KindCost,
    MigrationCost,
    answers_handshake,
    kind_of,
)
from defrag.sim.timeline import Arrival, TimelineConfig, replay_timeline
from tests.test_sim_cost import EvictAt

NODE = (Node("n0", cpu_milli=64_000, memory_mib=65_536, num_gpu=8, gpu_model="G2"),)
STALL = 2 / 60
RESTART = 10 / 60
HOURLY = {
    # a checkpoint every hour of work; a 2-min requested checkpoint, a 10-min restart
    "training": KindCost(1.0, 1.0, 0.0, RESTART, STALL),
    "serving": KindCost(0.0, 0.0, 0.0, 3 / 60),
    "batch": KindCost(1.0, 1.0, 0.0, 5 / 60, 1 / 60),
    "cpu": KindCost(0.0, 0.0, 0.0, 0.0),
}
ANSWERS, SILENT = "train-a", "train-b"
"""At share 0.5 the first answers the handshake, the second does not (CRC-32 of the name)."""


def pod(name: str, gpus: int, qos: str = "Burstable", milli: int = 1000) -> Pod:
    return Pod(name, num_gpu=gpus, gpu_milli=milli, cpu_milli=1000, qos=qos, priority=1)


def test_the_named_pods_are_on_either_side_of_half() -> None:
    assert answers_handshake(pod(ANSWERS, 2), 0.5)
    assert not answers_handshake(pod(SILENT, 2), 0.5)


def run(name: str, share: float, *at: float, tick: float = 1 / 6) -> dict[str, float]:
    # t=0 ``name`` (2 GPUs, 3 h of work, checkpoints at 1 h and 2 h of progress) starts alone.
    # t=1.5 "probe" (8 GPUs) arrives and waits for the node to empty: its wait says when
    # ``name`` finished (3:00 without eviction).
    config = TimelineConfig(
        hours=10.0, warmup_hours=0.0, tick_every_h=tick, sample_every_h=0.5,
        cost=MigrationCost(kinds=HOURLY, handshake_share=share),
    )  # fmt: skip
    result = replay_timeline(
        NODE,
        [Arrival(0.0, pod(name, 2), 3.0), Arrival(1.5, pod("probe", 8), 1.0)],
        "best-fit",
        config=config,
        hook=EvictAt(name, *at),
        defragmenter="test",
    )
    return {
        "ends": 1.5 + next(c for c in result.by_gpus if c.name == "8").mean_wait_h,
        "lost_work": result.lost_work_gpu_hours,
        "overhead": result.overhead_gpu_hours,
        "goodput_gap": result.mean_allocation - result.goodput_pct,
        "evictions": result.evictions,
    }


@pytest.mark.parametrize(
    ("name", "share", "lost_h", "held_h"),
    [
        # Answers: asked at 1:20, it saves its 20 min, loses nothing, stalls 2 min writing the
        # checkpoint and restarts in 10: it ends at 1:20 + 0:12 + 1:40 left = 3:12.
        (ANSWERS, 0.5, 0.0, STALL + RESTART),
        # Does not answer (same run's share): loses the 20 min since its 1-h checkpoint and
        # restarts in 10: it ends at 1:20 + 0:10 + 2:00 left = 3:30.
        (SILENT, 0.5, 20 / 60, RESTART),
        # The handshake off: the pod that would answer is evicted as any other.
        (ANSWERS, 0.0, 20 / 60, RESTART),
    ],
)
def test_an_answering_pod_loses_no_work_and_pays_its_stall_and_restart(
    name: str, share: float, lost_h: float, held_h: float
) -> None:
    got = run(name, share, 4 / 3)
    assert got["evictions"] == 1
    # it ends late by what it lost and what it held without progress
    assert got["ends"] == pytest.approx(3.0 + lost_h + held_h)
    assert got["lost_work"] == pytest.approx(2 * lost_h)
    # the stall's GPU time is charged with the restart's: 2 GPUs × (stall +) restart
    assert got["overhead"] == pytest.approx(2 * held_h)
    # goodput = allocation − 100 × (lost + overhead) GPU·h / (8 GPUs × 10 h)
    assert got["goodput_gap"] == pytest.approx(100 * 2 * (lost_h + held_h) / 80)


def test_evicted_again_during_its_stall_it_finishes_the_stall_once() -> None:
    # Evicted at 1:20 (2-min stall owed), restarted at once, evicted again at 1:21 — one minute
    # into the stall, no progress since: nothing new to write, the minute left is carried.
    # Restarted at 1:21: 1 min stall + 10 min restart + 1:40 of work = 3:12, as if evicted
    # once; 2 GPUs × (1 + 1 + 10) min charged.
    twice = run(ANSWERS, 0.5, 80 / 60, 81 / 60, tick=1 / 60)
    assert twice["evictions"] == 2
    assert twice["ends"] == pytest.approx(3 + 12 / 60)
    assert twice["lost_work"] == 0.0
    assert twice["overhead"] == pytest.approx(2 * 12 / 60)


def test_a_job_that_answers_pays_a_stall_only_with_progress_to_save() -> None:
    cost = MigrationCost(kinds=HOURLY, handshake_share=1.0)
    job = cost.job(pod(ANSWERS, 2), 0.0, 5.0, np.random.default_rng(0))
    assert (job.answers_handshake, job.stall_h, job.interval_h) == (True, STALL, 0.0)
    assert job.start(0.0, overhead=False) == pytest.approx(5.0)  # a first start pays nothing
    assert job.evict(1.4) == 0.0 and job.saved_h == pytest.approx(1.4)
    assert job.start(2.0, overhead=True) == pytest.approx(2.0 + STALL + RESTART + 3.6)
    assert job.progress_h(2.0 + STALL + RESTART - 1e-9) == 0.0  # no progress while it stalls
    # evicted in its restart, after the stall: nothing new to save, nothing owed
    assert job.evict(2.1) == 0.0
    assert job.start(3.0, overhead=True) == pytest.approx(3.0 + RESTART + 3.6)
    # evicted after half an hour of work: that is saved, and a new stall is owed
    assert job.evict(3.0 + RESTART + 0.5) == 0.0 and job.saved_h == pytest.approx(1.9)
    assert job.start(4.0, overhead=True) == pytest.approx(4.0 + STALL + RESTART + 3.1)
    assert job.evictions == 3


def test_a_job_that_does_not_answer_loses_the_work_since_its_checkpoint() -> None:
    cost = MigrationCost(kinds=HOURLY, handshake_share=0.5)
    job = cost.job(pod(SILENT, 2), 0.0, 5.0, np.random.default_rng(0))
    assert (job.answers_handshake, job.stall_h, job.interval_h) == (False, 0.0, 1.0)
    job.start(0.0, overhead=False)
    assert job.evict(1.4) == pytest.approx(0.4) and job.saved_h == pytest.approx(1.0)
    assert job.start(2.0, overhead=True) == pytest.approx(2.0 + RESTART + 4.0)  # no stall


def test_the_handshake_moves_no_draw() -> None:
    """With the handshake on or off the same pods draw the same run-time costs from the same
    stream; only the pods that answer differ, and only in what answering changes."""
    shapes = [pod("t", 4), pod("s", 1, "LS"), pod("b", 1, "BE"), Pod("c", cpu_milli=500)]
    pods = [replace(shapes[i % 4], name=f"p{i}") for i in range(2000)]
    on, off = MigrationCost(handshake_share=HANDSHAKE_SHARE), MigrationCost()
    rng_on, rng_off = np.random.default_rng(11), np.random.default_rng(11)
    answered = {k: 0 for k in HANDSHAKE_KINDS}
    for i, p in enumerate(pods):
        a, b = on.job(p, float(i), 3.0, rng_on), off.job(p, float(i), 3.0, rng_off)
        assert not b.answers_handshake and b.stall_h == 0.0
        assert (a.arrived, a.work_h, a.overhead_h) == (b.arrived, b.work_h, b.overhead_h)
        kind = kind_of(p)
        if a.answers_handshake:
            assert kind in HANDSHAKE_KINDS
            assert (a.interval_h, a.stall_h) == (0.0, CHECKPOINT_STALL_HOURS[kind])
            answered[kind] += 1
        else:
            assert (a.interval_h, a.stall_h) == (b.interval_h, 0.0)
    assert rng_on.bit_generator.state == rng_off.bit_generator.state
    # 500 pods of each kind with state: half answer (CRC-32 spreads names evenly), ± 3 sigma
    assert all(250 - 34 <= n <= 250 + 34 for n in answered.values()), answered


def test_runs_of_one_seed_differ_only_by_the_handshake() -> None:
    """A pod that does not answer is evicted: the run with the handshake on is the run with
    it off, event for event (the same arrivals, draws, losses)."""
    on, off = run(SILENT, 0.5, 4 / 3), run(SILENT, 0.0, 4 / 3)
    assert on == off


def test_the_stated_defaults() -> None:
    from defrag.settings import ExecutionSection

    kinds = MigrationCost().kinds
    assert MigrationCost().handshake_share == 0.0  # a run turns the handshake on
    assert HANDSHAKE_SHARE == 0.5
    assert kinds["training"].stall_h == pytest.approx(2 / 60)
    assert kinds["batch"].stall_h == pytest.approx(1 / 60)
    assert kinds["serving"].stall_h == kinds["cpu"].stall_h == 0.0
    # every stall fits in the executor's default wait: an asked pod answers before the deadline
    wait_h = ExecutionSection.model_fields["checkpoint_wait_s"].default / 3600
    assert max(k.stall_h for k in kinds.values()) <= wait_h
    with pytest.raises(ValueError, match="stall"):
        KindCost(1.0, 1.0, 0.0, 0.1, -0.01)


def test_free_migrations_answer_nothing() -> None:
    job = MigrationCost(free=True, handshake_share=1.0).job(
        pod(ANSWERS, 2), 0.0, 1.0, np.random.default_rng(0)
    )
    assert (job.answers_handshake, job.stall_h, job.overhead_h) == (False, 0.0, 0.0)


def test_the_costs_say_the_stall_only_with_the_handshake_on() -> None:
    off = MigrationCost().describe()
    assert "checkpoint_handshake_share" not in off
    assert all("checkpoint_stall_h" not in v for v in off.values() if isinstance(v, dict))
    on = MigrationCost(handshake_share=0.5).describe()
    assert on["checkpoint_handshake_share"] == 0.5
    stalls = {k: v.get("checkpoint_stall_h") for k, v in on.items() if isinstance(v, dict)}
    assert stalls == {"training": 0.0333, "serving": None, "batch": 0.0167, "cpu": None}
    # the overhead scale is time held without progress: the stall scales with the restart
    scaled = MigrationCost(handshake_share=0.5).scaled(overhead=2.0).kinds["training"]
    assert scaled.stall_h == pytest.approx(4 / 60)
    assert scaled.overhead_h == pytest.approx(20 / 60)
