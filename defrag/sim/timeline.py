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
  its last checkpoint, re-queues (or binds to its planned node), and restarts with an overhead.
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
from dataclasses import dataclass, field, replace

import numpy as np

from defrag.model.arrays import NodeArrays
from defrag.model.resources import Node, Pod
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.scoring.framework import Placement, Policy
from defrag.scoring.profile import ProfileConfig
from defrag.scoring.scheduler import schedule
from defrag.sim.hooks import DefragHook, Move
from defrag.sim.migration import Job, MigrationCost
from defrag.sim.state import SimState
from defrag.sim.trace import QOS_PRIORITY

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class DurationModel:
    """Log-normal run times (hours): median and σ of ln(run time), per job kind.

    Defaults: pods asking at most one GPU (or a share, or none) run a median 2 h (mean
    2·e^{σ²/2} ≈ 3.3 h; one in six runs over 5.4 h); multi-GPU pods run a median 12 h (mean
    ≈ 25 h; 28% run over a day, 12% over two days). Every run time is cut at ``max_h``.
    """

    small_median_h: float = 2.0
    small_sigma: float = 1.0
    multi_gpu_median_h: float = 12.0
    multi_gpu_sigma: float = 1.2
    max_h: float = 24.0 * 14

    def params(self, multi_gpu: bool) -> tuple[float, float]:
        if multi_gpu:
            return self.multi_gpu_median_h, self.multi_gpu_sigma
        return self.small_median_h, self.small_sigma

    def mean_h(self, multi_gpu: bool) -> float:
        """E[run time] of the untruncated log-normal (the cut at max_h is negligible)."""
        median, sigma = self.params(multi_gpu)
        return median * math.exp(sigma * sigma / 2.0)

    def sample(self, multi_gpu: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        median = np.where(multi_gpu, self.multi_gpu_median_h, self.small_median_h)
        sigma = np.where(multi_gpu, self.multi_gpu_sigma, self.small_sigma)
        hours = median * np.exp(sigma * rng.standard_normal(len(multi_gpu)))
        return np.asarray(np.minimum(hours, self.max_h), dtype=np.float64)

    def scaled(self, factor: float) -> DurationModel:
        """Every median multiplied by ``factor`` (the ``--duration`` knob)."""
        return replace(
            self,
            small_median_h=self.small_median_h * factor,
            multi_gpu_median_h=self.multi_gpu_median_h * factor,
            max_h=self.max_h * factor,
        )


@dataclass(frozen=True, slots=True)
class TimelineConfig:
    load: float = 0.9
    """Offered GPU load as a fraction of the cluster's GPUs."""
    hours: float = 36.0
    """Length of the measured period."""
    warmup_hours: float = 12.0
    """Simulated before the measured period, to fill the cluster (not measured)."""
    durations: DurationModel = field(default_factory=DurationModel)
    sample_every_h: float = 0.25
    window_every_h: float = 6.0
    """Idle-window period for the defragmentation hook."""
    prefill: bool = True
    """Start in steady state (see :func:`generate_arrivals`) instead of an empty cluster."""
    cost: MigrationCost = field(default_factory=MigrationCost)
    """What an eviction costs: checkpoints and restart overhead per pod kind."""
    tick_every_h: float = 300.0 / 3600.0
    """Period of a hook's ``on_tick`` (the daemon's cycle interval, 300 s by default)."""
    hold_h: float = 600.0 / 3600.0
    """How long room made for a pod is held for it (the executor's replacement timeout)."""

    def __post_init__(self) -> None:
        if not 0 < self.load <= 5:
            raise ValueError(f"load must be in (0, 5], got {self.load}")
        if self.hours <= 0 or self.warmup_hours < 0:
            raise ValueError("hours must be > 0 and warmup_hours >= 0")
        if self.sample_every_h <= 0 or self.window_every_h <= 0 or self.tick_every_h <= 0:
            raise ValueError("sample_every_h, window_every_h and tick_every_h must be > 0")


@dataclass(frozen=True, slots=True)
class Arrival:
    time_h: float
    pod: Pod
    duration_h: float


def arrival_rate(shapes: Sequence[Pod], capacity_gpus: int, config: TimelineConfig) -> float:
    """Pods per hour such that rate × E[GPU demand × run time] = load × capacity."""
    demand = np.array([p.gpu_demand_milli for p in shapes], dtype=np.float64) / GPU_MILLI
    multi = np.array([p.num_gpu > 1 for p in shapes])
    mean_run = np.where(multi, config.durations.mean_h(True), config.durations.mean_h(False))
    work = float((demand * mean_run).mean())
    if work <= 0:
        raise ValueError("the shape pool asks for no GPU; no load can be offered")
    return config.load * capacity_gpus / work


def generate_arrivals(
    shapes: Sequence[Pod], capacity_gpus: int, config: TimelineConfig, seed: int
) -> list[Arrival]:
    """The seeded arrivals over warm-up + measured period, named ``<shape>-<#>``.

    With ``config.prefill`` the run starts in steady state rather than empty: at t = 0 the
    pods an M/G/∞ system would hold arrive together — Poisson(rate × E[run time]) of them,
    shapes weighted by their mean run time, each with the residual run time of a pod seen
    mid-run (a size-biased log-normal, median × e^{σ²}, times a uniform fraction).
    """
    if not shapes:
        raise ValueError("no pod shapes to draw arrivals from")
    rate = arrival_rate(shapes, capacity_gpus, config)
    horizon = config.warmup_hours + config.hours
    rng = np.random.default_rng(seed)
    expected = rate * horizon
    gaps = rng.exponential(1.0 / rate, size=int(expected + 6 * math.sqrt(expected) + 16))
    times = np.cumsum(gaps)
    while times[-1] < horizon:  # pragma: no cover - 6 σ above the mean
        more = np.cumsum(rng.exponential(1.0 / rate, size=len(times))) + times[-1]
        times = np.concatenate([times, more])
    times = times[times < horizon]
    picks = rng.integers(0, len(shapes), size=len(times))
    multi = np.array([shapes[int(i)].num_gpu > 1 for i in picks], dtype=bool)
    runs = config.durations.sample(multi, rng)
    if config.prefill:
        d = config.durations
        is_multi = np.array([p.num_gpu > 1 for p in shapes], dtype=bool)
        mean_run = np.where(is_multi, d.mean_h(True), d.mean_h(False))
        n0 = int(rng.poisson(rate * float(mean_run.mean())))
        first = rng.choice(len(shapes), size=n0, p=mean_run / mean_run.sum())
        first_multi = is_multi[first]
        sigma = np.where(first_multi, d.multi_gpu_sigma, d.small_sigma)
        median = np.where(first_multi, d.multi_gpu_median_h, d.small_median_h)
        biased = median * np.exp(sigma * sigma + sigma * rng.standard_normal(n0))
        residual = np.minimum(rng.random(n0) * biased, d.max_h)
        times = np.concatenate([np.zeros(n0), times])
        picks = np.concatenate([first, picks])
        runs = np.concatenate([residual, runs])
    width = len(str(len(times)))
    return [
        Arrival(
            float(t), replace(shapes[int(i)], name=f"{shapes[int(i)].name}-{k:0{width}d}"), float(d)
        )
        for k, (t, i, d) in enumerate(zip(times, picks, runs, strict=True))
    ]


# --- results -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClassStats:
    """Pending time of the pods of one class that arrived in the measured period (hours)."""

    name: str
    pods: int
    mean_wait_h: float
    p95_wait_h: float
    still_pending: int

    def to_dict(self) -> dict[str, object]:
        return {
            "pods": self.pods,
            "mean_wait_h": round(self.mean_wait_h, 4),
            "p95_wait_h": round(self.p95_wait_h, 4),
            "still_pending": self.still_pending,
        }


@dataclass(frozen=True, slots=True)
class TimelineSeries:
    time_h: tuple[float, ...]
    allocation: tuple[float, ...]
    """GPU allocation, % of the cluster's GPUs."""
    queue: tuple[int, ...]
    """Pods waiting."""


@dataclass(frozen=True, slots=True)
class TimelineRun:
    policy: str
    seed: int
    load: float
    arrivals: int
    migrations: int
    mean_allocation: float
    mean_queue: float
    by_gpus: tuple[ClassStats, ...]
    by_priority: tuple[ClassStats, ...]
    series: TimelineSeries
    seconds: float
    defrag: bool = False
    defragmenter: str = "none"
    """The defragmenter that ran (``none``, ``defrag``, ``descheduler-hnu``…)."""
    scheduler: str = ""
    """The score the scheduler ran with (the policy, or the one the defragmenter installs)."""
    evictions: int = 0
    """Every pod stopped by the defragmenter: migrations (with a new node) + re-queued."""
    max_evictions: int = 0
    """The most times one pod was evicted."""
    lost_work_gpu_hours: float = 0.0
    overhead_gpu_hours: float = 0.0
    goodput_pct: float = 0.0
    """Useful GPU-hours per capacity-hour, %: allocation less the GPU-hours lost to
    evictions (work since the last checkpoint + restart overhead) in the measured period."""
    gpu_wait_hours: float = 0.0
    """Σ pending time × GPUs asked, over the measured pods (GPU·h)."""
    offered_load_pct: float = 0.0
    """The realised offered load: GPU-hours of work alive in the measured period (as if
    nothing waited) per capacity-hour, %."""
    multi_waits: tuple[float, ...] = ()
    """Pending time of every measured pod asking ≥ 2 whole GPUs (for CDFs)."""
    cost: dict[str, object] = field(default_factory=dict, hash=False)

    @property
    def lost_gpu_hours(self) -> float:
        return self.lost_work_gpu_hours + self.overhead_gpu_hours

    @property
    def label(self) -> str:
        if self.defragmenter == "none":
            return f"{self.policy}+defrag" if self.defrag else self.policy
        return f"{self.policy}+{self.defragmenter}"

    def wait(self, cls: str) -> ClassStats | None:
        return next((c for c in (*self.by_gpus, *self.by_priority) if c.name == cls), None)

    def to_dict(self, *, series: bool = False) -> dict[str, object]:
        out: dict[str, object] = {
            "policy": self.policy,
            "defragmenter": self.defragmenter,
            "scheduler": self.scheduler or self.policy,
            "defrag": self.defrag,
            "seed": self.seed,
            "load": self.load,
            "offered_load_pct": round(self.offered_load_pct, 2),
            "arrivals": self.arrivals,
            "mean_allocation": round(self.mean_allocation, 3),
            "goodput_pct": round(self.goodput_pct, 3),
            "lost_gpu_hours": round(self.lost_gpu_hours, 2),
            "lost_work_gpu_hours": round(self.lost_work_gpu_hours, 2),
            "overhead_gpu_hours": round(self.overhead_gpu_hours, 2),
            "mean_queue": round(self.mean_queue, 2),
            "gpu_wait_hours": round(self.gpu_wait_hours, 1),
            "pending_by_gpus": {c.name: c.to_dict() for c in self.by_gpus},
            "pending_by_priority": {c.name: c.to_dict() for c in self.by_priority},
            "migrations": self.migrations,
            "evictions": self.evictions,
            "max_evictions_per_pod": self.max_evictions,
            "cost": self.cost,
            "seconds": round(self.seconds, 2),
        }
        if series:
            out["series"] = {
                "time_h": [round(t, 3) for t in self.series.time_h],
                "allocation": [round(a, 3) for a in self.series.allocation],
                "queue": list(self.series.queue),
            }
        return out


def gpu_class(pod: Pod) -> str:
    """``cpu``, ``share`` or the GPU count (``1``, ``2``, ``4``, ``8``…)."""
    if pod.num_gpu == 0:
        return "cpu"
    if pod.gpu_milli < GPU_MILLI:
        return "share"
    return str(pod.num_gpu)


def priority_class(pod: Pod) -> str:
    return pod.qos or str(pod.priority)


def is_multi(pod: Pod) -> bool:
    """Asks two or more whole GPUs (the ``multi`` class)."""
    return pod.num_gpu >= 2 and pod.gpu_milli >= GPU_MILLI


# --- the waiting queue -------------------------------------------------------------------------


class WaitQueue:
    """Waiting pods with numpy columns, so one freed node is checked against all at once."""

    def __init__(self, models: tuple[str, ...]) -> None:
        self.models = models
        self.pods: list[Pod] = []
        self.arrived: list[float] = []
        self.durations: list[float] = []
        cap = 256
        self._cpu = np.zeros(cap, np.int64)
        self._mem = np.zeros(cap, np.int64)
        self._k = np.zeros(cap, np.int64)
        self._milli = np.zeros(cap, np.int64)
        self._prio = np.zeros(cap, np.int64)
        self._model_ok = np.zeros((cap, len(models) + 1), bool)  # last column: node w/o GPU
        self._alive = np.zeros(cap, bool)
        self.count = 0

    def push(self, pod: Pod, arrived: float, duration: float) -> None:
        i = len(self.pods)
        if i == len(self._alive):
            self._grow()
        self.pods.append(pod)
        self.arrived.append(arrived)
        self.durations.append(duration)
        self._cpu[i], self._mem[i] = pod.cpu_milli, pod.memory_mib
        self._k[i] = pod.num_gpu
        self._milli[i] = pod.gpu_milli if pod.num_gpu else 0
        self._prio[i] = pod.priority
        if pod.num_gpu == 0:
            self._model_ok[i, :] = True
        else:
            self._model_ok[i, :-1] = [
                not pod.gpu_models or m in pod.gpu_models for m in self.models
            ]
            self._model_ok[i, -1] = False
        self._alive[i] = True
        self.count += 1

    def _grow(self) -> None:
        n = len(self._alive) * 2
        for name in ("_cpu", "_mem", "_k", "_milli", "_prio", "_alive"):
            old = getattr(self, name)
            new = np.zeros(n, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)
        ok = np.zeros((n, self._model_ok.shape[1]), bool)
        ok[: len(self._model_ok)] = self._model_ok
        self._model_ok = ok

    def remove(self, i: int) -> None:
        self._alive[i] = False
        self.count -= 1

    def order(self, i: int) -> tuple[int, int]:
        """Queue order key: higher priority first, then arrival."""
        return (-int(self._prio[i]), i)

    def waiting(self) -> list[int]:
        """Indices of waiting pods in queue order (priority, then arrival)."""
        idx = np.flatnonzero(self._alive[: len(self.pods)])
        return [int(i) for i in idx[np.lexsort((idx, -self._prio[idx]))]]

    def may_fit(self, arrays: NodeArrays, row: int) -> list[int]:
        """Waiting pods that may fit on ``row`` by capacity alone, in queue order."""
        n = len(self.pods)
        alive = self._alive[:n]
        if not alive.any():
            return []
        total = int(arrays.gpu_total[row])
        free = np.sort(arrays.gpu_free[row, :total])
        k, milli = self._k[:n], self._milli[:n]
        # GPUs with at least the pod's share free, for each pod (free is sorted ascending).
        enough = total - np.searchsorted(free, np.maximum(milli, 1), side="left")
        gpu_ok = (k == 0) | (enough >= k)
        ok = (
            alive
            & gpu_ok
            & (self._cpu[:n] <= arrays.cpu_free[row])
            & (self._mem[:n] <= arrays.mem_free[row])
            & self._model_ok[:n, int(arrays.model_code[row])]
        )
        idx = np.flatnonzero(ok)
        return [int(i) for i in idx[np.lexsort((idx, -self._prio[idx]))]]


# --- the simulation ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Recorder:
    warmup: float
    waits: dict[str, list[float]] = field(default_factory=dict)
    prio_waits: dict[str, list[float]] = field(default_factory=dict)
    unfinished: dict[str, int] = field(default_factory=dict)
    prio_unfinished: dict[str, int] = field(default_factory=dict)
    gpu_wait: float = 0.0
    multi: list[float] = field(default_factory=list)

    def record(self, pod: Pod, wait: float, pending: bool) -> None:
        """One measured pod's total pending time (first wait + every re-queue)."""
        classes = [gpu_class(pod)] + (["multi"] if is_multi(pod) else [])
        p = priority_class(pod)
        for g in classes:
            self.waits.setdefault(g, []).append(wait)
        self.prio_waits.setdefault(p, []).append(wait)
        self.gpu_wait += wait * pod.gpu_demand_milli / GPU_MILLI
        if is_multi(pod):
            self.multi.append(wait)
        if pending:
            for g in classes:
                self.unfinished[g] = self.unfinished.get(g, 0) + 1
            self.prio_unfinished[p] = self.prio_unfinished.get(p, 0) + 1


def _stats(
    waits: dict[str, list[float]], unfinished: dict[str, int], order: list[str]
) -> tuple[ClassStats, ...]:
    out = []
    for name in sorted(waits, key=lambda n: (order.index(n) if n in order else len(order), n)):
        w = np.array(waits[name])
        out.append(
            ClassStats(
                name,
                len(w),
                float(w.mean()),
                float(np.percentile(w, 95)),
                unfinished.get(name, 0),
            )
        )
    return tuple(out)


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
    """The event loop over given ``arrivals`` (sorted by time); ``config.load`` and
    ``config.durations`` are not used here (they shaped the arrivals).

    ``scheduler`` is the score the scheduler runs with (default: ``policy``'s), for a
    defragmenter that installs its own (descheduler HighNodeUtilization: most-allocated).
    """
    started_at = time.perf_counter()
    config = config or TimelineConfig()
    mix = mix if mix is not None else WorkloadMix.from_pods([a.pod for a in arrivals])
    if scheduler is None:
        scheduler = policy
    # A scheduler by name gets the run's profile (its seed, the simulated mix); a peer's own
    # score function (KAI's bin-pack) comes built.
    sched = (
        ProfileConfig(scheduler, seed).with_mix(mix).policy
        if isinstance(scheduler, str)
        else scheduler
    )
    state = SimState.new(nodes, sched, policy, mix)
    arrays = state.arrays
    capacity = int(arrays.gpu_total.sum())
    if capacity == 0:
        raise ValueError("the cluster has no GPU")
    arrivals = sorted(arrivals, key=lambda a: a.time_h)
    queue = WaitQueue(arrays.models)
    end = config.warmup_hours + config.hours
    warm = config.warmup_hours
    departures: list[tuple[float, int, str]] = []  # (time, seq, pod id); stale when seq moved on
    jobs = state.jobs
    cost_rng = np.random.default_rng([seed, 17])
    seq = 0
    lost_work = overhead_spent = 0.0
    evictions = 0
    on_tick = getattr(hook, "on_tick", None)

    def spent(job: Job, until: float) -> None:
        """Charge the restart overhead the running segment spent by ``until``, inside the
        measured period (a pod evicted during its overhead spent only part of it)."""
        nonlocal overhead_spent
        if job.started is None or not job.segment_overhead_h:
            return
        lo = max(job.started, warm)
        hi = min(job.started + job.segment_overhead_h, until, end)
        if hi > lo:
            overhead_spent += job.gpus * (hi - lo)

    def start(job: Job, row: int, gpus: tuple[int, ...], now: float) -> None:
        nonlocal seq
        state.place(job.pod, row, gpus, now)
        done_at = job.start(now, overhead=job.evictions > 0)
        seq += 1
        job.seq = seq
        heapq.heappush(departures, (done_at, seq, job.pod.key))
        if state.reserved:
            state.release_for(job.pod.key)

    def enqueue(job: Job, now: float) -> None:
        job.queued_at = now
        queue.push(job.pod, job.arrived, job.work_h)
        state.pending[job.pod.key] = job.pod

    def retry(rows: set[int], now: float) -> None:
        """Waiting pods that may now fit on ``rows``, in queue order; place every one that fits."""
        candidates = sorted(
            {i for row in rows for i in queue.may_fit(arrays, row)}, key=queue.order
        )
        for i in candidates:
            pod = queue.pods[i]
            result = schedule(pod, arrays, state.policy, exclude=state.excluded_for(pod.key))
            if isinstance(result, Placement):
                queue.remove(i)
                state.pending.pop(pod.key, None)
                start(jobs[pod.key], result.row, result.gpus, now)

    def apply(moves: Sequence[Move], now: float) -> None:
        nonlocal lost_work, evictions
        if not moves:
            return
        freed: set[int] = set()
        for before, after in state.apply_moves_detailed(moves):
            job = jobs[before.pod.key]
            spent(job, now)
            lost = job.evict(now)
            job.seq = 0  # its completion event is void
            evictions += 1
            if warm <= now < end:
                lost_work += job.gpus * lost
            freed.add(before.row)
            if after is None:
                enqueue(job, now)
            else:  # a migration: the replacement is bound to its planned node at once
                state.remove(job.pod.key)
                start(job, after.row, after.gpus, now)
        for m in moves:
            if m.for_pod is not None and m.for_pod in state.pending:
                state.reserved[m.source_row] = (m.for_pod, now + config.hold_h)
        retry(freed, now)

    samples_t: list[float] = []
    samples_alloc: list[float] = []
    samples_queue: list[int] = []
    next_sample = warm
    next_window = config.window_every_h
    next_tick = config.tick_every_h
    a = 0
    n = len(arrivals)
    cap_milli = capacity * GPU_MILLI
    while True:
        t_arr = arrivals[a].time_h if a < n else math.inf
        while departures and jobs[departures[0][2]].seq != departures[0][1]:
            heapq.heappop(departures)  # a pod evicted since: its old completion is void
        t_dep = departures[0][0] if departures else math.inf
        t_win = next_window if hook is not None else math.inf
        t_tick = next_tick if on_tick is not None else math.inf
        t_next = min(t_arr, t_dep, t_win, t_tick, next_sample)
        if t_next > end:
            break
        if t_dep == t_next:
            freed: set[int] = set()
            while departures and departures[0][0] == t_next:
                _, s_, pod_id = heapq.heappop(departures)
                if jobs[pod_id].seq == s_:
                    spent(jobs[pod_id], t_next)
                    jobs[pod_id].started = None
                    freed.add(state.remove(pod_id).row)
            retry(freed, t_next)
        elif t_win == t_next:
            assert hook is not None
            apply(hook.on_window(state, t_next), t_next)
            next_window += config.window_every_h
        elif t_tick == t_next:
            assert on_tick is not None
            expired = state.release_expired(t_next)
            if expired:
                retry(expired, t_next)
            apply(on_tick(state, t_next), t_next)
            next_tick += config.tick_every_h
        elif t_arr == t_next:
            arrival = arrivals[a]
            a += 1
            pod = arrival.pod
            interval, overhead = config.cost.draw(pod, cost_rng)
            job = Job(pod, t_next, arrival.duration_h, interval, overhead)
            jobs[pod.key] = job
            result = schedule(pod, arrays, state.policy, exclude=state.excluded_for(pod.key))
            if not isinstance(result, Placement) and hook is not None:
                apply(hook.on_unschedulable(state, pod, t_next), t_next)
                result = schedule(pod, arrays, state.policy, exclude=state.excluded_for(pod.key))
            if isinstance(result, Placement):
                start(job, result.row, result.gpus, t_next)
            else:
                enqueue(job, t_next)
            if progress is not None and (a % 1024 == 0 or a == n):
                progress(a, n)
        else:
            samples_t.append(t_next)
            samples_alloc.append(100.0 * (cap_milli - int(arrays.free_share().sum())) / cap_milli)
            samples_queue.append(queue.count)
            next_sample += config.sample_every_h
    for job in jobs.values():
        spent(job, end)  # still running: the overhead spent so far
    record = _Recorder(warm)
    for job in jobs.values():
        if job.arrived >= warm:
            pending = job.queued_at is not None
            wait = job.waited_h + (end - job.queued_at if job.queued_at is not None else 0.0)
            record.record(job.pod, wait, pending)
    gpu_order = ["cpu", "share", "1", "2", "4", "8", "multi"]
    prio_order = sorted(QOS_PRIORITY, key=lambda q: -QOS_PRIORITY[q])
    mean_alloc = float(np.mean(samples_alloc)) if samples_alloc else 0.0
    cap_hours = capacity * config.hours
    name = defragmenter if defragmenter is not None else ("defrag" if hook is not None else "none")
    return TimelineRun(
        policy=policy,
        seed=seed,
        load=config.load,
        arrivals=n,
        migrations=state.migrations,
        mean_allocation=mean_alloc,
        mean_queue=float(np.mean(samples_queue)) if samples_queue else 0.0,
        by_gpus=_stats(record.waits, record.unfinished, gpu_order),
        by_priority=_stats(record.prio_waits, record.prio_unfinished, prio_order),
        series=TimelineSeries(tuple(samples_t), tuple(samples_alloc), tuple(samples_queue)),
        seconds=time.perf_counter() - started_at,
        defrag=hook is not None and name == "defrag",
        defragmenter=name,
        scheduler=state.policy.name,
        evictions=evictions,
        max_evictions=max((j.evictions for j in jobs.values()), default=0),
        lost_work_gpu_hours=lost_work,
        overhead_gpu_hours=overhead_spent,
        goodput_pct=mean_alloc - 100.0 * (lost_work + overhead_spent) / cap_hours,
        gpu_wait_hours=record.gpu_wait,
        offered_load_pct=offered_load(arrivals, warm, end, capacity),
        multi_waits=tuple(sorted(record.multi)),
        cost=config.cost.describe(),
    )


def offered_load(arrivals: Sequence[Arrival], start: float, end: float, capacity: int) -> float:
    """GPU-hours of the arrivals' work inside [start, end), as if none waited, per
    capacity-hour of that period, %."""
    total = 0.0
    for arr in arrivals:
        lo, hi = max(arr.time_h, start), min(arr.time_h + arr.duration_h, end)
        if hi > lo:
            total += arr.pod.gpu_demand_milli / GPU_MILLI * (hi - lo)
    return 100.0 * total / (capacity * (end - start)) if end > start else 0.0
