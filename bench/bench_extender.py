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
import multiprocessing
import multiprocessing.queues
import os
import random
import time

import numpy as np

from bench.forked import default_signals
from defrag.extender.server import serve, stop
from defrag.extender.state import ClusterCache
from defrag.extender.verbs import Extender
from defrag.extender.wire import parse_args
from defrag.model.cluster import Cluster
from defrag.model.resources import Node, Pod
from defrag.scoring.profile import ProfileConfig


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


def _serve(cluster: Cluster, policy: str, ready: multiprocessing.queues.Queue[int]) -> None:
    default_signals()
    srv = serve(_Static(cluster), profile=ProfileConfig(policy), host="127.0.0.1", port=0)
    ready.put(int(srv.server_address[1]))
    try:
        srv.serve_forever(0.5)
    finally:
        stop(srv)


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

    cache = ClusterCache(_Static(cluster), ProfileConfig(opts.policy))
    assert cache.refresh().ok
    ext = Extender(cache)
    direct: list[float] = []
    cpu: list[float] = []
    for i in range(opts.calls):
        body = bodies[i % len(bodies)]
        t0, c0 = time.perf_counter(), time.thread_time()
        args = parse_args(body)
        ext.prioritize_body(args)
        direct.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)

    # The server in its own process, as kube-scheduler and the extender are in a cluster.
    ctx = multiprocessing.get_context("fork")
    ready: multiprocessing.queues.Queue[int] = ctx.Queue()
    server = ctx.Process(target=_serve, args=(cluster, opts.policy, ready), daemon=True)
    server.start()
    port = ready.get(timeout=30)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
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
        server.terminate()
        server.join(timeout=5)

    print(
        f"prioritize, nodenames mode, {opts.nodes} nodes, policy {opts.policy}, "
        f"{opts.calls} calls (pods of 1/2/4/8 GPUs in turn)"
    )
    print(f"{'path':<22}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    rows = (
        ("handler CPU time", cpu),
        ("handler wall time", direct),
        ("HTTP keep-alive", over_http),
    )
    for label, samples in rows:
        p50, p99, worst = percentiles(samples)
        print(f"{label:<22}{p50:>10.2f}{p99:>10.2f}{worst:>10.2f}")
    p99_http = percentiles(over_http)[1]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"target p99 ≤ 10 ms over HTTP: {'met' if p99_http <= 10 else 'MISSED'} "
        f"(load average {load} on {os.cpu_count()} CPUs; wall times include waiting for a CPU)"
    )


if __name__ == "__main__":
    main()
