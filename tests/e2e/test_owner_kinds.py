"""Only what comes back is evicted, on the real control plane, by the daemon as its
ServiceAccount with the overlay's RBAC.

Six 8-GPU nodes each hold one 4-GPU pod; an 8-GPU high-priority pod waits. On five nodes the pod
is one nothing would recreate once evicted: a bare pod, a pod whose controlling owner is another
Pod, one whose controlling owner is a ConfigMap, one with only a non-controlling owner (a
ReplicaSet), and the pod of a batch/v1 Job with ``backoffLimit: 0`` (real Job controller: an
eviction would fail the Job, ``BackoffLimitExceeded``). Those five are the cheapest victims (the
youngest, priority 0); the sixth node's pod, of a Deployment, is the oldest and of a higher
priority. Before defrag read owners, make-room chose one of the five. Now the plan blocks each
with its reason, the daemon evicts only the Deployment's pod, and the Job is still running.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane, wait_for
from tests.e2e.kubelet import Kubelet, add_node
from tests.e2e.stage import DAEMON, HIGH, LEASE, STARVATION_RULE, bound_train, daemon_settings
from tests.support.binaries import free_port

NS = "owners"
MID = "owners-mid"
NEVER = ("bare", "of-pod", "of-configmap", "not-controlled", "job-once", "pt-worker-0")
"""The pods that must never be evicted, one per node n1..n6; n7 holds the Deployment's."""
PYTORCHJOB_CRD = {
    # The resource of kubeflow/training-operator's manifests/base/crds/kubeflow.org_pytorchjobs
    # .yaml (group, names, scope, the served version v1), its schema left open: no operator runs
    # here, defrag only reads the object.
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "pytorchjobs.kubeflow.org"},
    "spec": {
        "group": "kubeflow.org",
        "names": {
            "kind": "PyTorchJob",
            "listKind": "PyTorchJobList",
            "plural": "pytorchjobs",
            "singular": "pytorchjob",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def _owned(
    api: Any, name: str, refs: list[dict[str, Any]], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, "ownerReferences": refs, "labels": labels or {}}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": c.pod_spec(4),
    }
    return dict(api.post(f"/api/v1/namespaces/{NS}/pods", body))


def _ref(obj: dict[str, Any], controller: bool) -> dict[str, Any]:
    ref = {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
    }
    if controller:
        ref["controller"] = True
    return ref


@pytest.fixture
def stage(plane: ControlPlane, kubelet: Kubelet, tmp_path: Path) -> Iterator[dict[str, Any]]:
    api = plane.admin
    c.namespace(api, NS)
    c.priority_class(api, HIGH, 100000, preempt=False)
    c.priority_class(api, MID, 500, preempt=False)
    nodes = [f"{NS}-n{i}" for i in range(1, 8)]
    rules = tmp_path / "rules"
    rules.mkdir()
    c.write_yaml(rules / "starvation.yaml", STARVATION_RULE)
    sched_kc = plane.service_account_kubeconfig("defrag-system", "defrag-scheduler")
    ext_settings = c.write_yaml(
        tmp_path / "extender.yaml", {"scoring": {"policy": "reserve-binpack"}}
    )
    port = free_port()
    with c.extender(plane, sched_kc, ext_settings, name=f"extender-{NS}", port=port):
        try:
            for node in nodes:
                add_node(api, node, 8)
            # The oldest and the dearest: the Deployment's pod on n6, placed first.
            c.deployment(api, NS, "keep", 4, priority_class_name=MID)
            (keep,) = c.wait_pods(api, NS, "app=keep", lambda ps: len(ps) == 1, 30)
            c.bind(api, keep, nodes[6])
            c.wait_pods(api, NS, "app=keep", c.running(1), 30)
            time.sleep(2)  # the five below are younger: less work lost, cheaper victims
            launcher = c.bare_pod(api, NS, "launcher", 0)
            config = api.post(
                f"/api/v1/namespaces/{NS}/configmaps",
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}},
            )
            config.setdefault("apiVersion", "v1")
            config.setdefault("kind", "ConfigMap")
            stray = api.post(
                f"/apis/apps/v1/namespaces/{NS}/replicasets",
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "metadata": {"name": "stray"},
                    "spec": {
                        "replicas": 0,
                        "selector": {"matchLabels": {"app": "stray"}},
                        "template": {
                            "metadata": {"labels": {"app": "stray"}},
                            "spec": c.pod_spec(0),
                        },
                    },
                },
            )
            job = api.post(
                f"/apis/batch/v1/namespaces/{NS}/jobs",
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": "job-once"},
                    "spec": {
                        "backoffLimit": 0,
                        "template": {
                            "metadata": {"labels": {"app": "job-once"}},
                            "spec": {**c.pod_spec(4), "restartPolicy": "Never"},
                        },
                    },
                },
            )
            api.apply(PYTORCHJOB_CRD).raise_for_status()
            crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pytorchjobs.kubeflow.org"

            def established() -> bool:
                conditions = (api.get(crd).get("status") or {}).get("conditions") or []
                return any(x["type"] == "Established" and x["status"] == "True" for x in conditions)

            wait_for("the PyTorchJob CRD established", established, 30)
            # Its worker replica's restartPolicy is Never: deleting it fails the whole job.
            pytorch = api.post(
                f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs",
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "metadata": {"name": "pt"},
                    "spec": {
                        "pytorchReplicaSpecs": {
                            "Worker": {"replicas": 1, "restartPolicy": "Never"},
                        }
                    },
                },
            )
            # the labels the training operator puts on the pods it creates
            labels = {
                "training.kubeflow.org/job-name": "pt",
                "training.kubeflow.org/replica-type": "worker",
            }
            worker = _owned(api, "pt-worker-0", [_ref(pytorch, True)], labels)
            placed = {
                "pt-worker-0": worker,
                "bare": c.bare_pod(api, NS, "bare", 4),
                "of-pod": _owned(api, "of-pod", [_ref(launcher, True)]),
                "of-configmap": _owned(api, "of-configmap", [_ref(config, True)]),
                "not-controlled": _owned(api, "not-controlled", [_ref(stray, False)]),
            }
            (job_pod,) = c.wait_pods(api, NS, "app=job-once", lambda ps: len(ps) == 1, 30)
            placed["job-once"] = job_pod
            for name, node in zip(NEVER, nodes[:6], strict=True):
                c.bind(api, placed[name], node)
            c.bind(api, launcher, nodes[6])  # no GPU: it only owns of-pod
            c.wait_pods(api, NS, "", c.running(8), 30, what="the stage running")
            plane.start_scheduler(c.scheduler_config(port, True), sched_kc, f"scheduler-{NS}")
            yield {
                "plane": plane,
                "kubeconfig": plane.service_account_kubeconfig("defrag-system", "defrag"),
                "rules": rules,
                "folder": tmp_path,
                "job": job,
            }
        finally:
            for name in [n for n in plane.processes if n.endswith(f"-{NS}")]:
                plane.processes.pop(name).stop()
            for path in (
                f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/pt",
                f"/apis/batch/v1/namespaces/{NS}/jobs/job-once",
                f"/apis/apps/v1/namespaces/{NS}/replicasets/stray",
            ):
                api.delete(path, {"apiVersion": "v1", "kind": "DeleteOptions",
                                  "propagationPolicy": "Background"})  # fmt: skip
            c.clean(plane, NS, nodes)
            api.delete(LEASE)


