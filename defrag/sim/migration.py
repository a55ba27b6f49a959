"""What an eviction costs in the timeline protocol: checkpoints, lost work, restart overhead.

Every pod has a *kind* (:func:`kind_of`) and each kind a :class:`KindCost`:

* a **checkpoint interval** — the pod saves its progress every ``interval`` hours of useful
  work (drawn uniformly in ``[interval_lo_h, interval_hi_h]`` per pod); a share
  ``never_fraction`` of the pods of the kind never checkpoint (an eviction loses all their
  progress); an interval of 0 means the pod keeps no state worth losing (a serving replica);
* a **restart overhead** — hours the pod holds its resources after a (re)start without making
  progress: the scheduler, the image pull, loading the model and the checkpoint.

An evicted pod loses the work done since its last checkpoint, re-queues like any pending pod
(or, for a migration, starts on its planned node at once), and then runs its overhead and its
remaining work: its completion moves out by (work lost + overhead + time spent waiting).

Defaults and why (``MigrationCost()``):

* ``training`` — pods asking two or more whole GPUs: distributed training checkpoints every
  30–60 min (a common compromise between checkpoint stall and work at risk); restarting takes
  ~10 min (a large image, the NCCL rendezvous, loading the checkpoint of a large model).
* ``serving`` — the trace's latency-sensitive (``LS``) pods with at most one GPU: replicas of
  a service, no state to lose; restart ~3 min (image pull cached on most nodes, model load).
* ``batch`` — other pods with at most one GPU (notebooks, small jobs): half never checkpoint
  (lose everything), the others every 30–120 min; restart ~5 min.
* ``cpu`` — pods without GPU: stateless helpers, restart ~1 min (no GPU time is lost).

The checkpoint handshake (docs/daemon.md; ``defrag.execute.checkpoint``) — the model, stated:

* **who answers**: a share ``handshake_share`` of the pods of the kinds with state to lose
  (``training``, ``batch``: :data:`HANDSHAKE_KINDS`) declares ``defrag.io/checkpoint: supported``
  and answers defrag's checkpoint request; serving and CPU pods have nothing to save. The share
  the benchmarks' defrag rows run with is :data:`HANDSHAKE_SHARE` (0.5), a modelling
  assumption: no trace says which jobs have an on-demand checkpoint hook (the common training
  frameworks can save on a signal or a callback, but a job needs a few lines to wire that to
  the annotation, docs/daemon.md), so the benchmarks take half and report with and without.
  Which pods answer is a fixed function of the pod's name (:func:`answers_handshake`, not a
  draw), and the draws are the same with the handshake on or off, so two runs of one seed
  differ only by the handshake;
* **what an answering pod loses**: no work — the request saves its progress, so its periodic
  checkpoint interval plays no part (it is drawn all the same, to keep the draws aligned; the
  job keeps interval 0, "nothing at risk": the daemon's view shows its last checkpoint at
  "now" beside ``defrag.io/checkpoint: supported``, ``defrag.sim.daemon_view``);
* **what it pays**: the **stall** of the requested checkpoint (``KindCost.stall_h``: hours the
  pod spends writing it, holding its GPUs, before it goes) and then its restart overhead, like
  any evicted pod: its completion moves out by both (and any wait), and the stall's GPU time is
  charged with the overhead (``overhead_gpu_hours``). The simulator evicts at once, so the stall
  is held at the start of the pod's next run rather than on its old node before it leaves: the
  same GPU time and the same delay, on the new node (a pod sent back to the queue that has not
  restarted by the end of the run is charged no stall, and the allocation shows none either);
  a pod evicted again before it made progress has nothing new to write: no new stall (the part
  of the last one not yet spent carries over). Defaults: ``training`` 2 min (a large model's
  weights and optimizer state to shared storage), ``batch`` 1 min (smaller state) — assumptions,
  chosen within the executor's default wait (``execution.checkpoint_wait_s``, 120 s), so an
  answering pod meets its deadline;
* **who asks**: only defrag (the daemon's executor). A peer never asks, so its run has
  ``handshake_share = 0`` (:func:`defrag.sim.runner.run_task` sees to it) and its evictions lose
  the work since the last periodic checkpoint, as without the handshake. ``MigrationCost()``
  itself has the handshake off (share 0): a run turns it on.

The first start of a pod also pays no overhead: the overhead is the *extra* time an eviction
costs, so a run without evictions is the baseline every defragmenter is compared with.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field, replace

import numpy as np

from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.plan.cost import CHECKPOINT_STALL_HOURS, KINDS, RESTART_HOURS
from defrag.plan.cost import workload_kind as kind_of

HANDSHAKE_KINDS = ("training", "batch")
"""The kinds with state to lose: those whose workloads may answer a checkpoint request."""

HANDSHAKE_SHARE = 0.5
"""The share of ``training`` and ``batch`` pods that answer the handshake in the benchmarks'
defrag rows: a modelling assumption (module docstring), not a measurement."""


@dataclass(frozen=True, slots=True)
class KindCost:
    interval_lo_h: float
    interval_hi_h: float
    never_fraction: float
    overhead_h: float
    stall_h: float = 0.0
    """Hours a pod of the kind that answers the handshake spends writing the requested
    checkpoint before its eviction (no progress, GPUs held); 0 for a kind that never answers."""

    def __post_init__(self) -> None:
        if not 0 <= self.interval_lo_h <= self.interval_hi_h:
            raise ValueError("checkpoint interval: need 0 <= low <= high")
        if not 0 <= self.never_fraction <= 1:
            raise ValueError("never_fraction must be in [0, 1]")
        if self.overhead_h < 0 or self.stall_h < 0:
            raise ValueError("restart overhead and checkpoint stall must be >= 0")


def _defaults() -> dict[str, KindCost]:
    """Checkpoint intervals per kind; the restart overheads are the planner's own
    (:data:`defrag.plan.cost.RESTART_HOURS`), so its price and the simulator's bill agree."""
    stall = CHECKPOINT_STALL_HOURS
    return {
        "training": KindCost(0.5, 1.0, 0.0, RESTART_HOURS["training"], stall["training"]),
        "serving": KindCost(0.0, 0.0, 0.0, RESTART_HOURS["serving"]),
        "batch": KindCost(0.5, 2.0, 0.5, RESTART_HOURS["batch"], stall["batch"]),
        "cpu": KindCost(0.0, 0.0, 0.0, RESTART_HOURS["cpu"]),
    }


