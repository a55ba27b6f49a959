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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

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
