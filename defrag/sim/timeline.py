"""The timeline protocol: pods arrive *and leave*, the way real clusters fragment.

The openb timestamps cannot drive this (no more than ~66 GPUs of demand are ever alive at once
in the default trace), so only the pod *shapes* come from the trace:

* **Arrivals** are a seeded Poisson process. Each arrival draws a shape uniformly from the pool
  (the trace's pods, so the trace's mix of sizes, shares, CPU, models and QoS). The rate is set
  so that the offered GPU load — rate × E[GPU demand × run time] — is ``load`` × the cluster's
  GPUs.
* **Run times** are log-normal (heavy-tailed), see :class:`DurationModel`: hours for most pods,
  days for many multi-GPU pods.
* **Start**: the cluster starts in steady state — at t = 0 the pods an infinite-server queue
  would hold arrive together, with residual run times (``prefill``, see
  :func:`generate_arrivals`); then ``warmup_hours`` pass unmeasured.
* **Scheduling** follows kube-scheduler: a new pod is scheduled at once; a pod that fits
  nowhere waits. Whenever capacity frees (a departure, a migration), waiting pods are retried
  in priority order (QoS LS > Guaranteed > Burstable > BE, FIFO within a class) and *every*
  pod that fits is placed — no head-of-line blocking, which is how big jobs starve behind
  small ones. A waiting pod can only fit where capacity grew, so a retry after a departure
  from node r checks the waiting pods against node r (vectorised), then runs the full
  scheduler for the ones that may fit.
* **Defragmentation** (a :class:`~defrag.sim.hooks.DefragHook`): ``on_unschedulable`` when a
  pod fits nowhere on arrival, ``on_tick`` every ``tick_every_h`` (when the hook has it),
  ``on_window`` every ``window_every_h`` hours; after moves the waiting pods are retried on
  the rows the moves freed. A move with ``for_pod`` holds its source row for that pod.
* **Evictions are priced** (:mod:`defrag.sim.migration`): an evicted pod loses the work since
  its last checkpoint, re-queues (or binds to its planned node), and restarts with an overhead;
  one that answers the checkpoint handshake loses no work and restarts with the stall of its
  requested checkpoint before the overhead (both charged as overhead).
* **The loop** (:class:`Timeline`): one method per event kind — a departure, an idle window,
  a hook tick, an arrival, a sample — and a run loop that takes the earliest; on a tie the
  order is departure, window, tick, arrival, sample. The score, the hook and the defragmenter's
  name are resolved before the first event.
* **Metrics** cover the measured period after ``warmup_hours``: GPU allocation and queue length
  sampled every ``sample_every_h``, goodput and GPU-hours lost to evictions, and the pending
  time (every wait, first and after evictions) of each pod that arrived in the period, by GPU
  count (and ``multi``) and by priority class. Pods still waiting at the end count with their
  wait so far (and are reported as ``still_pending``).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from defrag.model.gc_policy import YOUNG_EVERY, gc_deferred
from defrag.model.resources import Node, Pod
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.scoring.framework import Placement, Policy
from defrag.scoring.profile import ProfileConfig
from defrag.sim.arrivals import (
    Arrival,
    DurationModel,
    TimelineConfig,
    arrival_rate,
    generate_arrivals,
    offered_load,
)
from defrag.sim.hooks import DefragHook, Move
from defrag.sim.migration import Job
from defrag.sim.state import SimState
from defrag.sim.timeline_results import (
    ClassStats,
    TimelineRun,
    TimelineSeries,
    WaitRecorder,
    gpu_class,
    is_multi,
    priority_class,
)
from defrag.sim.trace import QOS_PRIORITY
from defrag.sim.waitqueue import WaitQueue

Progress = Callable[[int, int], None]
Handler = Callable[[float], None]
PRIORITY_ORDER = tuple(sorted(QOS_PRIORITY, key=lambda q: -QOS_PRIORITY[q]))


@dataclass(slots=True)
class _Ledger:
    """What evictions cost over the measured period, and how many there were."""

    lost_work: float = 0.0
    overhead: float = 0.0
    evictions: int = 0


@dataclass(slots=True)
class _Samples:
    time_h: list[float]
    allocation: list[float]
    queue: list[int]


class Timeline:
    """One timeline run over given ``arrivals``, event by event (see the module docstring).

    ``scheduler`` is the score the scheduler runs with: a name (built with the run's seed and
    ``mix``) or a built score function (a peer's own, KAI's bin-pack); ``None`` is ``policy``.
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        arrivals: Sequence[Arrival],
        policy: str,
        seed: int,
        config: TimelineConfig,
        mix: WorkloadMix,
        *,
        hook: DefragHook | None = None,
        scheduler: Policy | str | None = None,
        defragmenter: str | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.started_at = time.perf_counter()
        self.policy, self.seed, self.config = policy, seed, config
        score = policy if scheduler is None else scheduler
        built = ProfileConfig(score, seed).with_mix(mix).policy if isinstance(score, str) else score
        self.state = SimState.new(nodes, built, policy, mix)
        self.capacity = int(self.state.arrays.gpu_total.sum())
        if self.capacity == 0:
            raise ValueError("the cluster has no GPU")
        self.arrivals = sorted(arrivals, key=lambda a: a.time_h)
        self.hook = hook
        self.on_tick = getattr(hook, "on_tick", None)
        self.name = (
            defragmenter if defragmenter is not None else ("none" if hook is None else "defrag")
        )
        self.progress = progress
        self.queue = WaitQueue(self.state.arrays.models)
        self.warm, self.end = config.warmup_hours, config.warmup_hours + config.hours
        # (time, seq, pod id) per running pod; stale once its job.seq moved on (evicted)
        self.departures: list[tuple[float, int, str]] = []
        self.cost_rng = np.random.default_rng([seed, 17])
        self.seq = 0
        self.next_arrival = 0
        # a hook with a period of its own (the daemon's cycle interval) ticks at it
        self.tick_every_h = float(getattr(hook, "tick_every_h", config.tick_every_h))
        self.next_sample, self.next_window, self.next_tick = (
            self.warm, config.window_every_h, self.tick_every_h
        )  # fmt: skip
        self.ledger = _Ledger()
        self.samples = _Samples([], [], [])

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> TimelineRun:
        with gc_deferred(YOUNG_EVERY):  # its objects die young: fewer collections
            while (event := self._next_event()) is not None:
                handle, now = event
                handle(now)
        return self._report()

    def _next_event(self) -> tuple[Handler, float] | None:
        """The earliest event before the end, and its handler (ties in the order below)."""
        a = self.next_arrival
        t_dep = self._first_departure()
        t_win = self.next_window if self.hook is not None else math.inf
        t_tick = self.next_tick if self.on_tick is not None else math.inf
        t_arr = self.arrivals[a].time_h if a < len(self.arrivals) else math.inf
        now = min(t_dep, t_win, t_tick, t_arr, self.next_sample)
        if now > self.end:
            return None
        if now == t_dep:
            return self.on_departures, now
        if now == t_win:
            return self.on_window, now
        if now == t_tick:
            return self.on_tick_event, now
        if now == t_arr:
            return self.on_arrival, now
        return self.on_sample, now

    def _first_departure(self) -> float:
        jobs, deps = self.state.jobs, self.departures
        while deps and jobs[deps[0][2]].seq != deps[0][1]:
            heapq.heappop(deps)  # a pod evicted since: its old completion is void
        return deps[0][0] if deps else math.inf

    # --- one method per event kind ------------------------------------------------------------

    def on_departures(self, now: float) -> None:
        """Every pod whose run ends at ``now`` leaves; the waiting pods are retried there."""
        jobs, freed = self.state.jobs, set()
        while self.departures and self.departures[0][0] == now:
            _, seq, pod_id = heapq.heappop(self.departures)
            if jobs[pod_id].seq == seq:
                self._spent(jobs[pod_id], now)
                jobs[pod_id].started = None
                freed.add(self.state.remove(pod_id).row)
        self._retry(freed, now)

    def on_window(self, now: float) -> None:
        assert self.hook is not None
        self._apply(self.hook.on_window(self.state, now), now)
        self.next_window += self.config.window_every_h

    def on_tick_event(self, now: float) -> None:
        """A daemon cycle / scheduling session: expired holds go, then the hook's moves."""
        assert self.on_tick is not None
        expired = self.state.release_expired(now)
        if expired:
            self._retry(expired, now)
        self._apply(self.on_tick(self.state, now), now)
        self.next_tick += self.tick_every_h

    def on_arrival(self, now: float) -> None:
        """A new pod: scheduled at once; the hook may make room; else it waits."""
        arrival = self.arrivals[self.next_arrival]
        self.next_arrival += 1
        pod = arrival.pod
        job = self.config.cost.job(pod, now, arrival.duration_h, self.cost_rng)
        self.state.jobs[pod.key] = job
        result = self._schedule(pod)
        if result is None and self.hook is not None:
            self._apply(self.hook.on_unschedulable(self.state, pod, now), now)
            result = self._schedule(pod)
        if result is not None:
            self._start(job, result.row, result.gpus, now)
        else:
            self._enqueue(job, now)
        n, a = len(self.arrivals), self.next_arrival
        if self.progress is not None and (a % 1024 == 0 or a == n):
            self.progress(a, n)

    def on_sample(self, now: float) -> None:
        cap_milli = self.capacity * GPU_MILLI
        free = int(self.state.arrays.free_share().sum())
        self.samples.time_h.append(now)
        self.samples.allocation.append(100.0 * (cap_milli - free) / cap_milli)
        self.samples.queue.append(self.queue.count)
        self.next_sample += self.config.sample_every_h

    # --- what the events do ------------------------------------------------------------------

    def _schedule(self, pod: Pod) -> Placement | None:
        return self.state.schedule(pod)

    def _start(self, job: Job, row: int, gpus: tuple[int, ...], now: float) -> None:
        state = self.state
        state.place(job.pod, row, gpus, now)
        done_at = job.start(now, overhead=job.evictions > 0)
        self.seq += 1
        job.seq = self.seq
        heapq.heappush(self.departures, (done_at, self.seq, job.pod.key))
        if state.reserved:
            state.release_for(job.pod.key)

    def _enqueue(self, job: Job, now: float) -> None:
        job.queued_at = now
        self.queue.push(job.pod)
        self.state.pending[job.pod.key] = job.pod

    def _retry(self, rows: set[int], now: float) -> None:
        """Waiting pods that may now fit on ``rows``, in queue order; place every one that fits."""
        queue, jobs = self.queue, self.state.jobs
        for i in queue.may_fit(self.state.arrays, rows):
            pod = queue.pods[i]
            result = self._schedule(pod)
            if result is not None:
                queue.remove(i)
                self.state.pending.pop(pod.key, None)
                self._start(jobs[pod.key], result.row, result.gpus, now)

    def _apply(self, moves: Sequence[Move], now: float) -> None:
        """A hook's moves: each evicted pod is charged, re-queued or bound to its new node;
        rooms made for a pod are held for it; the waiting pods are retried on the freed rows."""
        if not moves:
            return
        state, freed = self.state, set()
        for before, after in state.apply_moves_detailed(moves):
            job = state.jobs[before.pod.key]
            self._spent(job, now)
            lost = job.evict(now)
            job.seq = 0  # its completion event is void
            self.ledger.evictions += 1
            if self.warm <= now < self.end:
                self.ledger.lost_work += job.gpus * lost
            freed.add(before.row)
            if after is None:
                self._enqueue(job, now)
            else:  # a migration: the replacement is bound to its planned node at once
                state.remove(job.pod.key)
                self._start(job, after.row, after.gpus, now)
        for m in moves:
            if m.for_pod is not None and m.for_pod in state.pending:
                state.reserved[m.source_row] = (m.for_pod, now + self.config.hold_h)
        self._retry(freed, now)

    def _spent(self, job: Job, until: float) -> None:
        """Charge the restart overhead (with a requested checkpoint's stall before it) the
        running segment spent by ``until``, inside the measured period (a pod evicted during
        its overhead spent only part of it)."""
        if job.started is None or not job.segment_overhead_h:
            return
        lo = max(job.started, self.warm)
        hi = min(job.started + job.segment_overhead_h, until, self.end)
        if hi > lo:
            self.ledger.overhead += job.gpus * (hi - lo)

    # --- the report ----------------------------------------------------------------------------

    def _waits(self) -> WaitRecorder:
        """Every measured pod's pending time; pods still waiting count with their wait so far."""
        record = WaitRecorder()
        for job in self.state.jobs.values():
            if job.arrived >= self.warm:
                queued = job.queued_at
                wait = job.waited_h + (self.end - queued if queued is not None else 0.0)
                record.record(job.pod, wait, queued is not None)
        return record

    def _report(self) -> TimelineRun:
        jobs, ledger, s = self.state.jobs, self.ledger, self.samples
        for job in jobs.values():
            self._spent(job, self.end)  # still running: the overhead spent so far
        record = self._waits()
        mean_alloc = float(np.mean(s.allocation)) if s.allocation else 0.0
        lost = ledger.lost_work + ledger.overhead
        return TimelineRun(
            policy=self.policy,
            seed=self.seed,
            load=self.config.load,
            arrivals=len(self.arrivals),
            migrations=self.state.migrations,
            mean_allocation=mean_alloc,
            mean_queue=float(np.mean(s.queue)) if s.queue else 0.0,
            by_gpus=record.by_gpus(),
            by_priority=record.by_priority(PRIORITY_ORDER),
            series=TimelineSeries(tuple(s.time_h), tuple(s.allocation), tuple(s.queue)),
            seconds=time.perf_counter() - self.started_at,
            defrag=self.hook is not None and self.name == "defrag",
            defragmenter=self.name,
            scheduler=self.state.policy.name,
            evictions=ledger.evictions,
            max_evictions=max((j.evictions for j in jobs.values()), default=0),
            lost_work_gpu_hours=ledger.lost_work,
            overhead_gpu_hours=ledger.overhead,
            goodput_pct=mean_alloc - 100.0 * lost / (self.capacity * self.config.hours),
            gpu_wait_hours=record.gpu_wait,
            offered_load_pct=offered_load(self.arrivals, self.warm, self.end, self.capacity),
            multi_waits=tuple(sorted(record.multi)),
            cost=self.config.cost.describe(),
        )


