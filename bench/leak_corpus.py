"""A seeded, labelled corpus of GPU-memory histories for the leak detector, truth attached.

Histories are what ``DCGM_FI_DEV_FB_USED`` looks like at the exporter's real cadence (30 s) over
6–8 h: a noiseless shape per family plus Gaussian sample noise of σ MiB (allocator caching,
activations), clipped to [0, capacity] as the real counter is. Gaps drop samples.

Leak families (``truth.leak``): ``linear`` (256 MiB/h – 4 GiB/h), ``steps`` (a few hundred MiB
every 10–30 min), ``sawtooth-leak`` (a cache freed and refilled while the floor rises),
``gaps-restart`` (a linear leak with scrape gaps, dropped samples and an exporter restart),
``mig`` (a leak on one MIG instance, its own small capacity), ``warmup-leak`` (the model loads
within 0.5–1 h, then the leak goes on — beyond the issue's list, the common real case).

Non-leak families: ``warmup-exp`` and ``warmup-log`` (an approach to a plateau, reached within
0.5–2 h), ``sawtooth``, ``step`` (one jump), ``spikes`` (periodic evaluation spikes), ``flat``,
``idle``, ``shared`` (two pods on one GPU: one flat, one with a cache), ``restart`` (a job
dropping to zero and regrowing to the same level), ``mig-sibling`` (busy instances beside a
leaking one).

Every leak's truth holds its rate, its start and the time its noiseless shape reaches the
usable memory (``exhaust_at``); the start level is drawn so that exhaustion lies 2–36 h after
the history's end (inside the shipped 48 h horizon).

    from bench.leak_corpus import corpus
    cases = corpus(seed=1, per_cell=8)
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from defrag.detectors.leak.core import GpuMemorySeries

HOUR = 3600.0
STEP_S = 30.0
GPU_MIB = 81920.0  # an H100 80GB
MIG_PROFILES = {"1g.10gb": 9851.0, "2g.20gb": 19968.0, "3g.40gb": 40192.0}
# MIG instance memory on an H100, from ``nvidia-smi mig -lgip`` (9.62, 19.50 and 39.25 GiB for
# 1g.10gb, 2g.20gb and 3g.40gb), in MiB.
END = 1772452800.0  # 2026-03-02T12:00:00Z: every history ends here
RATES = (256.0, 512.0, 1024.0, 2048.0, 4096.0)  # MiB/h
NOISES = (0.0, 200.0, 400.0, 600.0, 800.0)  # σ, MiB
LEAK_FAMILIES = ("linear", "steps", "sawtooth-leak", "gaps-restart", "mig", "warmup-leak")
NON_LEAK_FAMILIES = (
    "warmup-exp",
    "warmup-log",
    "sawtooth",
    "step",
    "spikes",
    "flat",
    "idle",
    "shared",
    "restart",
    "mig-sibling",
)


@dataclass(frozen=True, slots=True)
class Truth:
    family: str
    leak: bool
    noise_mib: float
    rate_mib_per_h: float = 0.0
    leak_start: float = 0.0
    exhaust_at: float | None = None
    flat_since: float | None = None
    """``saturating``: when the growth stopped at its limit."""


@dataclass(frozen=True, slots=True, eq=False)
class Case:
    name: str
    truth: Truth
    series: GpuMemorySeries


def _times(hours: float, end: float = END) -> np.ndarray:
    return np.arange(end - hours * HOUR + STEP_S, end + 1e-6, STEP_S)


def _series(
    name: str,
    t: np.ndarray,
    clean: np.ndarray,
    noise: float,
    rng: np.random.Generator,
    capacity: float = GPU_MIB,
    keep: np.ndarray | None = None,
    instance: str = "",
    profile: str = "",
) -> GpuMemorySeries:
    used = np.clip(clean + rng.normal(0.0, noise, len(t)) if noise else clean, 0.0, capacity)
    if keep is not None:
        t, used = t[keep], used[keep]
    return GpuMemorySeries(
        node="node-0",
        gpu="0",
        times=t,
        used_mib=used,
        total_mib=capacity,
        pods=(f"ml/{name}",),
        uuid=f"GPU-{name}",
        instance=instance,
        profile=profile,
    )


def _leak(family: str, rate: float, noise: float, rng: np.random.Generator, name: str) -> Case:
    hours = float(rng.choice([6.0, 7.0, 8.0]))
    t = _times(hours)
    h = (t - t[0]) / HOUR
    capacity, instance, profile = GPU_MIB, "", ""
    if family == "mig":
        # an instance large enough to hold 3.5 h of this leak and 2 h more before it is full
        fits = [p for p, mib in MIG_PROFILES.items() if (mib - 1024.0) / rate >= 5.5]
        profile = str(rng.choice(fits or ["3g.40gb"]))
        capacity, instance = MIG_PROFILES[profile], str(int(rng.integers(1, 14)))
        hours = min(hours, (capacity - 1024.0) / rate - 2.0)
        t = _times(hours)
        h = (t - t[0]) / HOUR
    # start level so that exhaustion is 2–36 h after the end, and at least 1 GiB at the start
    latest = (capacity - 1024.0) / rate - hours
    eta_h = float(rng.uniform(2.0, max(min(36.0, latest), 2.0)))
    start_level = capacity - rate * (hours + eta_h)
    keep = None
    if family in ("linear", "mig", "gaps-restart"):
        clean = start_level + rate * h
    elif family == "steps":
        period = float(rng.uniform(10, 30)) / 60.0
        phase = float(rng.uniform(0, period))
        clean = start_level + rate * period * np.floor((h + phase) / period)
    elif family == "warmup-leak":  # the model loads (0.5–1 h), then the leak goes on
        reach = float(rng.uniform(0.5, 1.0))
        clean = start_level + rate * h - (start_level - 300.0) * np.exp(-3.0 * h / reach)
    elif family == "sawtooth-leak":
        amp = float(rng.uniform(1000, 4000))
        period = float(rng.uniform(20, 60)) / 60.0
        fill = float(rng.uniform(0.6, 0.95))
        phase = float(rng.uniform(0, period))
        cache = amp * np.minimum(((h + phase) % period) / (fill * period), 1.0)
        start_level -= amp  # exhaustion counted at the cache's peak: floor + amp
        clean = start_level + rate * h + cache
    else:
        raise ValueError(family)
    if family == "gaps-restart":
        keep = rng.random(len(t)) > 0.1  # 10% of scrapes lost
        for _ in range(2):  # two scrape gaps of 5–20 min
            at = float(rng.uniform(0.5, hours - 0.5))
            keep &= ~((h >= at) & (h < at + float(rng.uniform(5, 20)) / 60))
        at = float(rng.uniform(1.0, hours - 1.0))  # exporter restart: 2 min without samples
        keep &= ~((h >= at) & (h < at + 2 / 60))
    exhaust = t[0] + (hours + eta_h) * HOUR
    truth = Truth(family, True, noise, rate, float(t[0]), exhaust)
    s = _series(name, t, clean, noise, rng, capacity, keep, instance, profile)
    return Case(name, truth, s)


def _warmup(
    h: np.ndarray, start: float, level: float, reach: float, kind: str, rng: np.random.Generator
) -> np.ndarray:
    x = np.maximum(h - start, 0.0)
    if kind == "exp":  # 95% of the plateau after ``reach`` hours
        return level * (1.0 - np.exp(-3.0 * x / reach))
    k = float(rng.uniform(3.0, 10.0))  # per hour
    return level * np.minimum(np.log1p(k * x) / np.log1p(k * reach), 1.0)


def _non_leak(family: str, noise: float, rng: np.random.Generator, name: str) -> Case:
    hours = float(rng.choice([6.0, 7.0, 8.0]))
    t = _times(hours)
    h = (t - t[0]) / HOUR
    level = float(rng.uniform(8000, 60000))
    capacity, instance, profile = GPU_MIB, "", ""
    if family in ("warmup-exp", "warmup-log"):
        start = float(rng.uniform(0.0, hours / 2))
        reach = float(rng.uniform(0.5, 2.0))
        clean = 300.0 + _warmup(h, start, level, reach, family[-3:], rng)
    elif family == "sawtooth":
        amp, period = float(rng.uniform(1000, 6000)), float(rng.uniform(20, 60)) / 60
        fill, phase = float(rng.uniform(0.6, 0.95)), float(rng.uniform(0, period))
        clean = level + amp * np.minimum(((h + phase) % period) / (fill * period), 1.0)
    elif family == "step":
        at = float(rng.uniform(0.5, hours - 0.5))
        clean = np.where(h < at, level, level + float(rng.uniform(1000, 8000)))
    elif family == "spikes":
        period, width = float(rng.uniform(15, 60)) / 60, float(rng.uniform(1, 5)) / 60
        phase = float(rng.uniform(0, period))
        clean = level + float(rng.uniform(2000, 10000)) * (((h + phase) % period) < width)
    elif family == "flat":
        clean = np.full_like(h, level)
    elif family == "idle":
        clean = np.full_like(h, float(rng.uniform(0, 600)))
    elif family == "shared":
        amp, period = float(rng.uniform(1000, 4000)), float(rng.uniform(20, 60)) / 60
        clean = level / 2 + level / 2 + amp * ((h % period) / period)
    elif family == "restart":
        at = float(rng.uniform(0.5, hours - 0.5))
        reach = float(rng.uniform(0.5, 2.0))
        clean = np.where(h < at, level, 300.0 + _warmup(h, at + 0.05, level, reach, "exp", rng))
    elif family == "mig-sibling":
        profile = str(rng.choice(list(MIG_PROFILES)))
        capacity, instance = MIG_PROFILES[profile], str(int(rng.integers(1, 14)))
        busy = capacity * float(rng.uniform(0.3, 0.7))
        amp, period = capacity * 0.2, float(rng.uniform(20, 60)) / 60
        clean = busy + amp * ((h % period) / period)
    else:
        raise ValueError(family)
    s = _series(name, t, clean, noise, rng, capacity, None, instance, profile)
    return Case(name, Truth(family, False, noise), s)


def corpus(
    seed: int = 1,
    per_cell: int = 8,
    families: Sequence[str] = LEAK_FAMILIES + NON_LEAK_FAMILIES,
    noises: Sequence[float] = NOISES,
    rates: Sequence[float] = RATES,
) -> list[Case]:
    """``per_cell`` cases per (family, noise[, rate]) cell, deterministic for a seed."""
    return list(iter_corpus(seed, per_cell, families, noises, rates))


def iter_corpus(
    seed: int,
    per_cell: int,
    families: Sequence[str],
    noises: Sequence[float],
    rates: Sequence[float],
) -> Iterator[Case]:
    for family in families:
        fi = zlib.crc32(family.encode())  # a cell does not depend on which others are drawn
        for noise in noises:
            rate_cells: Sequence[float | None] = rates if family in LEAK_FAMILIES else (None,)
            for rate in rate_cells:
                for i in range(per_cell):
                    rng = np.random.default_rng([seed, fi, int(noise), int(rate or 0), i])
                    tag = f"{family}-s{noise:g}" + (f"-r{rate:g}" if rate else "") + f"-{i}"
                    if rate is None:
                        yield _non_leak(family, noise, rng, tag)
                    else:
                        yield _leak(family, rate, noise, rng, tag)


def random_mix(n: int = 1000, seed: int = 2) -> list[Case]:
    """``n`` non-leak histories of random family and noise σ ~ U(0, 800) MiB."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        family = str(rng.choice(NON_LEAK_FAMILIES))
        noise = float(rng.uniform(0, 800))
        out.append(_non_leak(family, noise, np.random.default_rng([seed, i]), f"mix-{i}"))
    return out


