"""Latency of the extender's ``prioritize`` in node-cache-capable mode (``nodenames``).

Target (issue 8): p99 ≤ 10 ms per call for 1,000 nodes. Measured two ways: over HTTP on one
keep-alive connection (what kube-scheduler sees, minus the network), and the handler alone
(parse + prioritize, no socket).

    .venv/bin/python -m bench.bench_extender [--nodes 1000] [--calls 2000] [--policy NAME]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import threading
import time

import numpy as np

from defrag.extender import ClusterCache, Extender, parse_args, serve, stop
from defrag.model.cluster import Cluster
from defrag.model.resources import Node, Pod


class _Static:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def snapshot(self) -> Cluster:
        return self.cluster


def make_cluster(n_nodes: int, seed: int = 0) -> Cluster:
    """8-GPU nodes (some with two 4-GPU NVLink islands), each partly filled with 1–4 GPU pods."""
    rng = random.Random(seed)
    nodes, pods = [], []
    for i in range(n_nodes):
        domains = ((0, 1, 2, 3), (4, 5, 6, 7)) if i % 4 == 0 else ()
        nodes.append(
            Node(f"gpu-{i:05d}", 96_000, 1_024_000, 8, "A100", 81_920, nvlink_domains=domains)
        )
        used = 0
        for j in range(rng.randint(0, 3)):
            size = rng.choice((1, 1, 2, 4))
            if used + size > 8:
                break
            pods.append(
                Pod(
                    f"p-{i}-{j}",
                    num_gpu=size,
                    cpu_milli=4000,
                    memory_mib=16_000,
                    node=f"gpu-{i:05d}",
                    phase="Running",
                    gpu_indices=tuple(range(used, used + size)),
                )
            )
            used += size
    return Cluster.build(nodes, pods)


def request_body(names: list[str], gpus: int) -> bytes:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bench", "namespace": "default", "uid": "u-1"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "resources": {
                        "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": str(gpus)},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ]
        },
        "status": {"phase": "Pending"},
    }
    return json.dumps({"pod": pod, "nodenames": names}).encode()


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    arr = np.array(samples) * 1000.0
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99)), float(arr.max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--policy", default="reserve-binpack")
    opts = parser.parse_args()

    cluster = make_cluster(opts.nodes)
    names = list(cluster.arrays.names)
    bodies = [request_body(names, g) for g in (1, 2, 4, 8)]

    cache = ClusterCache(_Static(cluster), opts.policy)
    assert cache.refresh().ok
    ext = Extender(cache)
    direct: list[float] = []
    for i in range(opts.calls):
        body = bodies[i % len(bodies)]
        t0 = time.perf_counter()
        ext.prioritize(parse_args(body))
        direct.append(time.perf_counter() - t0)

    srv = serve(_Static(cluster), policy=opts.policy, host="127.0.0.1", port=0)
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=10)
    over_http: list[float] = []
    try:
        for i in range(opts.calls):
            body = bodies[i % len(bodies)]
            t0 = time.perf_counter()
            conn.request("POST", "/prioritize", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            payload = resp.read()
            over_http.append(time.perf_counter() - t0)
            if resp.status != 200:
                raise SystemExit(f"HTTP {resp.status}: {payload[:200]!r}")
    finally:
        srv.shutdown()
        stop(srv)

    print(
        f"prioritize, nodenames mode, {opts.nodes} nodes, policy {opts.policy}, "
        f"{opts.calls} calls (pods of 1/2/4/8 GPUs in turn)"
    )
    print(f"{'path':<22}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for label, samples in (("handler only", direct), ("HTTP keep-alive", over_http)):
        p50, p99, worst = percentiles(samples)
        print(f"{label:<22}{p50:>10.2f}{p99:>10.2f}{worst:>10.2f}")
    p99_http = percentiles(over_http)[1]
    print(f"target p99 ≤ 10 ms over HTTP: {'met' if p99_http <= 10 else 'MISSED'}")


if __name__ == "__main__":
    main()
