"""defrag on a real control plane (the e2e suite's harness): drain-to-bind and API requests.

    .venv/bin/python -m bench.bench_controlplane drain-to-bind --runs 20
    .venv/bin/python -m bench.bench_controlplane api-calls --nodes 1000 --pods-per-node 4

``drain-to-bind``: the make-room stage of ``tests/e2e/stage.py`` run ``--runs`` times, each in
a fresh namespace with the daemon enforcing; for each run, the time from the daemon's last
eviction to the starving pod's binding, both read from the API server's audit log (its
``stageTimestamp``s). Prints p50, p95 and max.

``api-calls``: ``--nodes`` GPU nodes with ``--pods-per-node`` running pods each; counts, from the
audit log, the requests of one daemon cycle (``defrag run --once``, dry run) and of the extender
from its start until it is ready, and then over ``--minutes`` (with one pod created every 5 s, so
the view has changes to follow), by verb and resource. A request counts once (a watch writes two
audit events).

Needs the control plane binaries (``KUBEBUILDER_ASSETS``, ``make kube-assets``) and etcd; exits
0 with a note when they are absent.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.e2e import cluster as c
from tests.e2e.controlplane import AssetsMissing, ControlPlane, control_plane, find_assets
from tests.e2e.kubelet import Kubelet, add_node
from tests.e2e.stage import bound_train, drain_to_bind_s, make_room_stage
from tests.support.binaries import free_port

EXTENDER = c.sa_user("defrag-system", "defrag-scheduler")
DAEMON = c.sa_user("defrag-system", "defrag")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def drain_to_bind(plane: ControlPlane, kubelet: Kubelet, runs: int, folder: Path) -> dict[str, Any]:
    waits: list[float] = []
    for run in range(runs):
        ns = f"d2b-{run}"
        with make_room_stage(plane, kubelet, ns, folder / ns) as stage:
            stage.starving()
            mark = len(plane.audit_events())
            c.start_daemon(
                plane, stage.kubeconfig, stage.settings(execution={"dry_run": False}), stage.rules,
                f"daemon-{ns}",
            )  # fmt: skip
            pod = bound_train(stage)
            waits.append(drain_to_bind_s(stage, mark, pod["metadata"]["name"]))
            print(f"run {run + 1}/{runs}: drain-to-bind {waits[-1]:.2f} s", flush=True)
    return {
        "runs": runs,
        "p50_s": round(statistics.median(waits), 2),
        "p95_s": round(_percentile(waits, 0.95), 2),
        "max_s": round(max(waits), 2),
        "all_s": [round(w, 2) for w in waits],
    }


def _requests(
    plane: ControlPlane, user: str, since: int, python_only: bool
) -> list[dict[str, Any]]:
    return [
        e
        for e in plane.audit_events()[since:]
        if e["user"]["username"] == user
        and (not python_only or not e.get("userAgent", "").startswith("kube-scheduler"))
    ]


def _by_kind(events: list[dict[str, Any]]) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for e in events:
        ref = e.get("objectRef", {})
        what = ref.get("resource", e["requestURI"].split("?")[0])
        if ref.get("subresource"):
            what += "/" + ref["subresource"]
        counts[f"{e['verb']} {what}"] += 1
    return dict(sorted(counts.items()))


def api_calls(
    plane: ControlPlane, nodes: int, pods_per_node: int, minutes: float, folder: Path
) -> dict[str, Any]:
    api = plane.admin
    ns = "load"
    c.namespace(api, ns)
    names = [f"load-{i:05d}" for i in range(nodes)]
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: add_node(api, n, 8), names))

        def pod(i: int) -> None:
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"p-{i:06d}", "namespace": ns, "labels": {"app": "load"}},
                "spec": {**c.pod_spec(1), "nodeName": names[i % nodes]},
            }
            api.post(f"/api/v1/namespaces/{ns}/pods", body)

        list(pool.map(pod, range(nodes * pods_per_node)))
    c.wait_pods(api, ns, "app=load", c.running(nodes * pods_per_node), 600, what="load running")
    print(f"{nodes} nodes, {nodes * pods_per_node} pods up in {time.monotonic() - started:.0f} s")

    mark = len(plane.audit_events())
    c.defrag_json(
        "run", "--once", "--kubeconfig", str(plane.service_account_kubeconfig("defrag-system",
                                                                              "defrag")),
        timeout_s=600,
    )  # fmt: skip
    cycle = _requests(plane, DAEMON, mark, python_only=False)

    settings = c.write_yaml(
        folder / "extender-settings.yaml", {"scoring": {"policy": "reserve-binpack"}}
    )
    kubeconfig = plane.service_account_kubeconfig("defrag-system", "defrag-scheduler")
    mark = len(plane.audit_events())
    with c.extender(plane, kubeconfig, settings, name="extender-load", port=free_port()):
        startup = _requests(plane, EXTENDER, mark, python_only=True)
        mark = len(plane.audit_events())
        end = time.monotonic() + minutes * 60
        churn = 0
        while time.monotonic() < end:
            time.sleep(5)
            churn += 1
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"churn-{churn:04d}", "namespace": ns},
                "spec": {**c.pod_spec(1), "nodeName": names[churn % nodes]},
            }
            api.post(f"/api/v1/namespaces/{ns}/pods", body)
        extender = _requests(plane, EXTENDER, mark, python_only=True)
        watches = sum(1 for e in extender if e["verb"] == "watch")
    return {
        "nodes": nodes,
        "pods": nodes * pods_per_node,
        "daemon_cycle_requests": len(cycle),
        "daemon_cycle_by_kind": _by_kind(cycle),
        "extender_startup_requests": len(startup),
        "extender_startup_by_kind": _by_kind(startup),
        "extender_minutes": minutes,
        "extender_watches_opened": watches,
        "extender_requests_per_minute": round(len(extender) / minutes, 1),
        "extender_by_kind": _by_kind(extender),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    d2b = sub.add_parser("drain-to-bind")
    d2b.add_argument("--runs", type=int, default=20)
    calls = sub.add_parser("api-calls")
    calls.add_argument("--nodes", type=int, default=1000)
    calls.add_argument("--pods-per-node", type=int, default=4)
    calls.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    try:
        find_assets()
    except AssetsMissing as exc:
        print(f"skipped: {exc}")
        return 0
    with tempfile.TemporaryDirectory(prefix="defrag-bench-cp-") as tmp:
        folder = Path(tmp)
        with control_plane(folder / "plane") as plane:
            c.apply_rbac(plane)
            kubelet = Kubelet(plane.admin).start()
            try:
                if args.what == "drain-to-bind":
                    figures = drain_to_bind(plane, kubelet, args.runs, folder)
                else:
                    figures = api_calls(plane, args.nodes, args.pods_per_node, args.minutes,
                                        folder)  # fmt: skip
            finally:
                kubelet.stop()
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