@dataclass(frozen=True, slots=True)
class MigrationCost:
    kinds: dict[str, KindCost] = field(default_factory=_defaults, hash=False)
    free: bool = False
    """Migrations cost nothing (the simulator before issue 17): no work lost, no overhead."""
    handshake_share: float = 0.0
    """Share of the ``training`` and ``batch`` pods that answer defrag's checkpoint request
    before an eviction (they lose no work, pay their kind's stall and restart overhead); 0: the
    handshake is off (:data:`HANDSHAKE_SHARE` is the benchmarks' share)."""

    def __post_init__(self) -> None:
        if not 0 <= self.handshake_share <= 1:
            raise ValueError(f"handshake_share must be in [0, 1], got {self.handshake_share}")

    def draw(self, pod: Pod, rng: np.random.Generator) -> tuple[float | None, float]:
        """(checkpoint interval in hours — None: never, 0: nothing to lose —, overhead h)."""
        if self.free:
            return 0.0, 0.0
        kind = kind_of(pod)
        k = self.kinds[kind]
        interval: float | None
        if k.never_fraction and rng.random() < k.never_fraction:
            interval = None
        elif k.interval_hi_h == 0:
            interval = 0.0
        else:
            interval = float(rng.uniform(k.interval_lo_h, k.interval_hi_h))
        if self.answers(pod):
            return 0.0, k.overhead_h  # checkpointed on request: nothing lost at an eviction
        return interval, k.overhead_h

    def answers(self, pod: Pod) -> bool:
        """Whether ``pod`` answers the checkpoint request in a run with these costs."""
        return (
            not self.free
            and kind_of(pod) in HANDSHAKE_KINDS
            and answers_handshake(pod, self.handshake_share)
        )

    def job(self, pod: Pod, arrived: float, work_h: float, rng: np.random.Generator) -> Job:
        """The :class:`Job` of a pod arriving at ``arrived`` with ``work_h`` hours of work: its
        draws (:meth:`draw`), whether it answers the handshake and, if so, its stall."""
        interval, overhead = self.draw(pod, rng)
        answers = self.answers(pod)
        stall = self.kinds[kind_of(pod)].stall_h if answers else 0.0
        return Job(pod, arrived, work_h, interval, overhead, answers, stall)

    def scaled(self, interval: float = 1.0, overhead: float = 1.0) -> MigrationCost:
        """Every checkpoint interval × ``interval``, every overhead (the restart and the
        requested checkpoint's stall: time held without progress) × ``overhead``."""
        if interval <= 0 or overhead < 0:
            raise ValueError("checkpoint scale must be > 0 and overhead scale >= 0")
        return replace(
            self,
            kinds={
                name: KindCost(
                    k.interval_lo_h * interval,
                    k.interval_hi_h * interval,
                    k.never_fraction,
                    k.overhead_h * overhead,
                    k.stall_h * overhead,
                )
                for name, k in self.kinds.items()
            },
        )

    def describe(self) -> dict[str, object]:
        if self.free:
            return {"free": True}
        handshake: dict[str, object] = (
            {"checkpoint_handshake_share": self.handshake_share} if self.handshake_share else {}
        )
        return handshake | {
            name: {
                "checkpoint_every_h": [round(k.interval_lo_h, 3), round(k.interval_hi_h, 3)],
                "never_checkpoint": k.never_fraction,
                "restart_overhead_h": round(k.overhead_h, 4),
            }
            # the stall is paid only with the handshake on: runs without it describe as before
            | (
                {"checkpoint_stall_h": round(k.stall_h, 4)}
                if self.handshake_share and name in HANDSHAKE_KINDS
                else {}
            )
            for name, k in self.kinds.items()
        }


