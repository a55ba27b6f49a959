"""Benchmark: upper bounds on GPU allocation at 100% arrived demand (fill protocol).

Offline limit (issue 4): take the pods of the fill protocol that have arrived when their GPU
demand reaches 100% of the cluster's GPUs (the same sampling and seeds as the simulator);
place every whole-GPU pod; then pack the GPU-sharing pods into the remaining GPUs by a linear
program over the ways sharing pods can fill one GPU (a multiset of sizes summing to at most
1000 milli), ignoring node shapes and CPU. Solved by column generation
(:func:`defrag.sim.limits.pack_shares`).

    offline = (whole-GPU demand + LP packed share) / cluster GPUs

Online limits (:func:`defrag.sim.limits.online_limit`): the same arrivals in the protocol's
order, node shapes and CPU ignored, with a perfect and free defragmenter — a pod is placed iff
the running pods plus it can be re-packed into the GPUs. ``online LP`` judges "can be
re-packed" by the LP relaxation (optimistic), ``online FFD`` by first-fit decreasing (a re-pack
one could carry out). No migration budget applies to either.

    .venv/bin/python -m bench.bench_packing_limit [--data ../shared/data] [--traces default ...]
        [--seeds 10] [--jobs 2]

~35 s per trace and seed on one core (the online LP re-solves the LP for every arrival that
the current packing cannot take).
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench import data
from defrag.model.resources import Node, Pod
from defrag.model.units import GPU_MILLI
from defrag.sim.fill import PAPER_SEEDS, sample_workload
from defrag.sim.limits import online_limit, packing_limit
from defrag.sim.trace import load_nodes, load_pods

TRACES = ("default", "gpushare40", "multigpu20", "gpuspec10", "cpu050")


def arrived_at_100(arrivals: Sequence[Pod], capacity_gpus: int) -> list[Pod]:
    """The fill protocol's arrivals until their GPU demand reaches the cluster's GPUs."""
    arrived: list[Pod] = []
    demand = 0
    for pod in arrivals:
        if demand + pod.gpu_demand_milli > capacity_gpus * GPU_MILLI:
            break
        demand += pod.gpu_demand_milli
        arrived.append(pod)
    return arrived


@functools.lru_cache(maxsize=4)
def load_trace(root: Path, trace: str) -> tuple[tuple[Node, ...], tuple[Pod, ...]]:
    """The openb GPU node list and the pods of ``trace`` under the data dir ``root`` (cached per
    process)."""
    data.require(root, data.trace_files([trace]))
    nodes = tuple(load_nodes(root / data.NODES))
    return nodes, load_pods(root / data.pods(trace)).pods


def seed_limits(
    shared: Path, trace: str, seed: int, online: bool = True
) -> tuple[float, float, float]:
    """(offline, online LP, online FFD) for one trace and seed; ``online=False`` skips the two
    online limits (NaN), the slow part — ``--no-online``, for a quick run."""
    nodes, pods = load_trace(shared, trace)
    capacity = sum(n.num_gpu for n in nodes)
    arrivals = sample_workload(pods, capacity, seed)
    offline = packing_limit(arrived_at_100(arrivals, capacity), capacity)
    if not online:
        return offline, math.nan, math.nan
    lp = online_limit(arrivals, capacity, "lp").allocation_at_100
    ffd = online_limit(arrivals, capacity, "ffd").allocation_at_100
    return offline, lp, ffd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data.add_data_option(parser)
    parser.add_argument("--traces", nargs="*", default=list(TRACES))
    parser.add_argument("--seeds", type=int, default=len(PAPER_SEEDS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--no-online", dest="online", action="store_false", help="the offline limit only"
    )
    args = parser.parse_args()
    data.require(args.data, data.trace_files(args.traces))
    seeds = PAPER_SEEDS[: args.seeds]
    print(
        "| trace | seeds | offline limit % (min–max) | online LP % (min–max) "
        "| online FFD % (min–max) |"
    )
    print("|---|---|---|---|---|")
    with ProcessPoolExecutor(args.jobs) as pool:
        for trace in args.traces:
            rows = list(
                pool.map(
                    seed_limits,
                    [args.data] * len(seeds),
                    [trace] * len(seeds),
                    seeds,
                    [args.online] * len(seeds),
                )
            )
            cells = []
            for k in range(3):
                v = [r[k] for r in rows]
                cells.append(f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})")
            print(f"| {trace} | {len(seeds)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
