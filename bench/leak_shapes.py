"""Seeded workload shapes an on-call engineer meets, truth attached: leaks under periodic
evaluation spikes, caches that fill inside the lookback and stop, slow leaks that run out within
two days, time-sliced pods, re-created pods and leaks across restarts.

Single histories (``GpuMemorySeries``, 30 s samples, Gaussian noise σ 100–400 MiB):

* ``spiky-leak`` — a leak of 512–2048 MiB/h that exhausts the GPU 4–40 h after the history's
  end, under evaluation spikes every 20–60 min lasting 3–10 min (2–10 GiB each);
* ``spiky-healthy`` — the same spikes on a flat job;
* ``cache-stops`` — flat for 1–3 h, then a cache filling at 1–4 GiB/h for 0.5–2.5 h, then flat
  at its limit (``Truth.flat_since``);
* ``slow-leak`` — a leak of 48–256 MiB/h whose GPU runs out 12–40 h after the history's end.

Moving histories for a real Prometheus (:func:`shape_moving_corpus`, :func:`write_shapes`):

* ``timesliced`` — 2–4 pods time-slicing one GPU on dcgm-exporter ≥ 4.5.3
  (``--kubernetes-virtual-gpus``: the device series plus each pod's own, with ``pod_uid``), one
  leaking 512–2048 MiB/h; the finding must name it, its ETA the GPU's free memory over its rate;
* ``recreated-stayed`` / ``recreated-moved`` — a StatefulSet pod re-created under its name (a new
  ``pod_uid`` where exported, else only a hole) 2.5–4 h before the end, on its old GPU or on
  another node's; the old incarnation leaked or held steady, the new one leaks (``leak``) or not;
* ``restart-in-pod`` — a container OOM-killed and restarted in the same pod, each run leaking
  to the GPU's memory in 1.5–3 h;
* ``restart-new-pod`` — the same, each life a new pod of a ReplicaSet (``kube_pod_owner``).

Seeds: tune on 1–3, held out 101–103 (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from bench.leak_corpus import (
    END,
    GPU_MIB,
    HOUR,
    MODEL,
    STEP_S,
    Case,
    Truth,
    _plain,
    _times,
    family_rng,
    grid,
    write_owners,
)

SINGLE_FAMILIES = ("spiky-leak", "spiky-healthy", "cache-stops", "slow-leak")
TUNING_SEEDS = (1, 2, 3)
HELD_OUT_SEEDS = (101, 102, 103)


def _spikes(h: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    period = float(rng.uniform(20.0, 60.0)) / 60.0
    width = float(rng.uniform(3.0, 10.0)) / 60.0
    phase = float(rng.uniform(0.0, period))
    return float(rng.uniform(2048.0, 10240.0)) * (((h + phase) % period) < width)


def single_case(family: str, rng: np.random.Generator, name: str) -> Case:
    hours = 8.0
    t = _times(hours)
    h = (t - t[0]) / HOUR
    sigma = float(rng.uniform(100.0, 400.0))
    noise = rng.normal(0.0, sigma, len(t))
    if family in ("spiky-leak", "slow-leak"):
        if family == "spiky-leak":
            rate = float(rng.uniform(512.0, 2048.0))
            eta_h = float(rng.uniform(4.0, 40.0))
        else:
            rate = float(rng.uniform(48.0, 256.0))
            eta_h = float(rng.uniform(12.0, 40.0))
        level = GPU_MIB - rate * (hours + eta_h)
        if level < 1024.0:  # too fast for so late an exhaustion: start low, exhaust sooner
            level = 1024.0 + float(rng.uniform(0.0, 4096.0))
        clean = level + rate * h
        if family == "spiky-leak":
            clean = clean + _spikes(h, rng)
        exhaust = float(t[0] + (GPU_MIB - level) / rate * HOUR)
        used = np.clip(clean + noise, 0.0, GPU_MIB)
        return Case(
            name, Truth(family, True, sigma, rate, float(t[0]), exhaust), _plain(name, t, used)
        )
    if family == "spiky-healthy":
        level = float(rng.uniform(8000.0, 50000.0))
        used = np.clip(level + _spikes(h, rng) + noise, 0.0, GPU_MIB)
        return Case(name, Truth(family, False, sigma), _plain(name, t, used))
    if family == "cache-stops":
        onset = float(rng.uniform(1.0, 3.0))
        fill = float(rng.uniform(0.5, 2.5))
        rate = float(rng.uniform(1024.0, 4096.0))
        level = float(rng.uniform(8000.0, 40000.0))
        clean = level + rate * np.clip(h - onset, 0.0, fill)
        used = np.clip(clean + noise, 0.0, GPU_MIB)
        flat_since = float(t[0] + (onset + fill) * HOUR)
        return Case(name, Truth(family, False, sigma, flat_since=flat_since), _plain(name, t, used))
    raise ValueError(family)


def single_corpus(seed: int, n: int = 10, families: Sequence[str] = SINGLE_FAMILIES) -> list[Case]:
    out = []
    for family in families:
        for i in range(n):
            out.append(single_case(family, family_rng(seed, family, i), f"{family}-{seed}-{i}"))
    return out


# --- moving histories: series as dcgm-exporter and kube-state-metrics write them -------------


@dataclass(frozen=True, slots=True, eq=False)
class Run:
    """One DCGM ``FB_USED`` series: a GPU's memory while one pod incarnation (or none) holds it,
    or (``own``) one pod's own memory on a time-sliced GPU."""

    node: str
    gpu: str
    pod: str  # '' for the device-level series / a GPU no pod holds
    uid: str | None  # pod_uid label (None: not exported)
    times: np.ndarray
    used: np.ndarray
    own: bool = False


