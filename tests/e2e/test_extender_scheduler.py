"""The extender behind the real kube-scheduler, in both of kube-scheduler's modes
(``nodeCacheCapable`` true: node names only; false: whole Node objects).

kube-scheduler runs the shipped ``kube-scheduler-config.yaml`` (only its urlPrefix pointed at
the port here and ``clientConnection.kubeconfig`` added, as outside a pod), both it and the
extender as the ``defrag-scheduler`` ServiceAccount with the overlay's RBAC. Each pod must bind
where ``defrag place`` (read as the daemon's ServiceAccount) says it goes; a node reserved for
one pod takes no other; with the extender gone, ``ignorable: true`` lets pods bind anyway.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import Kubelet, add_node
from tests.support.binaries import free_port

# Sizes chosen so that reserve-binpack and kube-scheduler's own LeastAllocated disagree on
# most of them: a small pod goes to the fullest node that fits, never to an empty one while a
# partly used node fits it (DESIGN §2), whereas LeastAllocated would spread.
SEQUENCE = [1, 2, 4, 1, 8, 3, 2, 1]


def _bound(api: Any, ns: str, name: str, timeout_s: float = 30) -> str:
    found = c.wait_pods(
        api,
        ns,
        f"app={name}",
        lambda ps: len(ps) == 1 and ps[0]["status"].get("phase") == "Running",
        timeout_s,
        what=f"{name} bound and running",
    )
    node = c.node_of(found[0])
    assert node is not None
    return node


def _settle(extender: c.Served) -> None:
    """Until the extender's watches are connected and its view holds every change its store
    does (``defrag_extender_state_age_seconds`` about 0: it was found current as /metrics was
    read), so that it scores on the pods bound so far as ``defrag place`` reads them."""

    def age() -> float:
        for line in extender.get("/metrics").text.splitlines():
            if line.startswith("defrag_extender_state_age_seconds "):
                return float(line.split()[1])
        raise AssertionError("the extender's /metrics has no defrag_extender_state_age_seconds")

    deadline = time.monotonic() + 15
    while age() > 0.1:
        assert time.monotonic() < deadline, "the extender's view never caught up"
        time.sleep(0.05)


@pytest.mark.parametrize("node_cache_capable", [True, False], ids=["names", "nodes"])
def test_binding_follows_defrag_place_reservations_and_fallback(
    plane: ControlPlane, kubelet: Kubelet, tmp_path: Path, node_cache_capable: bool
) -> None:
    tag = "n" if node_cache_capable else "o"
    ns = f"extender-{tag}"
    nodes = [f"{tag}-gpu-{i}" for i in range(1, 4)]
    for name in nodes:
        add_node(plane.admin, name, 8)
    c.namespace(plane.admin, ns)
    settings = c.write_yaml(tmp_path / "settings.yaml", {"scoring": {"policy": "reserve-binpack"}})
    sched_kc = plane.service_account_kubeconfig("defrag-system", "defrag-scheduler")
    daemon_kc = plane.service_account_kubeconfig("defrag-system", "defrag")
    port = free_port()
    scheduler = f"kube-scheduler-{tag}"
    try:
        with c.extender(
            plane,
            sched_kc,
            settings,
            name=f"extender-{tag}",
            port=port,
            extra=("--relist-interval", "1s"),
        ) as ext:
            plane.start_scheduler(c.scheduler_config(port, node_cache_capable), sched_kc, scheduler)
            for i, gpus in enumerate(SEQUENCE):
                _settle(ext)
                placed = c.defrag_json(
                    "place",
                    "--kubeconfig",
                    str(daemon_kc),
                    "--gpus",
                    str(gpus),
                    "--settings",
                    str(settings),
                )
                # Only our three nodes may take it (the other test's nodes are full or gone).
                expected = placed["node"]
                name = f"p{i}-{gpus}"
                c.deployment(plane.admin, ns, name, gpus)
                assert _bound(plane.admin, ns, name) == expected, (gpus, placed)
            calls = ext.get("/metrics").text
            assert 'defrag_extender_requests_total{code="200",verb="filter"}' in calls
            assert 'defrag_extender_requests_total{code="200",verb="prioritize"}' in calls

            # A reservation: the node with most free GPUs is kept for one named pod.
            free = _free_gpus(plane, nodes)
            roomy = max(nodes, key=lambda n: (free[n], n))
            plane.admin.patch(
                f"/api/v1/nodes/{roomy}",
                {"metadata": {"annotations": {"defrag.io/reserved-for": f"{ns}/keeper"}}},
            )
            _settle(ext)
            time.sleep(1.2)  # one relist: the annotation is in the view
            # The largest job that fits only on the reserved node stays Pending: kube-scheduler
            # tried and found no node, the reserved one refused for the reservation...
            c.deployment(plane.admin, ns, "intruder", free[roomy])
            intruder = c.wait_pods(
                plane.admin,
                ns,
                "app=intruder",
                lambda ps: len(ps) == 1 and c.not_scheduled(ps[0], "Unschedulable") is not None,
                30,
                what="intruder found unschedulable",
            )
            assert c.node_of(intruder[0]) is None
            why = c.not_scheduled(intruder[0], "Unschedulable") or {}
            assert f"reserved for {ns}/keeper" in why.get("message", ""), why
            # ...while the pod it is reserved for lands there.
            c.bare_pod(plane.admin, ns, "keeper", free[roomy])
            c.wait_pods(
                plane.admin,
                ns,
                "",
                lambda ps: any(
                    p["metadata"]["name"] == "keeper" and c.node_of(p) == roomy for p in ps
                ),
                30,
                what="keeper on its reserved node",
            )
            assert c.node_of(c.pods(plane.admin, ns, "app=intruder")[0]) is None
        # The extender is gone (ignorable: true): kube-scheduler binds without it, on the one
        # node with room.
        nodes.append(f"{tag}-gpu-4")
        add_node(plane.admin, nodes[-1], 8)
        log = plane.processes[scheduler].log
        before = len(log.read_bytes())  # the start-up log names the extender's URL too
        c.deployment(plane.admin, ns, "fallback", 1)
        assert _bound(plane.admin, ns, "fallback") == nodes[-1]
        since = log.read_bytes()[before:].decode(errors="replace")
        # the call for the fallback pod was made, failed and was skipped (schedule_one.go:
        # "Skipping extender as it returned error and has ignorable flag set")
        failed = [
            line
            for line in since.splitlines()
            if f'pod="{ns}/fallback-' in line and f"127.0.0.1:{port}" in line
        ]
        assert failed and "ignorable" in failed[0], since[-3000:]
    finally:
        if scheduler in plane.processes:
            plane.processes.pop(scheduler).stop()
        c.clean(plane, ns, nodes)


def _free_gpus(plane: ControlPlane, nodes: list[str]) -> dict[str, int]:
    used = dict.fromkeys(nodes, 0)
    for pod in plane.admin.get("/api/v1/pods")["items"]:
        node = pod["spec"].get("nodeName")
        if node in used and not pod["metadata"].get("deletionTimestamp"):
            for container in pod["spec"]["containers"]:
                limits = container.get("resources", {}).get("limits", {})
                used[node] += int(limits.get("nvidia.com/gpu", 0))
    return {n: 8 - used[n] for n in nodes}