def run_timeline(
    nodes: Sequence[Node],
    shapes: Sequence[Pod],
    policy: str,
    seed: int,
    *,
    config: TimelineConfig | None = None,
    mix: WorkloadMix | None = None,
    hook: DefragHook | None = None,
    progress: Progress | None = None,
    defragmenter: str | None = None,
    scheduler: Policy | str | None = None,
) -> TimelineRun:
    """One timeline run of ``nodes`` under ``policy`` with arrivals drawn from ``shapes``."""
    config = config or TimelineConfig()
    mix = mix if mix is not None else WorkloadMix.from_pods(shapes)
    capacity = sum(n.num_gpu for n in nodes)
    if capacity == 0:
        raise ValueError("the cluster has no GPU")
    arrivals = generate_arrivals(shapes, capacity, config, seed)
    return replay_timeline(
        nodes, arrivals, policy, seed, config=config, mix=mix, hook=hook, progress=progress,
        defragmenter=defragmenter, scheduler=scheduler,
    )  # fmt: skip


def replay_timeline(
    nodes: Sequence[Node],
    arrivals: Sequence[Arrival],
    policy: str,
    seed: int = 0,
    *,
    config: TimelineConfig | None = None,
    mix: WorkloadMix | None = None,
    hook: DefragHook | None = None,
    progress: Progress | None = None,
    defragmenter: str | None = None,
    scheduler: Policy | str | None = None,
) -> TimelineRun:
    """The event loop over given ``arrivals``; ``config.load`` and ``config.durations`` are not
    used here (they shaped the arrivals). See :class:`Timeline`."""
    mix = mix if mix is not None else WorkloadMix.from_pods([a.pod for a in arrivals])
    return Timeline(
        nodes, arrivals, policy, seed, config or TimelineConfig(), mix, hook=hook,
        scheduler=scheduler, defragmenter=defragmenter, progress=progress,
    ).run()  # fmt: skip


__all__ = [
    "Arrival",
    "ClassStats",
    "DurationModel",
    "Progress",
    "Timeline",
    "TimelineConfig",
    "TimelineRun",
    "TimelineSeries",
    "arrival_rate",
    "generate_arrivals",
    "gpu_class",
    "is_multi",
    "offered_load",
    "priority_class",
    "replay_timeline",
    "run_timeline",
]