# --- serially correlated noise and saturation (single GPU histories, judged by the pure core) ----

AR1_FAMILIES = ("ar1-leak", "ar1-flat", "saturating")
"""``ar1-leak``: a linear leak of 512–1024 MiB/h under AR(1) noise (a level that lingers: time
constant τ of 1–20 min, stationary σ 300–600 MiB), over 6 h; ``ar1-flat``: the same noise on a
flat level (a non-leak); ``saturating``: a cache that fills at 1–4 GiB/h to a limit below
capacity and stays there for the last 15–120 min (a non-leak once flat ≥ 15 min)."""


def ar1_noise(t: np.ndarray, sigma: float, tau_s: float, rng: np.random.Generator) -> np.ndarray:
    """AR(1) noise sampled at ``t``: x_k = φ x_{k−1} + e_k with φ = exp(−Δt / τ) and the
    innovation's σ chosen so the stationary σ is ``sigma``."""
    dt = float(np.median(np.diff(t))) if len(t) > 1 else STEP_S
    phi = float(np.exp(-dt / tau_s))
    e = rng.normal(0.0, sigma * np.sqrt(1.0 - phi * phi), len(t))
    x = np.empty(len(t))
    x[0] = rng.normal(0.0, sigma)
    for k in range(1, len(t)):
        x[k] = phi * x[k - 1] + e[k]
    return x


