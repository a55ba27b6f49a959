"""Benchmark: how long ``make_plan`` takes on big clusters (issue 4 targets).

1. openb (1,213 nodes, 6,212 GPUs) filled to 90% GPU allocation with trace pods (sampled with
   replacement, placed by the default policy), plus 5 pending 8-GPU jobs; target ≤ 2 s.
2. A synthetic 10,000-node, 80,000-GPU cluster (8 GPUs per node, 1/2/4-GPU and GPU-sharing
   pods, ~71% allocated), plus 20 pending 8-GPU jobs; target ≤ 20 s and peak memory ≤ 2 GiB.

Each plan is goal ``all`` (make-room, then repack) with a budget of 50 evictions. Time is the
wall time of ``make_plan`` alone (the snapshot is built first); memory is the process's peak
resident set, measured at the end.

    .venv/bin/python -m bench.bench_plan [--data ../shared/data] [--only openb|synthetic]
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from bench import data
from defrag.model.cluster import Cluster
from defrag.model.resources import Node, OwnerRef, Pod
from defrag.model.workload import WorkloadMix
from defrag.plan import Constraints, EvictionBudget, make_plan
from defrag.scoring.framework import Placement
from defrag.scoring.policies import DEFAULT_POLICY, make_policy
from defrag.scoring.profile import ProfileConfig
from defrag.scoring.scheduler import schedule
from defrag.sim.trace import load_nodes, load_pods

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def owned(pod: Pod, i: int, rng: np.random.Generator) -> Pod:
    """A trace pod as a controller-owned pod that has run for a while."""
    return replace(
        pod,
        owner=OwnerRef("ReplicaSet", f"rs-{i % 97}"),
        created_at=NOW - timedelta(hours=float(rng.uniform(0.5, 48))),
    )


def jobs(n: int) -> list[Pod]:
    return [
        Pod(f"train-{i}", namespace="research", num_gpu=8, cpu_milli=8000, priority=1000,
            owner=OwnerRef("Job", f"train-{i}"), created_at=NOW - timedelta(hours=2),
            pending_since=NOW - timedelta(hours=2))
        for i in range(n)
    ]  # fmt: skip


def openb_cluster(root: Path, target: float) -> Cluster:
    openb = data.require(root, data.trace_files(["default"])) / "openb"
    nodes = load_nodes(openb / "openb_node_list_gpu_node.csv")
    trace = [p for p in load_pods(openb / "openb_pod_list_default.csv").pods if p.num_gpu]
    arrays = Cluster.build(nodes).arrays.copy()
    policy = make_policy(DEFAULT_POLICY)
    capacity = int(arrays.gpu_total.sum()) * 1000
    rng = np.random.default_rng(42)
    placed: list[Pod] = []
    misses = 0
    while 1 - arrays.free_share().sum() / capacity < target and misses < 2000:
        k = len(placed)
        pod = owned(replace(trace[int(rng.integers(len(trace)))], name=f"pod-{k}"), k, rng)
        result = schedule(pod, arrays, policy)
        if not isinstance(result, Placement):
            misses += 1
            continue
        arrays.allocate(result.row, pod, result.gpus)
        placed.append(replace(pod, node=result.node, gpu_indices=result.gpus, phase="Running"))
    return Cluster.build(nodes, [*placed, *jobs(5)])


def synthetic_cluster(n_nodes: int, seed: int = 7) -> Cluster:
    rng = np.random.default_rng(seed)
    nodes = [
        Node(f"node-{i:05d}", cpu_milli=128_000, memory_mib=1_000_000, num_gpu=8, gpu_model="H100")
        for i in range(n_nodes)
    ]
    pods: list[Pod] = []
    for i, node in enumerate(nodes):
        slot = 0
        while slot < 8 and rng.random() < 0.93:
            kind = rng.choice(4, p=[0.45, 0.2, 0.1, 0.25])
            if kind == 3:  # two GPU-sharing pods on one GPU
                for j in range(2):
                    pods.append(
                        owned(Pod(f"s{i}-{slot}-{j}", num_gpu=1, gpu_milli=400, cpu_milli=2000,
                                  node=node.name, gpu_indices=(slot,), phase="Running"),
                              len(pods), rng)
                    )  # fmt: skip
                slot += 1
                continue
            size = (1, 2, 4)[kind]
            if slot + size > 8:
                break
            pods.append(
                owned(Pod(f"p{i}-{slot}", num_gpu=size, cpu_milli=4000 * size, node=node.name,
                          gpu_indices=tuple(range(slot, slot + size)), phase="Running"),
                      len(pods), rng)
            )  # fmt: skip
            slot += size
    return Cluster.build(nodes, [*pods, *jobs(20)])


FIGURES_CONSTRAINTS = Constraints(
    min_age=timedelta(minutes=10),
    budget=EvictionBudget(total=50, per_node=None, per_namespace=None),
)
"""The constraints docs/planning.md's figures were measured with (`defrag plan`'s defaults
before issue 23 made them the daemon's): 50 evictions, no per-node or per-namespace limit,
pods younger than 10 minutes stay."""


def measure(name: str, cluster: Cluster, target_s: float) -> None:
    a = cluster.arrays
    alloc = 100 * (1 - a.free_share().sum() / (a.gpu_total.sum() * 1000))
    mix = WorkloadMix.from_pods(p for p in cluster.pods.values() if p.num_gpu)
    start = time.perf_counter()
    plan = make_plan(
        cluster,
        "all",
        now=NOW,
        profile=ProfileConfig().with_mix(mix),
        constraints=FIGURES_CONSTRAINTS,
    )
    seconds = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"| {name} | {len(a)} | {int(a.gpu_total.sum())} | {alloc:.1f}% | {len(plan.steps)} "
        f"| {len(plan.targets)} | {seconds:.2f} | {target_s:g} | {peak_mib:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data.add_data_option(parser)
    parser.add_argument("--only", choices=("openb", "synthetic"))
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    print("| cluster | nodes | GPUs | allocated | steps | targets | plan s | target s | peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    if args.only in (None, "openb"):
        measure("openb 90%", openb_cluster(args.data, 0.90), 2.0)
    if args.only in (None, "synthetic"):
        measure(f"synthetic {args.nodes}", synthetic_cluster(args.nodes), 20.0)


if __name__ == "__main__":
    main()
