"""The MostAllocated remedy in the real kube-scheduler, and the spreading detector on what each
scheduler did.

Two kube-schedulers on the real control plane, each with its own profile name so that one pod
goes to one of them: kube-scheduler's defaults (NodeResourcesFit LeastAllocated over CPU and
memory: what a cluster runs when nobody configured it) and the shipped
deploy/components/most-allocated/kube-scheduler-config.yaml (only the profile's name changed and
leader election off, as two schedulers side by side need). Eight 1-GPU pods, one at a time, on
four empty 8-GPU nodes: the defaults spread them over all four, the shipped configuration packs
them onto one. The spreading detector, run on the cluster read back from the API server, fires
on the first placement and not on the second.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from defrag.adapters.kube_convert import cluster_from_items
from defrag.detectors.spreading.core import SpreadingParams, detect_spreading
from defrag.scoring.profile import ProfileConfig
from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import Kubelet, add_node

CONFIG_FILE = c.DEPLOY / "components" / "most-allocated" / "kube-scheduler-config.yaml"
PODS = 8
# CPU and memory in proportion to the GPU (an eighth of the node's 96 CPUs): the default
# NodeResourcesFit scores CPU and memory only, in whole points, per resource
# int((allocatable - requested) × 100 / allocatable), then the integer mean. A 1-CPU, 1-GiB pod
# moves nothing: an empty node (98 + 99)/2 = 98, one holding such a pod (97 + 99)/2 = 98, so the
# defaults would place it at random among equals. With 8 CPUs and 64 GiB of 1,031,800 MiB: an
# empty node (91 + 93)/2 = 92, one holding a pod (83 + 87)/2 = 85.
REQUESTS = {"cpu": "8", "memory": "64Gi"}
# 8 pods: the first lands on an empty cluster and the fifth (defaults) on four equal nodes, so
# at most 6 placements are informative; the shipped rule's 20 is for real clusters.
PARAMS = SpreadingParams(min_placements=4, min_stranded_gpus=4.0)


def _config(scheduler: str, shipped: bool) -> dict[str, Any]:
    base: dict[str, Any] = (
        yaml.safe_load(CONFIG_FILE.read_text(encoding="utf-8"))
        if shipped
        else {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "profiles": [{"schedulerName": scheduler}],
        }
    )
    base["profiles"][0]["schedulerName"] = scheduler
    base["leaderElection"] = {"leaderElect": False}
    return base


def _place(plane: ControlPlane, ns: str, scheduler: str) -> list[str]:
    """PODS 1-GPU pods, one at a time (each bound and running before the next, a second
    apart so their PodScheduled times order them); the node each got."""
    nodes = []
    for i in range(PODS):
        name = f"p{i}"
        spec = {**c.pod_spec(1), "schedulerName": scheduler}
        spec["containers"][0]["resources"]["requests"].update(REQUESTS)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
            "spec": spec,
        }
        plane.admin.post(f"/api/v1/namespaces/{ns}/pods", body)
        (pod,) = c.wait_pods(
            plane.admin, ns, f"app={name}", c.running(1), 30, what=f"{ns}/{name} running"
        )
        node = c.node_of(pod)
        assert node is not None
        nodes.append(node)
        time.sleep(1.1)
    return nodes


def _verdict(plane: ControlPlane, nodes: list[str]) -> Any:
    items = [
        {**n, "kind": "Node"}
        for n in plane.admin.get("/api/v1/nodes")["items"]
        if n["metadata"]["name"] in nodes
    ] + [
        {**p, "kind": "Pod"}
        for p in plane.admin.get("/api/v1/pods")["items"]
        if p["spec"].get("nodeName") in nodes
    ]
    cluster = cluster_from_items(items, "api")
    profile = ProfileConfig().for_cluster(cluster)
    return detect_spreading(cluster, PARAMS, datetime.now(UTC), profile=profile)


def test_most_allocated_packs_where_the_defaults_spread_and_the_detector_tells(
    plane: ControlPlane, kubelet: Kubelet, tmp_path: Path
) -> None:
    runs = {"spread": False, "pack": True}  # namespace → shipped configuration?
    placed: dict[str, list[str]] = {}
    verdicts: dict[str, Any] = {}
    for ns, shipped in runs.items():
        nodes = [f"{ns}-gpu-{i}" for i in range(4)]
        for name in nodes:
            add_node(plane.admin, name, 8)
        c.namespace(plane.admin, ns)
        scheduler = f"{ns}-scheduler"
        plane.start_scheduler(_config(scheduler, shipped), plane.admin_kubeconfig, scheduler)
        try:
            placed[ns] = _place(plane, ns, scheduler)
            verdicts[ns] = _verdict(plane, nodes)
        finally:
            plane.processes.pop(scheduler).stop()
            c.clean(plane, ns, nodes)

    # the defaults: 8 pods over all 4 nodes, 2 each (LeastAllocated on CPU and memory)
    assert sorted(placed["spread"].count(n) for n in set(placed["spread"])) == [2, 2, 2, 2]
    # the shipped MostAllocated: all 8 on one node (8 GPUs: exactly full)
    assert len(set(placed["pack"])) == 1

    spread, pack = verdicts["spread"], verdicts["pack"]
    # spread: p0 on an empty cluster and p4 on four equal nodes say nothing; the 6 others went
    # to a node emptier than the rest: 6 of 6 spreading. 4 nodes × 6 free = 24 stranded; the
    # same 24 free GPUs ideally packed fill 3 whole nodes: 0.
    assert (spread.replay.informative, spread.replay.spreading) == (6, 6)
    assert (spread.replay.stranded.gpus, spread.replay.packed.gpus) == (24, 0)
    assert [f.kind for f in spread.findings] == ["spreading"]
    # packed: p1..p7 to the fullest node, 7 of 7 packing; the node is full, nothing stranded.
    # 7/7 = 1.0 ≥ 0.85: the packing finding (make-room's patience reads it), not spreading
    assert (pack.replay.informative, pack.replay.packing) == (7, 7)
    assert pack.evidence.ok and [f.kind for f in pack.findings] == ["packing"]