def correlated_case(family: str, rng: np.random.Generator, name: str) -> Case:
    """One history of an :data:`AR1_FAMILIES` family; ``Truth.noise_mib`` is the stationary σ
    and ``Truth.rate_mib_per_h`` the leak's rate (0 for a non-leak)."""
    hours = 6.0
    t = _times(hours)
    h = (t - t[0]) / HOUR
    sigma = float(rng.uniform(300.0, 600.0))
    tau = float(rng.uniform(1.0, 20.0)) * 60.0
    if family == "saturating":
        rate = float(rng.uniform(1024.0, 4096.0))
        flat_h = float(rng.uniform(0.25, 2.0))
        limit = float(rng.uniform(20000.0, 60000.0))
        start = limit - rate * (hours - flat_h)
        clean = np.minimum(start + rate * h, limit)
        used = np.clip(clean + rng.normal(0.0, 200.0, len(t)), 0.0, GPU_MIB)
        truth = Truth(family, False, 200.0, 0.0, flat_since=float(t[-1] - flat_h * HOUR))
        return Case(name, truth, _plain(name, t, used))
    noise = ar1_noise(t, sigma, tau, rng)
    if family == "ar1-flat":
        level = float(rng.uniform(8000.0, 60000.0))
        used = np.clip(level + noise, 0.0, GPU_MIB)
        return Case(name, Truth(family, False, sigma), _plain(name, t, used))
    rate = float(rng.uniform(512.0, 1024.0))
    eta_h = float(rng.uniform(2.0, 36.0))
    start_level = max(GPU_MIB - rate * (hours + eta_h), 1024.0)
    exhaust = t[0] + (GPU_MIB - start_level) / rate * HOUR
    used = np.clip(start_level + rate * h + noise, 0.0, GPU_MIB)
    truth = Truth(family, True, sigma, rate, float(t[0]), exhaust)
    return Case(name, truth, _plain(name, t, used))