def answers_handshake(pod: Pod, share: float) -> bool:
    """Whether ``pod`` is among the ``share`` of pods that answer a checkpoint request: a fixed
    function of its name (CRC-32 of ``namespace/name`` below ``share`` of 2³²), no draw."""
    return share > 0 and zlib.crc32(pod.key.encode()) < share * 2**32


@dataclass(slots=True)
class Job:
    """One pod's life in the timeline: its work, its progress, its waits and evictions.

    Progress is useful work in hours. While running, the segment that began at ``started``
    makes progress from ``started + overhead`` on; checkpoints fall every ``interval`` hours
    of progress counted from the segment's start of work. A pod that answers the checkpoint
    handshake begins the segment after an eviction with the stall of the checkpoint it was
    asked for, then its restart overhead (module docstring).
    """

    pod: Pod
    arrived: float
    work_h: float
    interval_h: float | None
    overhead_h: float
    answers_handshake: bool = False
    """The pod answers defrag's checkpoint request (it shows ``defrag.io/checkpoint:
    supported``); set by :meth:`MigrationCost.job`, never drawn."""
    stall_h: float = 0.0
    """Hours its requested checkpoint takes, paid at each eviction that has progress to save."""
    saved_h: float = 0.0
    """Progress kept (at the last checkpoint of an earlier segment, or 0)."""
    started: float | None = None
    """Start of the current running segment; None while pending."""
    segment_overhead_h: float = 0.0
    """Time the current segment holds its resources without progress: stall + overhead."""
    segment_stall_h: float = 0.0
    """The stall at the start of the current segment (part of ``segment_overhead_h``)."""
    owed_stall_h: float = 0.0
    """Stall the next segment begins with (its requested checkpoint, written at the eviction)."""
    queued_at: float | None = None
    waited_h: float = 0.0
    first_start: float | None = None
    evictions: int = 0
    seq: int = 0
    """The departure event that is current for this job (older ones are stale)."""

    @property
    def gpus(self) -> float:
        return self.pod.gpu_demand_milli / GPU_MILLI

    def remaining_h(self) -> float:
        return max(self.work_h - self.saved_h, 0.0)

    def progress_h(self, now: float) -> float:
        """Useful work done in the current segment by ``now``."""
        if self.started is None:
            return 0.0
        return min(max(now - self.started - self.segment_overhead_h, 0.0), self.remaining_h())

    def checkpointed_h(self, now: float) -> float:
        """Progress of the current segment that a checkpoint has saved by ``now``."""
        done = self.progress_h(now)
        if self.interval_h is None:
            return 0.0
        if self.interval_h == 0:
            return done
        return math.floor(done / self.interval_h + 1e-9) * self.interval_h

    def last_checkpoint(self, now: float) -> float | None:
        """Simulated time of the last checkpoint in this segment (its start when none yet,
        ``now`` for a pod with nothing to lose, None while pending)."""
        if self.started is None:
            return None
        if self.interval_h == 0:
            return now
        base = self.started + self.segment_overhead_h
        return base + self.checkpointed_h(now) if now >= base else self.started

    def evict(self, now: float) -> float:
        """Stop the running segment; returns the work lost (hours of progress since the
        last checkpoint, all of it for a pod that never checkpoints). Saved progress stays.

        A pod that answers the handshake owes its stall to the next segment when it made
        progress since its start (it had something to write), and the part of this segment's
        stall it had not spent yet."""
        assert self.started is not None
        done = self.progress_h(now)
        kept = self.checkpointed_h(now)
        if self.answers_handshake:
            unspent = max(self.segment_stall_h - (now - self.started), 0.0)
            self.owed_stall_h = unspent + (self.stall_h if done > 0 else 0.0)
        self.saved_h += kept
        self.started = None
        self.evictions += 1
        return done - kept

    def start(self, now: float, *, overhead: bool) -> float:
        """Begin a running segment at ``now``; returns its end (overhead + remaining work)."""
        if self.queued_at is not None:
            self.waited_h += now - self.queued_at
            self.queued_at = None
        if self.first_start is None:
            self.first_start = now
        self.started = now
        self.segment_stall_h, self.owed_stall_h = self.owed_stall_h, 0.0
        self.segment_overhead_h = self.segment_stall_h + (self.overhead_h if overhead else 0.0)
        return now + self.segment_overhead_h + self.remaining_h()


__all__ = [
    "CHECKPOINT_STALL_HOURS",
    "HANDSHAKE_KINDS",
    "HANDSHAKE_SHARE",
    "KINDS",
    "Job",
    "KindCost",
    "MigrationCost",
    "answers_handshake",
    "kind_of",
]
