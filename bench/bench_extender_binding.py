"""What a binding costs the extender's next ``filter``, in its own process, without an API server.

kube-scheduler's loop as the extender sees it, pod after pod: ``filter`` (the nodes
kube-scheduler sends at that size, :func:`~bench.bench_extender_load.nodes_to_find`), then
``prioritize`` of the nodes that passed, then the pod's binding (a MODIFIED watch event,
through :class:`~defrag.adapters.kube_watch.KubeWatchSource`'s own event path) before the next
pod's ``filter``. The extender's :class:`~defrag.extender.state.ClusterCache` runs its builder
thread as it does in the server. ``--nodes`` 8-GPU nodes, no pod on them; ``--pods`` pending
pods of 1 GPU created before the loop.

Per run: the filter's mean, median and p99 wall time, its thread's CPU time, the process's CPU
time per pod (every thread: the builder's too), the view builds, and how the filter's fresh
views were made (``current`` / ``ahead`` / ``waited``). ``--base DIR`` also runs another
checkout's code (its directory first on PYTHONPATH) in the same invocation, the two
interleaved run by run.

    .venv/bin/python -m bench.bench_extender_binding --nodes 5000 --pods 300 --base ../ext-base
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.calibrate import calibrate


def one_run(n_nodes: int, n_pods: int, min_interval_s: float | None = None) -> dict[str, Any]:
    """The loop in this process, with whatever ``defrag`` is on the path; the builder builds
    at most every ``min_interval_s`` (None: the server's default, that code's own)."""

    from bench.bench_extender_load import fed_store, lists, nodes_to_find
    from defrag.adapters import jsonio
    from defrag.extender.state import ClusterCache
    from defrag.extender.verbs import Extender
    from defrag.extender.wire import parse_args
    from defrag.scoring.profile import ProfileConfig
    from tests.support import kubeobjects

    store = fed_store(n_nodes, pod_gpus=())
    kinds = {kind.name: kind for kind in store._kinds}
    pods = [kubeobjects.pod(f"b-{i:04d}", "bench", 1, phase="Pending") for i in range(n_pods)]
    for pod in pods:
        store._apply(kinds["Pod"], {"type": "ADDED", "raw_object": pod})

    # this checkout's, by path: in a --base child ``bench`` is the other checkout's
    fed = runpy.run_path(str(Path(__file__).with_name("fed_source.py")))["FedSource"]
    source = fed(store, wakes=True)
    cache = ClusterCache(
        source,
        ProfileConfig(policy="reserve-binpack"),
        **({} if min_interval_s is None else {"min_interval_s": min_interval_s}),
    )
    hows: Counter[str] = Counter()
    if hasattr(cache, "on_fresh"):
        cache.on_fresh = lambda how: hows.update((how,))
    cache.start()
    extender = Extender(cache)
    node_lists = lists(n_nodes, nodes_to_find(n_nodes), n_pods)
    wall: list[float] = []
    cpu: list[float] = []
    process0, wall0 = time.process_time(), time.perf_counter()
    try:
        for i, pod in enumerate(pods):
            body = jsonio.dumps({"Pod": pod, "Nodes": None, "NodeNames": node_lists[i]})
            t0, c0 = time.perf_counter(), time.thread_time()
            answer = extender.filter(parse_args(body))
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            passed = answer["NodeNames"]
            body = jsonio.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed})
            extender.prioritize_body(parse_args(body))
            pod["spec"]["nodeName"] = passed[0]
            pod["metadata"]["resourceVersion"] = str(10_000 + i)
            store._apply(kinds["Pod"], {"type": "MODIFIED", "raw_object": pod})
        process_s, wall_s = time.process_time() - process0, time.perf_counter() - wall0
    finally:
        cache.stop()
    wall.sort()
    builder = store._builder
    return {
        "filter_mean_ms": statistics.mean(wall) * 1e3,
        "filter_median_ms": statistics.median(wall) * 1e3,
        "filter_p99_ms": wall[min(len(wall) - 1, int(len(wall) * 0.99))] * 1e3,
        "filter_cpu_ms": statistics.mean(cpu) * 1e3,
        "process_cpu_ms_per_pod": process_s * 1e3 / n_pods,
        "wall_ms_per_pod": wall_s * 1e3 / n_pods,
        "builds": builder.partial_builds + builder.full_builds,
        "fresh": dict(hows),
    }


def in_child(folder: Path, n_nodes: int, n_pods: int) -> dict[str, Any]:
    """:func:`one_run` of this file in a fresh process whose ``defrag`` (and ``bench``,
    ``tests``) are ``folder``'s: run from there, this file by its path (another checkout may
    not have it)."""
    env = {**os.environ, "PYTHONPATH": str(folder)}
    argv = [sys.executable, "-c", RUN_CHILD, __file__, str(n_nodes), str(n_pods)]
    done = subprocess.run(argv, env=env, cwd=folder, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


RUN_CHILD = (
    "import json, runpy, sys; "
    "one_run = runpy.run_path(sys.argv[1])['one_run']; "
    "print(json.dumps(one_run(int(sys.argv[2]), int(sys.argv[3]))))"
)
"""A child's program: this file's :func:`one_run`, loaded by path (not as ``bench.…``)."""

FIGURES = (
    "filter_mean_ms",
    "filter_median_ms",
    "filter_p99_ms",
    "filter_cpu_ms",
    "process_cpu_ms_per_pod",
    "wall_ms_per_pod",
    "builds",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--base", type=Path, help="another checkout, run in the same invocation")
    args = parser.parse_args(argv)
    cal = calibrate(3)
    print(f"calibration {cal:.3f} s; load {os.getloadavg()}", flush=True)
    here = Path(__file__).resolve().parent.parent
    which = {"HEAD": here} | ({"base": args.base.resolve()} if args.base else {})
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in which}
    for run in range(args.runs):
        names = list(which) if run % 2 == 0 else list(reversed(which))
        for name in names:
            result = in_child(which[name], args.nodes, args.pods)
            got[name].append(result)
            shown = ", ".join(f"{k} {result[k]:.2f}" for k in FIGURES)
            print(
                f"run {run + 1} {name}: {shown}; fresh {result['fresh']}; "
                f"load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    for name, runs in got.items():
        medians = ", ".join(f"{k} {statistics.median(r[k] for r in runs):.2f}" for k in FIGURES)
        print(f"{name} ({args.nodes} nodes, {args.pods} pods), median of {len(runs)}: {medians}")
    print(f"calibration after {calibrate(3):.3f} s; load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