def _plain(name: str, t: np.ndarray, used: np.ndarray) -> GpuMemorySeries:
    return GpuMemorySeries("node-0", "0", t, used, GPU_MIB, (f"ml/{name}",), f"GPU-{name}")


def family_rng(seed: int, family: str, i: int) -> np.random.Generator:
    """The generator of a family's ``i``-th case for ``seed``: a case does not depend on which
    other families or how many cases are drawn."""
    return np.random.default_rng([seed, zlib.crc32(family.encode()), i])


def correlated_corpus(seed: int, n: int = 20) -> list[Case]:
    """``n`` histories of each :data:`AR1_FAMILIES` family, deterministic for a seed."""
    out = []
    for family in AR1_FAMILIES:
        for i in range(n):
            out.append(correlated_case(family, family_rng(seed, family, i), f"{family}-{i}"))
    return out


# --- a moving cluster: pods that end, exporters that go silent, leaks that kill their pod -------

MOVING_FAMILIES = ("ended-leak", "exporter-gap", "oom-leak", "crashloop", "two-gpu-leak")
"""Histories of several DCGM series per GPU, written for a real Prometheus
(:func:`write_moving`) and judged through the leak rule's queries:

* ``ended-leak`` — a pod leaks (1–4 GiB/h) and ends 20 min – 4.75 h before the history's end;
  the GPU then goes to a new, flat pod or to none (dcgm-exporter then exports it without pod
  labels). A finding after the end is a false positive;
* ``exporter-gap`` — a leak (0.5–2 GiB/h) on a node whose exporter is silent for the last
  6–20 min; it must still be found;
* ``oom-leak`` — a pod whose memory grows from its load level to the GPU's memory in 3–8 h (then
  the container is OOM-killed and restarts in the same pod, memory back to the load level);
  it must be reported at least 30 min before the OOM;
* ``crashloop`` — a ReplicaSet whose pods (a new name each life, ``kube_pod_owner`` naming the
  owner) each leak to the GPU's memory within 1–2 h and die; one workload finding is expected;
* ``two-gpu-leak`` — one pod leaking on two GPUs: two findings with distinct fingerprints.
"""

