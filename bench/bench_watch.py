"""The extender's watched store at scale: its memory and the time to build a view from it.

Run: ``.venv/bin/python -m bench.bench_watch [--nodes 5000] [--pods 40000]``

The emulated API server (another process) serves the cluster of ``bench.bench_kube``. The
bench lists it into a :class:`~defrag.adapters.kube_watch.KubeWatchSource` under tracemalloc
and prints the memory the store holds (trimmed objects + each object's conversion), beside the
memory the same objects take whole as the API returns them (``json.loads`` of every item); then
the time of the store's first build (a full one: every held conversion; ``build()``), then of a
view (``make_view``: the scoring profile and reservations), against a full conversion of every
object (what a relist pays). A build after a change redoes only what changed
(``adapters/store_build.py``): ``bench.bench_cycle`` times that, under a changing cluster.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import tracemalloc

from bench.bench_kube import cluster_objects
from defrag.adapters.kube import RetryPolicy
from defrag.adapters.kube_convert import ClusterParts, paused_gc
from defrag.adapters.kube_watch import KubeWatchSource
from defrag.extender.state import make_view
from defrag.scoring.profile import ProfileConfig
from tests.support.kubeapi import client_for, serve_in_subprocess

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=40000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    objects = cluster_objects(args.nodes, args.pods)
    url, stop = serve_in_subprocess(objects)
    try:
        source = KubeWatchSource(client_for(url), retry=RetryPolicy(attempts=1, timeout_s=120))
        source.sync()  # warm up the client (its validators), then measure a fresh store
        source = KubeWatchSource(client_for(url), retry=RetryPolicy(attempts=1, timeout_s=120))
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        t = time.perf_counter()
        source.sync()
        t_list = time.perf_counter() - t
        gc.collect()
        store = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    finally:
        stop()

    # The same objects whole, as the API returns them, for comparison.
    raw = json.dumps(objects)
    del objects
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    whole = json.loads(raw)
    full = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()

    t = time.perf_counter()
    cluster, generation = source.build()
    t_first = time.perf_counter() - t
    views = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        make_view(cluster, ProfileConfig(), time.monotonic(), generation)
        views.append(time.perf_counter() - t)
    t = time.perf_counter()
    with paused_gc():
        parts = ClusterParts()
        for item in whole:
            parts.add(item, "bench")
        parts.build(lenient=True)
    t_convert = time.perf_counter() - t

    print(f"cluster: {len(cluster.nodes)} nodes, {len(cluster.pods)} pods (watched store)")
    print(f"list into the store (paged, trimmed, converted): {t_list:.2f} s")
    print(f"store memory (tracemalloc): {store / MIB:.1f} MiB")
    print(f"the same objects whole (json.loads): {full / MIB:.1f} MiB")
    print(f"first build of a cluster from the store (full): {t_first:.3f} s")
    print(f"a view of it (profile, reservations): median {statistics.median(views):.3f} s")
    print(f"convert every object and build (a relist's work): {t_convert:.2f} s")


if __name__ == "__main__":
    main()
