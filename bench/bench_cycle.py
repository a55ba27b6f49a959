"""One observe → detect → plan cycle over a large emulated cluster, through the real client.

Run: ``.venv/bin/python -m bench.bench_cycle [--nodes 5000] [--pods 40000] [--repeat 2]``

The cluster (F1's generator in bench.bench_kube: 8-GPU nodes, real-shaped pods, PDBs) sits in
the emulated API server, run in a child process so that serving JSON does not compete with the
measured client for this interpreter's GIL. The cycle lists it with ``KubeClusterSource``
(paged, raw JSON), runs the shipped detection rules (no Prometheus: cluster rules only) and
plans with the default policy, in dry run with no Events — the work of ``defrag run --once``.
Prints each phase and the whole cycle. Target (issue 6): ≤ 10 s for 5,000 nodes and 40,000 pods.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections.abc import Sequence
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Any

from bench.bench_kube import cluster_objects
from defrag.adapters.kube import KubeActuator, KubeClusterSource, RetryPolicy
from defrag.cli.run import _detector, _planner, default_rules_dir
from defrag.daemon.cycle import CycleConfig, CyclePorts, SystemClock, run_cycle
from defrag.detect.findings import Finding
from defrag.execute import Executor
from defrag.model.cluster import Cluster
from defrag.plan.model import Plan
from defrag.rules import load_rules
from defrag.scoring.profile import ScoringProfile
from defrag.settings import load_settings
from tests.support.kubeapi import KubeApi


class Timed:
    """Wraps a callable and keeps the duration of its last call."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.last_s = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.last_s = time.perf_counter() - t


def serve(nodes: int, pods: int, conn: Connection) -> None:
    """Child process: the emulated API server with the cluster; answers its URL, then whether
    anything was written, when asked."""
    api = KubeApi(cluster_objects(nodes, pods)).start()
    conn.send(api.url)
    conn.recv()
    conn.send(len(api.writes()))
    api.stop()


class RemoteApi:
    """The client side of :func:`serve`."""

    def __init__(self, nodes: int, pods: int) -> None:
        self.conn, child = mp.Pipe()
        self.proc = mp.Process(target=serve, args=(nodes, pods, child), daemon=True)
        self.proc.start()
        self.url: str = self.conn.recv()

    def client(self) -> Any:
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        config.retries = 0
        return client.ApiClient(config)

    def writes(self) -> int:
        self.conn.send("writes?")
        return int(self.conn.recv())

    def stop(self) -> None:
        self.proc.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=40000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    t0 = time.perf_counter()
    api = RemoteApi(args.nodes, args.pods)
    print(
        f"emulated cluster: {args.nodes} nodes, {args.pods} pods "
        f"(set up in {time.perf_counter() - t0:.1f} s)\n"
    )
    try:
        client = api.client()
        source = KubeClusterSource(client, retry=RetryPolicy(attempts=1, timeout_s=120))
        snapshot = Timed(source.snapshot)
        settings = load_settings(None, {"min_pod_age_s": 0})
        detect = Timed(_detector(load_rules([default_rules_dir()]), None))
        plan = Timed(_planner(settings))
        actuator = KubeActuator(client, send_writes=False)
        executor = Executor(actuator, source, SystemClock())

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
        ) -> Plan:
            return plan(cluster, goal, now, profile=profile, pods=pods)  # type: ignore[no-any-return]

        ports = CyclePorts(Source(), SystemClock(), detector, planner, executor)
        rows = []
        for i in range(args.repeat):
            t = time.perf_counter()
            result = run_cycle(ports, CycleConfig())
            total = time.perf_counter() - t
            steps = len(result.plan.steps) if result.plan else 0
            rows.append(
                (
                    i + 1,
                    snapshot.last_s,
                    detect.last_s,
                    plan.last_s,
                    total,
                    len(result.findings),
                    steps,
                )
            )
        assert api.writes() == 0, "a dry-run cycle must not write"
    finally:
        api.stop()
    print(
        f"{'run':>3} {'snapshot s':>10} {'detect s':>9} {'plan s':>7} {'cycle s':>8} "
        f"{'findings':>8} {'steps':>6}"
    )
    for run, snap, det, pl, total, findings, steps in rows:
        print(
            f"{run:>3} {snap:>10.2f} {det:>9.2f} {pl:>7.2f} {total:>8.2f} {findings:>8} {steps:>6}"
        )
    best = min(r[4] for r in rows)
    print(f"\nbest cycle: {best:.2f} s (target ≤ 10 s): {'PASS' if best <= 10 else 'FAIL'}")


if __name__ == "__main__":
    main()