@dataclass(frozen=True, slots=True)
class ShapeTruth:
    family: str
    leak: bool
    subject: str = ""
    exhaust_at: float | None = None
    rate_mib_per_h: float = 0.0
    moved: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class ShapeCase:
    name: str
    truth: ShapeTruth
    runs: tuple[Run, ...]
    device: tuple[tuple[str, str, np.ndarray, np.ndarray], ...] = ()
    """(node, gpu, times, device-level used MiB) where it differs from the runs' own."""
    owners: tuple[tuple[str, str, str, float, float], ...] = ()


MOVING_FAMILIES = (
    "timesliced",
    "recreated-stayed",
    "recreated-moved",
    "restart-in-pod",
    "restart-new-pod",
)
HISTORY_H = 8.0


def moving_case(family: str, rng: np.random.Generator, name: str, i: int = 0) -> ShapeCase:
    """One case; ``i`` alternates a re-created pod's new leak (even) or health (odd) and its
    ``pod_uid`` label (exported for i mod 4 in 0–1)."""
    begin = END - HISTORY_H * HOUR
    sigma = float(rng.uniform(100.0, 300.0))
    node = f"node-{name}"

    def noisy(clean: np.ndarray) -> np.ndarray:
        return np.clip(np.round(clean + rng.normal(0.0, sigma, len(clean))), 0.0, GPU_MIB)

    if family == "timesliced":
        t = grid(begin, END)
        h = (t - begin) / HOUR
        k = int(rng.integers(2, 5))
        others = [float(rng.uniform(2048.0, 12288.0)) for _ in range(k - 1)]
        rate = float(rng.uniform(512.0, 2048.0))
        eta_h = float(rng.uniform(4.0, 30.0))
        free_end = rate * eta_h
        start = GPU_MIB - 600.0 - sum(others) - free_end - rate * HISTORY_H
        start = max(start, 1024.0)
        leak = noisy(start + rate * h)
        runs = [Run(node, "0", f"ml/{name}-leaker", f"uid-{name}-0", t, leak, True)]
        device = leak + 600.0
        for j, level in enumerate(others):
            cache = level + float(rng.uniform(0.0, 2048.0)) * ((h * 60.0 % 45.0) / 45.0)
            values = noisy(cache)
            runs.append(Run(node, "0", f"ml/{name}-n{j}", f"uid-{name}-{j + 1}", t, values, True))
            device = device + values
        exhaust = END + (GPU_MIB - float(device[-1])) / rate * HOUR
        truth = ShapeTruth(family, True, f"pod/ml/{name}-leaker", exhaust, rate)
        return ShapeCase(name, truth, tuple(runs), ((node, "0", t, device),))
    if family in ("recreated-stayed", "recreated-moved"):
        moved = family.endswith("moved")
        uids = (i // 2) % 2 == 0
        back = END - float(rng.uniform(2.5, 4.0)) * HOUR
        gone = back - float(rng.uniform(10.0, 30.0)) * 60.0
        pod = f"ml/{name}-0"
        old_leaks = bool(rng.random() < 0.5)
        new_leaks = i % 2 == 0
        t_old = grid(begin, gone)
        old = noisy(
            float(rng.uniform(10000.0, 30000.0))
            + (1536.0 if old_leaks else 0.0) * (t_old - begin) / HOUR
        )
        runs = [Run(node, "0", pod, f"uid-{name}-a" if uids else None, t_old, old)]
        t_new = grid(back, END)
        level = float(rng.uniform(8000.0, 30000.0))
        # exhausted within 30 h of the end (inside the shipped 48 h horizon)
        least = (GPU_MIB - level) / (30.0 + (END - back) / HOUR)
        rate = float(rng.uniform(max(1024.0, least), 3072.0)) if new_leaks else 0.0
        new = noisy(level + rate * (t_new - back) / HOUR)
        where = f"{node}-b" if moved else node
        runs.append(Run(where, "0", pod, f"uid-{name}-b" if uids else None, t_new, new))
        # the old GPU without a pod after the old incarnation left (and while it is away)
        t_idle = grid(gone + STEP_S, END if moved else back - STEP_S)
        runs.append(Run(node, "0", "", None, t_idle, noisy(np.full(len(t_idle), 400.0))))
        if moved:
            t_pre = grid(begin, back - STEP_S)
            runs.append(Run(where, "0", "", None, t_pre, noisy(np.full(len(t_pre), 400.0))))
        exhaust = (
            END + (GPU_MIB - float(level + rate * (END - back) / HOUR)) / rate * HOUR
            if rate
            else None
        )
        subject = f"pod/{pod}" if new_leaks else ""
        return ShapeCase(
            name, ShapeTruth(family, new_leaks, subject, exhaust, rate, moved), tuple(runs)
        )
    if family in ("restart-in-pod", "restart-new-pod"):
        owner = f"{name}-7d9f5"
        t0 = begin + float(rng.uniform(0.0, 1.0)) * HOUR
        runs_: list[Run] = []
        owners: list[tuple[str, str, str, float, float]] = []
        pod_same = f"ml/{owner}-x2k4p"
        while t0 < END:
            span = float(rng.uniform(1.5, 3.0))
            load = float(rng.uniform(5.0, 10.0)) * 60.0
            level = float(rng.uniform(2000.0, 12000.0))
            rate = (GPU_MIB - level) / (span - load / HOUR)
            stop = min(t0 + span * HOUR, END)
            t = grid(t0, stop)
            x = t - t0
            clean = 300.0 + (level - 300.0) * np.clip(x / load, 0.0, 1.0)
            clean = clean + rate * np.maximum(x - load, 0.0) / HOUR
            if family == "restart-in-pod":
                pod = pod_same
            else:
                pod = f"ml/{owner}-{''.join(rng.choice(list('bcdfghjklmnpqrstvwxz2456789'), 5))}"
            runs_.append(Run(node, "0", pod, None, t, noisy(clean)))
            owners.append((pod, "ReplicaSet", owner, t0, stop))
            t0 = stop + 60.0
        subject = f"workload/ml/ReplicaSet/{owner}"
        if family == "restart-in-pod":
            owners = [(pod_same, "ReplicaSet", owner, begin, END)]
            # the pod holds the GPU throughout: one series, the container's runs in it
            t = np.concatenate([r.times for r in runs_])
            v = np.concatenate([r.used for r in runs_])
            runs_ = [Run(node, "0", pod_same, None, t, v)]
        return ShapeCase(name, ShapeTruth(family, True, subject), tuple(runs_), (), tuple(owners))
    raise ValueError(family)


def shape_moving_corpus(seed: int, per_family: int = 8) -> list[ShapeCase]:
    out = []
    for family in MOVING_FAMILIES:
        for i in range(per_family):
            out.append(moving_case(family, family_rng(seed, family, i), f"{family}-{seed}-{i}", i))
    return out


def _labels(node: str, gpu: str, pod: str, uid: str | None) -> str:
    text = f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",Hostname="{node}",modelName="{MODEL}"'
    if pod:
        ns, _, name = pod.partition("/")
        text += f',namespace="{ns}",pod="{name}",container="main"'
        if uid is not None:
            text += f',pod_uid="{uid}"'
    return text


def write_shapes(cases: Sequence[ShapeCase], out: TextIO) -> None:
    """The cases as dcgm-exporter writes them (internal/pkg/transformation/kubernetes.go,
    ``PodMapper.Process``; process_metrics.go for per-process series): ``FB_USED`` per run; on a
    time-sliced GPU the device-level series (no pod labels) beside each pod's own, and
    ``FB_FREE`` copied onto each pod's series (no ``pod_uid`` without
    ``--kubernetes-enable-pod-uid``); ``kube_pod_owner`` from kube-state-metrics."""
    used_lines: list[str] = []
    free_lines: list[str] = []
    for case in cases:
        device = {(n, g): (t, v) for n, g, t, v in case.device}
        for run in case.runs:
            labels = _labels(run.node, run.gpu, run.pod, run.uid)
            used_lines += [
                f"DCGM_FI_DEV_FB_USED{{{labels}}} {v:.0f} {int(t)}\n"
                for t, v in zip(run.times, run.used, strict=True)
            ]
            if run.own:
                dt, dv = device[(run.node, run.gpu)]
                flabels = _labels(run.node, run.gpu, run.pod, None)
                free_lines += [
                    f"DCGM_FI_DEV_FB_FREE{{{flabels}}} {GPU_MIB - v:.0f} {int(t)}\n"
                    for t, v in zip(dt, dv, strict=True)
                ]
            else:
                free_lines += [
                    f"DCGM_FI_DEV_FB_FREE{{{labels}}} {GPU_MIB - v:.0f} {int(t)}\n"
                    for t, v in zip(run.times, run.used, strict=True)
                ]
        for n, g, t, v in case.device:
            labels = _labels(n, g, "", None)
            used_lines += [
                f"DCGM_FI_DEV_FB_USED{{{labels}}} {x:.0f} {int(s)}\n"
                for s, x in zip(t, v, strict=True)
            ]
    out.write("# TYPE DCGM_FI_DEV_FB_USED gauge\n")
    out.writelines(used_lines)
    out.write("# TYPE DCGM_FI_DEV_FB_FREE gauge\n")
    out.writelines(free_lines)
    write_owners(cases, out)
    out.write("# EOF\n")
