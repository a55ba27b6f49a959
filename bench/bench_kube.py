"""Snapshot of a large emulated cluster through the real client: list (paged) + convert.

Run: ``.venv/bin/python -m bench.bench_kube [--nodes 5000] [--pods 40000] [--plan]``

The emulated API server runs in another process. Prints a table: the listing alone (HTTP +
``json.loads``), the conversion to the model (the difference), and the whole
``KubeClusterSource.snapshot()`` (wall clock, and the client process's CPU time, which a busy
machine inflates less), for a few page sizes; ``--plan`` also times one
``make_plan(cluster, "all")`` on the result. Target (issue 6): snapshot + planning ≤ 10 s for
5,000 nodes and 40,000 pods.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from datetime import UTC, datetime
from typing import Any

from defrag.adapters.kube import KubeClusterSource, RetryPolicy
from defrag.adapters.kube_convert import paused_gc
from defrag.model.cluster import Cluster
from tests.support import kubeobjects as k
from tests.support.kubeapi import client_for, serve_in_subprocess

# GPU sizes of the pods on one 8-GPU node (0 = a CPU-only pod); each pattern sums to ≤ 8.
PATTERNS = (
    (4, 2, 1, 0, 0, 0, 0, 0),
    (2, 2, 1, 1, 1, 0, 0, 0),
    (1, 1, 1, 1, 1, 1, 1, 0),
    (4, 4, 0, 0, 0, 0, 0, 0),
    (8, 0, 0, 0, 0, 0, 0, 0),
    (2, 1, 0, 0, 0, 0, 0, 0),
)


def cluster_objects(
    nodes: int, pods: int, seed: int = 7, pending: int | None = None
) -> list[dict[str, Any]]:
    """``nodes`` 8-GPU nodes and ``pods`` pods (8 per node bound, the rest Pending), a PDB per
    namespace and two PriorityClasses, all real-shaped. ``pending``: at most that many Pending;
    the pods past them are CPU-only pods bound round the nodes (a fleet's daemons and
    services: 200,000 pods on 20,000 nodes are not 40,000 GPU jobs waiting)."""
    rng = random.Random(seed)
    items: list[dict[str, Any]] = [
        k.priority_class("training-high", 1000),
        k.priority_class("batch-low", 10, global_default=True),
    ]
    namespaces = [f"team-{i:02d}" for i in range(40)]
    count = 0
    for n in range(nodes):
        name = f"gpu-{n:05d}"
        items.append(k.node(name, nvlink="0-3,4-7" if n % 2 else None))
        for size in rng.choice(PATTERNS):
            if count >= pods:
                break
            ns = namespaces[count % len(namespaces)]
            items.append(
                k.pod(
                    f"w-{count:06d}",
                    ns,
                    size,
                    node_name=name,
                    cpu="2",
                    memory="8Gi",
                    labels={"job-name": f"job-{count // 4:06d}"} if size else None,
                )
            )
            count += 1
    waiting = pods - count if pending is None else min(pending, pods - count)
    for i in range(pods - count - waiting):
        ns = namespaces[count % len(namespaces)]
        node = f"gpu-{i % nodes:05d}"
        items.append(k.pod(f"w-{count:06d}", ns, 0, node_name=node, cpu="1", memory="2Gi"))
        count += 1
    while count < pods:
        ns = namespaces[count % len(namespaces)]
        items.append(k.pod(f"w-{count:06d}", ns, rng.choice((1, 2, 4, 8)), priority=1000))
        count += 1
    items += [k.pdb("serve", ns, match_labels={"app": "serve"}) for ns in namespaces]
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=40000)
    parser.add_argument("--page-sizes", default="500,5000")
    parser.add_argument("--plan", action="store_true", help="also time make_plan on the result")
    args = parser.parse_args()

    t0 = time.perf_counter()
    url, stop = serve_in_subprocess(cluster_objects(args.nodes, args.pods))
    print(
        f"emulated cluster: {args.nodes} nodes, {args.pods} pods, served by another process "
        f"(set up in {time.perf_counter() - t0:.1f} s)\n"
    )
    retry = RetryPolicy(attempts=1, timeout_s=120)
    rows = []
    cluster: Cluster | None = None
    try:
        for page_size in (int(p) for p in args.page_sizes.split(",")):
            source = KubeClusterSource(client_for(url), page_size=page_size, retry=retry)
            source.snapshot()  # warm up: the client builds its validators on first use
            t = time.perf_counter()
            with paused_gc():  # as snapshot() does
                for kind, lister, kwargs in source.listings():
                    source._collect(kind, lister, kwargs, convert=False)
            t_list = time.perf_counter() - t
            t, cpu = time.perf_counter(), time.process_time()
            cluster = source.snapshot()
            t_snapshot = time.perf_counter() - t
            cpu_snapshot = time.process_time() - cpu
            t_convert = t_snapshot - t_list
            rows.append((page_size, t_list, t_convert, t_snapshot, cpu_snapshot))
    finally:
        stop()

    print(
        f"{'page size':>9} {'list+json s':>11} {'convert s':>9} {'snapshot s':>10} "
        f"{'client CPU s':>12}"
    )
    for page_size, t_list, t_convert, t_snapshot, cpu_snapshot in rows:
        print(
            f"{page_size:>9} {t_list:>11.2f} {t_convert:>9.2f} {t_snapshot:>10.2f} "
            f"{cpu_snapshot:>12.2f}"
        )
    print(f"(load average while running: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    assert cluster is not None
    print(
        f"\nsnapshot: {len(cluster.nodes)} nodes, {len(cluster.pods)} pods, "
        f"{int(cluster.arrays.free_whole_count().sum())} free GPUs"
    )
    if args.plan:
        from bench.bench_plan import FIGURES_CONSTRAINTS
        from defrag.plan.planner import make_plan

        t = time.perf_counter()
        plan = make_plan(
            cluster,
            "all",
            now=datetime(2026, 11, 29, 12, tzinfo=UTC),
            constraints=FIGURES_CONSTRAINTS,
        )
        print(f"make_plan(all): {time.perf_counter() - t:.2f} s, {len(plan.steps)} steps")


if __name__ == "__main__":
    main()