def _once(stage: dict[str, Any], **execution: Any) -> dict[str, Any]:
    """One cycle; ``execution``: settings of the ``execution`` section (``dry_run=False``)."""
    path = c.write_yaml(
        stage["folder"] / f"settings-{time.monotonic_ns()}.yaml",
        daemon_settings(planner={"min_pod_age_s": 0}, execution=execution),
    )
    args = ["run", "--once", "--kubeconfig", str(stage["kubeconfig"]), "--settings", str(path)]
    return dict(c.defrag_json(*args, "--rules", str(stage["rules"]), timeout_s=150))


def test_make_room_evicts_only_what_its_controller_recreates(stage: dict[str, Any]) -> None:
    plane: ControlPlane = stage["plane"]
    c.deployment(plane.admin, NS, "train", 8, priority_class_name=HIGH)
    time.sleep(3.5)  # past the rule's `for`
    planned = _once(stage)
    plan = planned.get("plan") or {}
    moved = [s["pod"] for s in plan.get("steps", [])]
    assert moved and all(p.startswith(f"{NS}/keep-") for p in moved), plan
    # keyed by the name the stage gave (the Job's pod is job-once-<suffix>)
    blocked = {
        next((n for n in NEVER if pod == n or pod.startswith(f"{n}-")), pod): b
        for b in plan.get("blocked", [])
        for pod in [b["pod"].split("/")[1]]
    }
    # the planner priced every candidate node, so each of them was tried and said why not
    reasons = {name: blocked[name]["constraint"] for name in NEVER if name in blocked}
    assert reasons == {name: "bare-pod" for name in NEVER} | {"job-once": "job-retries"}, blocked
    assert "not its controller" in blocked["not-controlled"]["detail"]
    assert "restartPolicy Never" in blocked["pt-worker-0"]["detail"]

    mark = len(plane.audit_events())
    _once(stage, dry_run=False)
    evicted = [
        e["objectRef"]["name"]
        for e in plane.audit_events()[mark:]
        if e["user"]["username"] == DAEMON
        and e["verb"] == "create"
        and e.get("objectRef", {}).get("subresource") == "eviction"
        and "dryRun=All" not in e.get("requestURI", "")
        and e["responseStatus"]["code"] == 201
    ]
    assert evicted and all(name.startswith("keep-") for name in evicted), evicted
    # The daemon read the owners of its victims as itself (the ClusterRole grants get).
    reads = [
        e for e in plane.audit_events()[mark:]
        if e["user"]["username"] == DAEMON and e["verb"] == "get"
        and e.get("objectRef", {}).get("resource") in ("replicasets", "jobs", "pytorchjobs")
    ]  # fmt: skip
    assert reads and all(e["responseStatus"]["code"] == 200 for e in reads), reads
    bound_train(_Stage(plane))
    job = plane.admin.get(f"/apis/batch/v1/namespaces/{NS}/jobs/job-once")
    conditions = {x["type"] for x in job.get("status", {}).get("conditions", [])}
    assert not conditions & {"Failed", "FailureTarget"}, job["status"]
    left = {p["metadata"]["name"] for p in c.pods(plane.admin, NS)}
    assert {"bare", "of-pod", "of-configmap", "not-controlled", "pt-worker-0"} <= left


class _Stage:
    """What :func:`~tests.e2e.stage.bound_train` reads of a stage."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.ns = NS