MODEL = "NVIDIA H100 80GB HBM3"
HISTORY_H = 10.0


@dataclass(frozen=True, slots=True, eq=False)
class Life:
    """One DCGM series: a GPU's memory while one pod (or none) holds it."""

    gpu: str
    pod: str  # '' when no pod holds the GPU
    times: np.ndarray
    used: np.ndarray


@dataclass(frozen=True, slots=True)
class MovingTruth:
    family: str
    leak: bool
    subject: str = ""
    """The finding expected (``pod/<ns>/<name>``, ``workload/<ns>/<kind>/<name>``), '' for none."""
    start: float = 0.0
    """When the leak began (the first life's start for a crash loop)."""
    end: float | None = None
    """``ended-leak``: when the leaking pod ended; ``oom-leak``: when it is OOM-killed."""
    exhaust_at: float | None = None
    silent_from: float | None = None
    rate_mib_per_h: float = 0.0
    restarts: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class MovingCase:
    name: str
    node: str
    truth: MovingTruth
    lives: tuple[Life, ...]
    owners: tuple[tuple[str, str, str, float, float], ...] = ()
    """(pod, owner kind, owner name, from, to) for ``kube_pod_owner``."""


def grid(start: float, stop: float) -> np.ndarray:
    """The scrape times (multiples of STEP_S) from ``start`` to ``stop``."""
    first = np.ceil(start / STEP_S) * STEP_S
    return np.arange(first, stop + 1e-6, STEP_S)


def moving_case(family: str, rng: np.random.Generator, name: str, node: str) -> MovingCase:
    begin = END - HISTORY_H * HOUR
    noise = float(rng.uniform(100.0, 400.0))

    def life(
        gpu: str, pod: str, start: float, stop: float, level: float, slope: float = 0.0
    ) -> Life:
        t = grid(start, stop)
        clean = level + slope * (t - start) / HOUR
        return Life(gpu, pod, t, np.clip(clean + rng.normal(0.0, noise, len(t)), 0.0, GPU_MIB))

    def loading(
        gpu: str, pod: str, begin: float, stop: float, load: float, level: float, rate: float
    ) -> Life:
        """A life that loads its model from nothing in ``load`` seconds, then grows."""
        t = grid(begin, stop)
        x = t - begin
        clean = 300.0 + (level - 300.0) * np.clip(x / load, 0.0, 1.0)
        clean = clean + rate * np.maximum(x - load, 0.0) / HOUR
        return Life(gpu, pod, t, np.clip(clean + rng.normal(0.0, noise, len(t)), 0.0, GPU_MIB))

    pod = f"ml/{name}"
    if family == "ended-leak":
        rate = float(rng.choice([1024.0, 2048.0, 4096.0]))
        ended = END - float(rng.uniform(20.0, 285.0)) * 60.0
        level = float(rng.uniform(2000.0, 8000.0))
        level = min(level, 0.85 * GPU_MIB - rate * (ended - begin) / HOUR)
        lives = [life("0", pod + "-a", begin, ended, max(level, 500.0), rate)]
        if rng.random() < 0.5:
            lives.append(life("0", pod + "-b", ended + STEP_S, END, float(rng.uniform(2e3, 2e4))))
        else:
            lives.append(life("0", "", ended + STEP_S, END, float(rng.uniform(0.0, 600.0))))
        truth = MovingTruth(family, False, "", begin, ended, None, None, rate)
        return MovingCase(name, node, truth, tuple(lives))
    if family in ("exporter-gap", "two-gpu-leak"):
        rate = float(rng.uniform(512.0, 2048.0))
        eta_h = float(rng.uniform(4.0, 30.0))
        level = GPU_MIB - rate * (HISTORY_H + eta_h)
        gpus = ("0", "1") if family == "two-gpu-leak" else ("0",)
        silent = END - float(rng.uniform(6.0, 20.0)) * 60.0 if family == "exporter-gap" else None
        stop = silent if silent is not None else END
        lives = [life(g, pod, begin, stop, level, rate) for g in gpus]
        exhaust = END + eta_h * HOUR
        truth = MovingTruth(family, True, f"pod/{pod}", begin, None, exhaust, silent, rate)
        return MovingCase(name, node, truth, tuple(lives))
    if family == "oom-leak":
        oom_h = float(rng.uniform(3.0, 8.0))
        level = float(rng.uniform(2000.0, 16000.0))
        rate = (GPU_MIB - level) / oom_h
        start = END - (oom_h + float(rng.uniform(0.5, 1.5))) * HOUR
        oom = start + oom_h * HOUR
        load = float(rng.uniform(5.0, 15.0)) * 60.0  # the model loads from nothing first
        lives = [
            loading("0", pod, start - load, oom, load, level, rate),
            # OOM-killed: the container restarts in the same pod and loads again
            loading("0", pod, oom + STEP_S, END, load, level, rate),
        ]
        truth = MovingTruth(family, True, f"pod/{pod}", start, oom, oom, None, rate)
        return MovingCase(name, node, truth, tuple(lives))
    if family == "crashloop":
        owner = f"{name}-7d9f5"
        t, lives_, owners, n = begin + float(rng.uniform(0.0, 1.0)) * HOUR, [], [], 0
        while t < END:
            span = float(rng.uniform(1.0, 2.0))
            load = float(rng.uniform(5.0, 10.0)) * 60.0
            level = float(rng.uniform(2000.0, 12000.0))
            rate = (GPU_MIB - level) / (span - load / HOUR)
            stop = min(t + span * HOUR, END)
            p = f"ml/{owner}-{''.join(rng.choice(list('bcdfghjklmnpqrstvwxz2456789'), 5))}"
            lives_.append(loading("0", p, t, stop, load, level, rate))
            owners.append((p, "ReplicaSet", owner, t, stop))
            t, n = stop + 60.0, n + 1
        subject = f"workload/ml/ReplicaSet/{owner}"
        truth = MovingTruth(family, True, subject, lives_[0].times[0], None, None, None, 0.0, n - 1)
        return MovingCase(name, node, truth, tuple(lives_), tuple(owners))
    raise ValueError(family)


