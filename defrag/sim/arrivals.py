"""What arrives in the timeline protocol, and when: the run's knobs (:class:`TimelineConfig`),
log-normal run times (:class:`DurationModel`) and the seeded Poisson arrivals with a steady-state
start (:func:`generate_arrivals`). See :mod:`defrag.sim.timeline` for the protocol."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import numpy as np

from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.sim.migration import MigrationCost


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
    kept: dict[int, dict[str, object]] = {}  # a shape's fields, read once (not per arrival)
    arrivals = []
    for k, (t, i, d) in enumerate(zip(times.tolist(), picks.tolist(), runs.tolist(), strict=True)):
        shape = kept.get(i)
        if shape is None:
            shape = kept[i] = {f: getattr(shapes[i], f) for f in POD_FIELDS}
        pod = Pod(**{**shape, "name": f"{shape['name']}-{k:0{width}d}"})  # type: ignore[arg-type]
        arrivals.append(Arrival(t, pod, d))
    return arrivals


POD_FIELDS = tuple(f.name for f in fields(Pod))
"""A pod's fields: an arrival is its shape with its own name (as ``dataclasses.replace``
makes it, without reading the shape's fields again per arrival)."""


def offered_load(arrivals: Sequence[Arrival], start: float, end: float, capacity: int) -> float:
    """GPU-hours of the arrivals' work inside [start, end), as if none waited, per
    capacity-hour of that period, %."""
    total = 0.0
    for arr in arrivals:
        lo, hi = max(arr.time_h, start), min(arr.time_h + arr.duration_h, end)
        if hi > lo:
            total += arr.pod.gpu_demand_milli / GPU_MILLI * (hi - lo)
    return 100.0 * total / (capacity * (end - start)) if end > start else 0.0
