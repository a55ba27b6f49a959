"""Benchmark: the packing limit — an upper bound on GPU allocation at 100% arrived demand.

Protocol (issue 4): take the pods of the fill protocol that have arrived when their GPU demand
reaches 100% of the cluster's GPUs (the same sampling and seeds as the simulator); place every
whole-GPU pod; then pack the GPU-sharing pods into the remaining GPUs by a linear program over
the ways sharing pods can fill one GPU (a multiset of sizes summing to at most 1000 milli),
ignoring node shapes and CPU. The LP (the configuration LP of bin packing, relaxed) is solved
by column generation: a master LP over the patterns found so far (HiGHS via ``linprog``) and a
bounded-knapsack pricing step that adds the pattern with the best reduced value.

    limit = (whole-GPU demand + LP packed share) / cluster GPUs

    .venv/bin/python -m bench.bench_packing_limit [--shared ../shared] [--traces default ...]
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import linprog

from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.sim.fill import PAPER_SEEDS, sample_workload
from defrag.sim.trace import load_nodes, load_pods

TRACES = ("default", "gpushare40", "multigpu20", "gpuspec10", "cpu050")


def arrived_at_100(trace: Sequence[Pod], capacity_gpus: int, seed: int) -> list[Pod]:
    """The fill protocol's arrivals until their GPU demand reaches the cluster's GPUs."""
    arrived: list[Pod] = []
    demand = 0
    for pod in sample_workload(trace, capacity_gpus, seed):
        if demand + pod.gpu_demand_milli > capacity_gpus * GPU_MILLI:
            break
        demand += pod.gpu_demand_milli
        arrived.append(pod)
    return arrived


def pack_shares(sizes: Counter[int], gpus: float, tol: float = 1e-9) -> float:
    """Max milli-GPU of sharing pods (``sizes``: milli → count) packed into ``gpus`` GPUs."""
    if gpus <= 0 or not sizes:
        return 0.0
    kinds = sorted(sizes)
    counts = np.array([sizes[m] for m in kinds], dtype=np.float64)
    patterns: list[np.ndarray] = [np.eye(len(kinds), dtype=np.int64)[i] for i in range(len(kinds))]
    for _ in range(500):
        a = np.array(patterns, dtype=np.float64).T  # [kinds, patterns]
        value = np.array(kinds, dtype=np.float64) @ a
        a_ub = np.vstack([np.ones((1, a.shape[1])), a])
        b_ub = np.concatenate([[gpus], counts])
        res = linprog(-value, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"packing LP failed: {res.message}")
        duals = -np.asarray(res.ineqlin.marginals)
        y_gpu, y_kind = float(duals[0]), duals[1:]
        best, pattern = _price(kinds, counts, y_kind)
        if best - y_gpu <= tol:
            return float(-res.fun)
        patterns.append(pattern)
    raise RuntimeError("packing LP: column generation did not converge")


def _price(kinds: list[int], counts: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Bounded knapsack: the pattern (sizes summing ≤ 1000) with the most Σ (size − dual)."""
    unit = int(np.gcd.reduce(np.array([*kinds, GPU_MILLI])))
    cap = GPU_MILLI // unit
    best = np.zeros(cap + 1)
    take = np.zeros((cap + 1, len(kinds)), dtype=np.int64)
    for i, m in enumerate(kinds):
        gain = m - y[i]
        if gain <= 0:
            continue
        w = m // unit
        limit = int(min(counts[i], cap // w))
        for _ in range(limit):  # one more copy of item i at a time (0/1 knapsack per copy)
            for c in range(cap, w - 1, -1):
                if best[c - w] + gain > best[c] + 1e-12:
                    best[c] = best[c - w] + gain
                    take[c] = take[c - w]
                    take[c, i] += 1
    c = int(np.argmax(best))
    return float(best[c]), take[c].copy()


def packing_limit(arrived: Sequence[Pod], capacity_gpus: int) -> float:
    """The limit as a % of the cluster's GPUs (allocated share / capacity)."""
    whole = sum(p.num_gpu for p in arrived if p.num_gpu and p.gpu_milli >= GPU_MILLI)
    whole = min(whole, capacity_gpus)
    shares = Counter(p.gpu_milli for p in arrived if p.num_gpu and p.gpu_milli < GPU_MILLI)
    packed = pack_shares(shares, capacity_gpus - whole)
    return 100.0 * (whole * GPU_MILLI + packed) / (capacity_gpus * GPU_MILLI)


def trace_limits(shared: Path, trace: str, seeds: Sequence[int] = PAPER_SEEDS) -> list[float]:
    data = shared / "data" / "openb"
    nodes = load_nodes(data / "openb_node_list_gpu_node.csv")
    capacity = sum(n.num_gpu for n in nodes)
    pods = load_pods(data / f"openb_pod_list_{trace}.csv").pods
    return [packing_limit(arrived_at_100(pods, capacity, seed), capacity) for seed in seeds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared"
    )
    parser.add_argument("--traces", nargs="*", default=list(TRACES))
    args = parser.parse_args()
    print("| trace | median limit % | min | max | seeds |")
    print("|---|---|---|---|---|")
    for trace in args.traces:
        limits = trace_limits(args.shared, trace)
        print(
            f"| {trace} | {statistics.median(limits):.2f} | {min(limits):.2f} "
            f"| {max(limits):.2f} | {len(limits)} |"
        )


if __name__ == "__main__":
    main()
