"""Observe → detect → plan cycles over a large emulated cluster that changes between them,
through the real client.

Run: ``.venv/bin/python -m bench.bench_cycle [--nodes 5000] [--pods 40000] [--repeat 4]
[--churn 20] [--profile PATH]`` (``--profile``: cProfile of the later cycles, timed in CPU
time, so that a loaded machine's waits do not show as work; read with ``pstats``)

The cluster (F1's generator in bench.bench_kube: 8-GPU nodes, real-shaped pods, PDBs) sits in
the emulated API server, run in a child process so that serving JSON does not compete with the
measured client for this interpreter's GIL. The cycle reads it as ``defrag run`` does, from the
store list + watch keeps (``WatchedCluster``): the first cycle lists; before each later one the
server replaces ``--churn`` bound pods by new ones (a DELETED and an ADDED event each, delivered
by the watch before the cycle starts), so each later snapshot is built from those changes. Each
cycle runs the shipped detection rules (no Prometheus: cluster rules only) and plans with the
default policy, in dry run with no Events — the work of ``defrag run --once``.
Prints every cycle's phases, min / median / max of the later cycles and their snapshots, the
RSS once the first cycle is done and the peak RSS, and the load average. Targets: at 5,000 nodes
and 40,000 pods (issues 26, 40) the first cycle ≤ 5 s, every later cycle ≤ 3 s, its snapshot
≤ 0.5 s, ≤ 500 MiB; at 20,000 nodes / 200,000 pods (issue 40) the first cycle ≤ 30 s, every
later cycle ≤ 1 s, ≤ 1.5 GiB.

The emulator json-encodes an object the first time it serves it and keeps the bytes: the first
list pays that in the server process (which a real API server, encoding in Go on its own cores,
pays far less of). ``--warm-server`` lists once through another client before the cycles, so
the first cycle's list is the client's work and the transfer alone.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import multiprocessing as mp
import os
import pstats
import random
import resource
import statistics
import time
from collections.abc import Sequence
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Any

from bench.bench_kube import cluster_objects
from defrag.adapters.kube import KubeActuator, KubeClusterSource, RetryPolicy
from defrag.adapters.kube_watch import KubeWatchSource
from defrag.adapters.watched_cluster import WatchedCluster
from defrag.cli.run import _detector, _planner, default_rules_dir
from defrag.daemon.cycle import CyclePorts, SystemClock, run_cycle
from defrag.decide import CycleConfig
from defrag.detect.findings import Finding
from defrag.execute import Executor
from defrag.model.cluster import Cluster
from defrag.plan.history import NO_HISTORY, History
from defrag.plan.model import Plan
from defrag.plan.spend import BudgetLedger
from defrag.rules import load_rules
from defrag.scoring.profile import ScoringProfile
from defrag.settings import load_settings
from tests.support.kubeapi import KubeApi


class Timed:
    """Wraps a callable and keeps the duration of its last call, and its CPU time (this
    process's, all threads)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.last_s = 0.0
        self.last_cpu_s = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t, cpu = time.perf_counter(), time.process_time()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.last_s = time.perf_counter() - t
            self.last_cpu_s = time.process_time() - cpu


LISTS = (
    "/apis/scheduling.k8s.io/v1/priorityclasses",
    "/api/v1/nodes",
    "/api/v1/pods",
    "/apis/policy/v1/poddisruptionbudgets",
)
"""What the watched store lists."""


def serve(nodes: int, pods: int, pending: int | None, conn: Connection) -> None:
    """Child process: the emulated API server with the cluster; answers its URL, then each
    request: ``("churn", n)`` replaces ``n`` bound pods by new ones of the same shape on the
    same nodes (jobs ending and starting, as in a live cluster), ``("writes",)`` answers how
    many writes it saw, ``("warm",)`` lists every kind once in the server (its encoding kept),
    ``("stop",)`` ends it."""
    objects = cluster_objects(nodes, pods, pending=pending)
    api = KubeApi(objects).start()
    conn.send(api.url)
    bound = [o for o in objects if o["kind"] == "Pod" and o["spec"].get("nodeName")]
    rng = random.Random(26)
    made = 0
    while True:
        request = conn.recv()
        if request[0] == "churn":
            for _ in range(request[1]):
                at = rng.randrange(len(bound))
                old = bound[at]
                meta = old["metadata"]
                api.remove("Pod", meta["name"], meta["namespace"])
                new = copy.deepcopy(old)
                made += 1
                new["metadata"]["name"] = f"churn-{made:06d}"
                new["metadata"]["uid"] = f"churn-uid-{made:06d}"
                api.put(new)
                bound[at] = new
            conn.send(2 * request[1])  # a DELETED and an ADDED event each
        elif request[0] == "writes":
            conn.send(len(api.writes()))
        elif request[0] == "warm":
            for path in LISTS:  # each object encoded once and kept, as the lists read it
                api.handle("GET", path, b"", "")
            conn.send(True)
        else:
            break
    api.stop()


class RemoteApi:
    """The client side of :func:`serve`."""

    def __init__(self, nodes: int, pods: int, pending: int | None = None) -> None:
        self.conn, child = mp.Pipe()
        self.proc = mp.Process(target=serve, args=(nodes, pods, pending, child), daemon=True)
        self.proc.start()
        self.url: str = self.conn.recv()

    def client(self) -> Any:
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        config.retries = 0
        return client.ApiClient(config)

    def churn(self, pods: int) -> int:
        """Replace ``pods`` bound pods; the number of watch events that makes."""
        self.conn.send(("churn", pods))
        return int(self.conn.recv())

    def writes(self) -> int:
        self.conn.send(("writes",))
        return int(self.conn.recv())

    def warm(self) -> None:
        """Have the emulator encode every listed object now."""
        self.conn.send(("warm",))
        self.conn.recv()

    def stop(self) -> None:
        if self.proc.is_alive():
            self.conn.send(("stop",))
        self.proc.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=40000)
    parser.add_argument("--repeat", type=int, default=4, help="cycles, the first one listing")
    parser.add_argument(
        "--pending",
        type=int,
        help="at most this many pods Pending; the pods past 8 per node and these are CPU-only "
        "pods bound round the nodes (default: every pod past 8 per node is Pending)",
    )
    parser.add_argument(
        "--warm-server",
        action="store_true",
        help="have the emulator encode every object once before the first cycle lists",
    )
    parser.add_argument(
        "--churn", type=int, default=20, help="bound pods replaced before each later cycle"
    )
    parser.add_argument(
        "--profile",
        metavar="PATH",
        help="cProfile the later cycles (snapshot to result) and write the stats to PATH",
    )
    args = parser.parse_args()

    t0 = time.perf_counter()
    api = RemoteApi(args.nodes, args.pods, args.pending)
    print(
        f"emulated cluster: {args.nodes} nodes, {args.pods} pods "
        f"(set up in {time.perf_counter() - t0:.1f} s)\n"
    )
    try:
        client = api.client()
        if args.warm_server:
            api.warm()
        retry = RetryPolicy(attempts=1, timeout_s=120)
        fresh = KubeClusterSource(client, retry=retry)  # the executor's own reads
        # The daemon's cycle reads the store list + watch keeps (as `defrag run` wires it):
        # the first cycle lists, the next ones build only if something changed.
        source = WatchedCluster(KubeWatchSource(client, retry=retry), max_staleness_s=600)
        snapshot = Timed(source.snapshot)
        settings = load_settings(None, {"planner.min_pod_age_s": 0})
        detect = Timed(_detector(load_rules([default_rules_dir()]), None))
        plan = Timed(_planner(settings))
        actuator = KubeActuator(client, send_writes=False)
        executor = Executor(actuator, fresh, SystemClock())

        class Source:
            def snapshot(self) -> Cluster:
                return snapshot()  # type: ignore[no-any-return]

        def detector(cluster: Cluster, now: datetime, profile: ScoringProfile) -> Sequence[Finding]:
            return detect(cluster, now, profile)  # type: ignore[no-any-return]

        def planner(
            cluster: Cluster,
            goal: str,
            now: datetime,
            *,
            profile: ScoringProfile,
            pods: frozenset[str] | None = None,
            spent: BudgetLedger | None = None,
            history: History = NO_HISTORY,
        ) -> Plan:
            return plan(  # type: ignore[no-any-return]
                cluster, goal, now, profile=profile, pods=pods, spent=spent, history=history
            )

        ports = CyclePorts(Source(), SystemClock(), detector, planner, executor)
        builder = source.watch._builder
        pauses = GcPauses()
        rows = []
        profiles: list[cProfile.Profile] = []
        list_cpu = 0.0
        first_rss = 0.0
        for i in range(args.repeat):
            full = builder.full_builds
            if i and args.churn:
                # A live cluster changes between cycles: the watch delivers the events first.
                wanted = source.watch.generation() + api.churn(args.churn)
                waited = time.perf_counter()
                while source.watch.generation() < wanted:
                    if time.perf_counter() - waited > 60:
                        raise SystemExit("the watch did not deliver the churn within 60 s")
                    time.sleep(0.01)
            profiler = cProfile.Profile(time.process_time) if i and args.profile else None
            t, cpu = time.perf_counter(), time.process_time()
            paused = pauses.total_s
            if profiler is not None:
                profiler.enable()
            result = run_cycle(ports, CycleConfig())
            if profiler is not None:
                profiler.disable()
                profiles.append(profiler)
            total, cpu = time.perf_counter() - t, time.process_time() - cpu
            paused = pauses.total_s - paused
            steps = len(result.plan.steps) if result.plan else 0
            kind = "list" if i == 0 else "full" if builder.full_builds > full else "changes"
            if i == 0:
                list_cpu = snapshot.last_cpu_s
                first_rss = _rss_mib()
            rows.append(
                (
                    i + 1,
                    kind,
                    snapshot.last_s,
                    detect.last_s,
                    plan.last_s,
                    total,
                    cpu,
                    paused,
                    len(result.findings),
                    steps,
                )
            )
            print(  # as it goes: a long run leaves what it measured
                f"cycle {i + 1} ({kind}): snapshot {snapshot.last_s:.2f} s, detect "
                f"{detect.last_s:.2f} s, plan {plan.last_s:.2f} s, cycle {total:.2f} s "
                f"({cpu:.2f} s CPU), RSS {_rss_mib():.0f} MiB",
                flush=True,
            )
        if profiles:
            stats = pstats.Stats(profiles[0])
            for more in profiles[1:]:
                stats.add(more)
            stats.dump_stats(args.profile)
        assert api.writes() == 0, "a dry-run cycle must not write"
        source.stop()
    finally:
        api.stop()
    print(
        f"{'run':>3} {'built from':>10} {'snapshot s':>10} {'detect s':>9} {'plan s':>7} "
        f"{'cycle s':>8} {'cpu s':>6} {'gc s':>5} {'findings':>8} {'steps':>6}"
    )
    for run, kind, snap, det, pl, total, cpu_s, gc_s, findings, steps in rows:
        print(
            f"{run:>3} {kind:>10} {snap:>10.2f} {det:>9.2f} {pl:>7.2f} {total:>8.2f} "
            f"{cpu_s:>6.2f} {gc_s:>5.2f} {findings:>8} {steps:>6}"
        )
    later = rows[1:]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\nfirst cycle (lists the cluster): {rows[0][5]:.2f} s ({rows[0][6]:.2f} s CPU in this "
        f"process), its list {rows[0][2]:.2f} s ({list_cpu:.2f} s CPU)"
    )
    if later:
        cycles = [r[5] for r in later]
        cpus = [r[6] for r in later]
        snaps = [r[2] for r in later]
        print(
            f"every later cycle ({len(later)}, {args.churn} pods replaced before each): "
            f"{_spread(cycles)} s (target ≤ 3 s): {'PASS' if max(cycles) <= 3 else 'FAIL'}; "
            f"CPU {_spread(cpus)} s"
        )
        print(
            f"their snapshots (built from the changes): {_spread(snaps)} s (target ≤ 0.5 s): "
            f"{'PASS' if max(snaps) <= 0.5 else 'FAIL'}"
        )
    large = args.nodes >= 20_000
    first_target, later_target, rss_target = (30.0, 1.0, 1536) if large else (5.0, 3.0, 500)
    print(
        f"first cycle target ≤ {first_target:g} s: "
        f"{'PASS' if rows[0][5] <= first_target else 'FAIL'}"
    )
    if later and large:
        print(
            f"every later cycle target ≤ {later_target:g} s: "
            f"{'PASS' if max(r[5] for r in later) <= later_target else 'FAIL'}"
        )
    print(f"RSS after the first cycle: {first_rss:.0f} MiB")
    print(
        f"peak RSS: {peak:.0f} MiB (target ≤ {rss_target} MiB: "
        f"{'PASS' if peak <= rss_target else 'FAIL'}; this process, the API server apart)"
    )
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


class GcPauses:
    """The time the cyclic garbage collector runs (``gc.callbacks``), summed."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._started = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.total_s += time.perf_counter() - self._started


def _rss_mib() -> float:
    """This process's resident memory now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _spread(values: Sequence[float]) -> str:
    """min / median / max."""
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


if __name__ == "__main__":
    main()
