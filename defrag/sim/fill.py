"""The arrival-only fill protocol of the FGD paper (ATC'23), as the shared data README states.

1. The cluster is a node list; CPU and GPU are checked, memory is ignored (pods ask 0 MiB).
2. Pods are sampled from the trace with replacement until their total GPU demand reaches
   ``ratio`` (130%) of the cluster's GPUs, then shuffled, both with the run's seed.
3. Pods arrive in that order and never leave; a pod that fits nowhere is counted as failed
   (after the defragmentation hook, if any, had its chance) and the fill goes on.
4. Node order: like the paper's simulator, which prefixes every node name with a seeded random
   permutation, ties between equal scores go to a node order shuffled with the run's seed
   (``shuffle_nodes=False`` keeps the trace's names).
5. After each arrival the GPU allocation and the FGD fragmentation are logged against the
   arrived GPU demand. The curve's point at k% is the mean of the records whose arrived
   demand rounds to k% (so the point at 0% is about 0.25% when every pod fits).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from defrag.model.resources import Node, Pod
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.scoring.framework import Placement
from defrag.scoring.profile import ProfileConfig
from defrag.scoring.scheduler import schedule
from defrag.sim.hooks import DefragHook
from defrag.sim.state import SimState
from defrag.sim.tracker import FragTracker, capacity_milli

FILL_RATIO = 1.3
PAPER_SEEDS = tuple(range(42, 52))
HEADLINE_PERCENT = 100

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class FillCurve:
    """Per arrived-demand percentage 0..max: allocation, fragmentation (% of all GPUs) and
    fragmentation as % of idle GPUs."""

    percent: tuple[int, ...]
    allocation: tuple[float, ...]
    frag: tuple[float, ...]
    frag_ratio: tuple[float, ...]

    def at(self, percent: int) -> tuple[float, float, float]:
        i = self.percent.index(percent)
        return self.allocation[i], self.frag[i], self.frag_ratio[i]


@dataclass(frozen=True, slots=True)
class FillRun:
    policy: str
    seed: int
    pods: int
    """Pods that arrived (the whole sample)."""
    failed_pods: int
    """Pods that fit nowhere, over the whole fill."""
    failed_at_100: int
    """Pods that fit nowhere before the arrived demand passed 100%."""
    migrations: int
    allocation_at_100: float
    frag_at_100: float
    frag_ratio_at_100: float
    curve: FillCurve
    seconds: float
    defrag: bool = False
    """Whether the defragmentation hook ran."""

    @property
    def label(self) -> str:
        return f"{self.policy}+defrag" if self.defrag else self.policy

    def to_dict(self, *, curve: bool = False) -> dict[str, object]:
        out: dict[str, object] = {
            "policy": self.policy,
            "defrag": self.defrag,
            "seed": self.seed,
            "pods": self.pods,
            "allocation_at_100": round(self.allocation_at_100, 3),
            "frag_at_100": round(self.frag_at_100, 3),
            "frag_ratio_at_100": round(self.frag_ratio_at_100, 3),
            "failed_pods": self.failed_pods,
            "failed_at_100": self.failed_at_100,
            "migrations": self.migrations,
            "seconds": round(self.seconds, 2),
        }
        if curve:
            out["curve"] = {
                "percent": list(self.curve.percent),
                "allocation": [round(v, 3) for v in self.curve.allocation],
                "frag": [round(v, 3) for v in self.curve.frag],
                "frag_ratio": [round(v, 3) for v in self.curve.frag_ratio],
            }
        return out


def sample_workload(
    pods: Sequence[Pod], capacity_gpus: int, seed: int, ratio: float = FILL_RATIO
) -> tuple[Pod, ...]:
    """Pods drawn with replacement until their GPU demand reaches ``ratio`` × the cluster's
    GPUs (the pod that crosses the line included), shuffled, renamed ``<name>-<arrival #>``."""
    demand = np.array([p.gpu_demand_milli for p in pods], dtype=np.int64)
    if len(pods) == 0 or demand.sum() == 0:
        raise ValueError("the trace has no pod that asks for a GPU; nothing to fill with")
    target = ratio * capacity_gpus * GPU_MILLI
    rng = np.random.default_rng(seed)
    drawn: list[np.ndarray] = []
    total = 0
    while total < target:
        batch = rng.integers(0, len(pods), size=max(len(pods), 1024))
        cum = total + np.cumsum(demand[batch])
        stop = int(np.searchsorted(cum, target, side="left"))
        if stop < len(batch):
            drawn.append(batch[: stop + 1])
            total = int(cum[stop])
        else:
            drawn.append(batch)
            total = int(cum[-1])
    order = rng.permutation(np.concatenate(drawn))
    width = len(str(len(order)))
    return tuple(
        replace(pods[int(i)], name=f"{pods[int(i)].name}-{k:0{width}d}")
        for k, i in enumerate(order)
    )


def shuffled_node_order(nodes: Sequence[Node], seed: int) -> list[Node]:
    """The nodes renamed ``<k>-<name>`` with k a seeded random permutation, as the paper's
    simulator does: rows (sorted by name) then follow a random order fixed for the run."""
    perm = np.random.default_rng([seed, 1]).permutation(len(nodes))
    width = len(str(max(len(nodes) - 1, 0)))
    return [
        replace(n, name=f"{int(k):0{width}d}-{n.name}") for n, k in zip(nodes, perm, strict=True)
    ]


