"""Benchmark: score every node of the openb cluster (1,213 nodes) for one pod, per policy.

Target (issue 2): median ≤ 1 ms per pod under every policy but fgd, ≤ 5 ms under fgd.
The cluster is first filled to about 70% GPU allocation with trace pods (fgd placing them) so
that scores see a realistic mix of free, partly used and full nodes; then 500 trace pods are
scheduled (scored, selected, GPU chosen) without being placed.

    .venv/bin/python -m bench.bench_scoring [--data ../shared/data] [--pods 500]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from bench import data
from defrag.model import Cluster, WorkloadMix
from defrag.scoring.framework import Placement
from defrag.scoring.policies import POLICY_NAMES, make_policy
from defrag.scoring.scheduler import schedule
from defrag.sim.trace import load_nodes, load_pods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, default=data.DEFAULT, help="$DEFRAG_DATA_DIR, else ../shared/data"
    )
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--fill", type=float, default=0.70)
    args = parser.parse_args()
    root = data.require(args.data, data.trace_files(["default"]))
    nodes = load_nodes(root / data.NODES)
    pods = list(load_pods(root / data.pods("default")).pods)
    mix = WorkloadMix.from_pods(pods)
    arrays = Cluster.build(nodes).arrays.copy()
    rng = np.random.default_rng(42)
    capacity = int(arrays.gpu_total.sum()) * 1000
    filler = make_policy("fgd", mix=mix)
    for i in rng.permutation(len(pods)):
        if 1 - arrays.free_share().sum() / capacity >= args.fill:
            break
        placement = schedule(pods[i], arrays, filler)
        if isinstance(placement, Placement):
            arrays.allocate(placement.row, pods[i], placement.gpus)
    allocation = 100 * (1 - arrays.free_share().sum() / capacity)
    sample = [pods[i] for i in rng.choice(len(pods), size=args.pods, replace=False)]
    print(
        f"openb: {len(arrays)} nodes, {arrays.gpu_total.sum()} GPUs, {allocation:.1f}% allocated;"
    )
    print(f"{args.pods} trace pods scheduled per policy (score all nodes + select + GPU choice)\n")
    print("| policy | median ms | p90 ms | p99 ms | target |")
    print("|---|---|---|---|---|")
    for name in POLICY_NAMES:
        policy = make_policy(name, mix=mix, seed=1)
        times = []
        for pod in sample:
            start = time.perf_counter()
            schedule(pod, arrays, policy)
            times.append(time.perf_counter() - start)
        ms = np.array(times) * 1e3
        target = 5.0 if name == "fgd" else 1.0
        verdict = "ok" if np.median(ms) <= target else "MISSED"
        print(
            f"| {name} | {np.median(ms):.3f} | {np.percentile(ms, 90):.3f} | "
            f"{np.percentile(ms, 99):.3f} | ≤ {target:g} ms {verdict} |"
        )


if __name__ == "__main__":
    main()