def moving_corpus(seed: int = 1, per_family: int = 10) -> list[MovingCase]:
    """``per_family`` cases of each :data:`MOVING_FAMILIES` family, each on a node of its own,
    deterministic for a seed."""
    out = []
    for family in MOVING_FAMILIES:
        for i in range(per_family):
            name = f"{family}-{i}"
            out.append(moving_case(family, family_rng(seed, family, i), name, f"node-{name}"))
    return out


def write_moving(cases: Sequence[MovingCase], out: TextIO, *, exported: bool = False) -> None:
    """The cases as dcgm-exporter series (``DCGM_FI_DEV_FB_USED``/``FREE`` with ``gpu``,
    ``UUID``, ``Hostname``, ``modelName`` and the pod labels, which dcgm-exporter leaves off a
    GPU no pod holds) and ``kube_pod_owner`` (kube-state-metrics docs/metrics/workload/
    pod-metrics.md: ``namespace``, ``pod``, ``uid``, ``owner_kind``, ``owner_name``,
    ``owner_is_controller``), as OpenMetrics for ``promtool tsdb create-blocks-from``."""
    prefix = "exported_" if exported else ""
    for metric in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
        out.write(f"# TYPE {metric} gauge\n")
        for case in cases:
            for lf in case.lives:
                labels = (
                    f'gpu="{lf.gpu}",UUID="GPU-{case.name}-{lf.gpu}",Hostname="{case.node}",'
                    f'modelName="{MODEL}"'
                )
                if lf.pod:
                    ns, _, name = lf.pod.partition("/")
                    labels += (
                        f',{prefix}namespace="{ns}",{prefix}pod="{name}",{prefix}container="main"'
                    )
                if exported:
                    labels += ',namespace="gpu-operator",pod="nvidia-dcgm-exporter-x1"'
                values = lf.used if metric.endswith("USED") else GPU_MIB - lf.used
                keep = np.ones(len(lf.times), dtype=bool)
                if case.truth.silent_from is not None:
                    keep = lf.times < case.truth.silent_from
                out.writelines(
                    f"{metric}{{{labels}}} {v:.0f} {int(t)}\n"
                    for t, v in zip(lf.times[keep], values[keep], strict=True)
                )
    write_owners(cases, out)
    out.write("# EOF\n")