def run_fill(
    nodes: Sequence[Node],
    trace_pods: Sequence[Pod],
    policy: str,
    seed: int,
    *,
    mix: WorkloadMix | None = None,
    hook: DefragHook | None = None,
    ratio: float = FILL_RATIO,
    shuffle_nodes: bool = True,
    progress: Progress | None = None,
) -> FillRun:
    """One fill of ``nodes`` with pods sampled from ``trace_pods`` under ``policy``.

    ``mix`` (the FGD workload mix) defaults to ``WorkloadMix.from_pods(trace_pods)``.
    """
    mix = mix if mix is not None else WorkloadMix.from_pods(trace_pods)
    capacity_gpus = sum(n.num_gpu for n in nodes)
    if capacity_gpus == 0:
        raise ValueError("the cluster has no GPU")
    arrivals = sample_workload(trace_pods, capacity_gpus, seed, ratio)
    if shuffle_nodes:
        nodes = shuffled_node_order(nodes, seed)
    return fill(
        nodes, arrivals, policy, seed, mix=mix, hook=hook, top=round(ratio * 100), progress=progress
    )


def fill(
    nodes: Sequence[Node],
    arrivals: Sequence[Pod],
    policy: str,
    seed: int = 0,
    *,
    mix: WorkloadMix | None = None,
    hook: DefragHook | None = None,
    top: int = 130,
    progress: Progress | None = None,
) -> FillRun:
    """Steps 3–5 of the protocol: ``arrivals`` in order (memory ignored), never leaving.

    ``top`` is the last arrived-demand percentage of the curve.
    """
    started = time.perf_counter()
    mix = mix if mix is not None else WorkloadMix.from_pods(arrivals)
    # The run's profile: the policy with the run's seed (random draws from it), scoring
    # against the simulated workload's mix.
    profile = ProfileConfig(policy, seed).with_mix(mix)
    state = SimState.new(nodes, profile.policy, profile.name, profile.mix)
    capacity = capacity_milli(state.arrays)
    if capacity == 0:
        raise ValueError("the cluster has no GPU")
    arrivals = [replace(p, memory_mib=0) for p in arrivals]
    tracker = FragTracker(state.arrays, mix)
    n = len(arrivals)
    arrived = np.zeros(n)
    allocated = np.zeros(n)
    frag = np.zeros(n)
    idle = np.zeros(n)
    failed = failed_at_100 = 0
    arrived_milli = allocated_milli = 0
    for i, pod in enumerate(arrivals):
        arrived_milli += pod.gpu_demand_milli
        result = schedule(pod, state.arrays, state.policy)
        if not isinstance(result, Placement) and hook is not None:
            moves = hook.on_unschedulable(state, pod, float(i))
            if moves:
                state.apply_moves(moves)
                tracker.update([r for m in moves for r in (m.source_row, m.target_row)])
                result = schedule(pod, state.arrays, state.policy)
        if isinstance(result, Placement):
            state.place(pod, result.row, result.gpus, float(i))
            tracker.update((result.row,))
            allocated_milli += pod.gpu_demand_milli
        else:
            failed += 1
            if arrived_milli <= capacity:
                failed_at_100 += 1
        arrived[i], allocated[i] = arrived_milli, allocated_milli
        frag[i], idle[i] = tracker.total, capacity - allocated_milli
        if progress is not None and (i % 256 == 255 or i == n - 1):
            progress(i + 1, n)
    curve = bucket_curve(arrived, allocated, frag, idle, capacity, top)
    alloc100, frag100, ratio100 = curve.at(HEADLINE_PERCENT)
    return FillRun(
        policy=policy,
        seed=seed,
        pods=n,
        failed_pods=failed,
        failed_at_100=failed_at_100,
        migrations=state.migrations,
        allocation_at_100=alloc100,
        frag_at_100=frag100,
        frag_ratio_at_100=ratio100,
        curve=curve,
        seconds=time.perf_counter() - started,
        defrag=hook is not None,
    )


def bucket_curve(
    arrived: np.ndarray,
    allocated: np.ndarray,
    frag: np.ndarray,
    idle: np.ndarray,
    capacity: int,
    top: int,
) -> FillCurve:
    """Means of the per-arrival records grouped by arrived demand rounded to a whole percent.

    Percentages no record rounds to (a small cluster, a big pod) are interpolated linearly.
    """
    pct = np.rint(arrived * 100.0 / capacity).astype(np.int64)
    alloc = allocated * 100.0 / capacity
    frag_all = frag * 100.0 / capacity
    frag_idle = np.divide(frag * 100.0, idle, out=np.zeros_like(frag), where=idle > 0)
    grid = np.arange(top + 1)
    keep = pct <= top
    counts = np.bincount(pct[keep], minlength=top + 1).astype(np.float64)
    seen = counts > 0

    def mean(values: np.ndarray) -> tuple[float, ...]:
        sums = np.bincount(pct[keep], weights=values[keep], minlength=top + 1)
        means = np.divide(sums, counts, out=np.zeros(top + 1), where=seen)
        if seen.any() and not seen.all():
            means = np.interp(grid, grid[seen], means[seen])
        return tuple(float(v) for v in means)

    return FillCurve(tuple(int(g) for g in grid), mean(alloc), mean(frag_all), mean(frag_idle))