Owner = tuple[str, str, str, float, float]
"""A pod's owner while it lived: (namespace/pod, owner kind, owner name, start s, stop s)."""


def write_owners(cases: Iterable[Any], out: TextIO) -> None:
    """kube-state-metrics' ``kube_pod_owner`` for each case's ``owners`` (:data:`Owner`), one
    sample per step while each pod lived."""
    out.write("# TYPE kube_pod_owner gauge\n")
    for case in cases:
        for pod, kind, owner, start, stop in case.owners:
            ns, _, name = pod.partition("/")
            labels = (
                f'namespace="{ns}",pod="{name}",uid="uid-{name}",owner_kind="{kind}",'
                f'owner_name="{owner}",owner_is_controller="true"'
            )
            out.writelines(f"kube_pod_owner{{{labels}}} 1 {int(t)}\n" for t in grid(start, stop))


# --- fast leaks: a leak that begins mid-history, a leak that OOM-kills its pod ------------------

FAST_FAMILIES = ("onset", "oom")
"""``onset``: a flat job whose memory starts to leak (256 MiB/h – 4 GiB/h) 3 h into an 8 h
history (``Truth.leak_start``); ``oom``: a pod that loads its model in 5–15 min from nothing to
2–16 GiB, then leaks to the GPU's memory in 3–8 h (``Truth.exhaust_at``: the OOM kill)."""


def fast_case(family: str, rate: float, noise: float, rng: np.random.Generator, name: str) -> Case:
    if family == "onset":
        t = _times(8.0)
        h = (t - t[0]) / HOUR
        onset = 3.0
        # exhaustion 2–36 h after the history's end (inside the 48 h horizon), ≥ 1 GiB at start
        latest = (GPU_MIB - 1024.0) / rate - (8.0 - onset)
        eta_h = float(rng.uniform(2.0, max(min(36.0, latest), 2.0)))
        level = GPU_MIB - rate * (8.0 - onset + eta_h)
        clean = level + rate * np.maximum(h - onset, 0.0)
        exhaust = t[0] + (onset + (GPU_MIB - level) / rate) * HOUR
        truth = Truth(family, True, noise, rate, float(t[0] + onset * HOUR), exhaust)
        return Case(name, truth, _series(name, t, clean, noise, rng))
    oom_h = float(rng.uniform(3.0, 8.0))
    load_h = float(rng.uniform(5.0, 15.0)) / 60.0
    level = float(rng.uniform(2000.0, 16000.0))
    slope = (GPU_MIB - level) / oom_h
    t = _times(oom_h + load_h)
    h = (t - t[0]) / HOUR
    ramp = 300.0 + (level - 300.0) * np.minimum(h / load_h, 1.0)
    clean = ramp + slope * np.maximum(h - load_h, 0.0)
    oom = float(t[0] + (load_h + oom_h) * HOUR)
    truth = Truth(family, True, noise, slope, float(t[0] + load_h * HOUR), oom)
    return Case(name, truth, _series(name, t, clean, noise, rng))


def fast_corpus(
    seed: int, per_cell: int = 5, noises: Sequence[float] = (0.0, 200.0, 400.0, 600.0)
) -> list[Case]:
    """``onset`` cases per (noise, rate) cell and ``oom`` cases per noise, for a seed."""
    out = []
    for family in FAST_FAMILIES:
        fi = zlib.crc32(family.encode())
        for noise in noises:
            for rate in RATES if family == "onset" else (0.0,):
                for i in range(per_cell * (1 if family == "onset" else 4)):
                    rng = np.random.default_rng([seed, fi, int(noise), int(rate), i])
                    tag = f"{family}-s{noise:g}" + (f"-r{rate:g}" if rate else "") + f"-{i}"
                    out.append(fast_case(family, rate, noise, rng, tag))
    return out


def onset_cases(seed: int, rate: float, noise: float, n: int) -> list[Case]:
    """``n`` more ``onset`` histories of one (rate, σ) cell, drawn apart from
    :func:`fast_corpus`'s (for the share found exactly at a target time)."""
    fi = zlib.crc32(b"onset")
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, fi, int(noise), int(rate), 1000 + i])
        out.append(fast_case("onset", rate, noise, rng, f"onset-s{noise:g}-r{rate:g}-x{i}"))
    return out
