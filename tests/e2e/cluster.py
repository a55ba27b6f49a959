"""What the e2e scenarios put on the control plane, and defrag's own processes beside it.

Workloads are Deployments (so evicted pods come back through the ReplicaSet controller) whose
pods name ``schedulerName: defrag-scheduler`` and ask for ``nvidia.com/gpu`` as the NVIDIA
device plugin publishes it. defrag's processes run as the ServiceAccounts of the shipped
manifests, with the RBAC the rendered overlay gives them.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from tests.e2e.controlplane import ControlPlane, Process, Rest, spawn, wait_for
from tests.support import kustomize
from tests.support.binaries import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCHEDULER = "defrag-scheduler"
RBAC_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
}
PAUSE = "registry.k8s.io/pause:3.10"


def render(overlay: str) -> list[dict[str, Any]]:
    return kustomize.render(DEPLOY / "overlays" / overlay)


def apply_all(api: Rest, objects: list[dict[str, Any]], dry_run: bool = False) -> None:
    for obj in objects:
        answer = api.apply(obj, dry_run=dry_run)
        if not answer.ok:
            raise AssertionError(
                f"apply {obj['kind']}/{obj['metadata']['name']}: {answer.status_code} {answer.text}"
            )


def apply_rbac(plane: ControlPlane, overlay: str = "enforce") -> None:
    """The namespace, ServiceAccounts and RBAC of the rendered overlay, applied as they ship."""
    objects = [o for o in render(overlay) if o["kind"] in RBAC_KINDS]
    objects.sort(key=lambda o: o["kind"] != "Namespace")
    apply_all(plane.admin, objects)


def namespace(api: Rest, name: str, labels: dict[str, str] | None = None) -> None:
    api.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}},
        }
    )


def priority_class(api: Rest, name: str, value: int, *, preempt: bool = True) -> None:
    body: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }
    if not preempt:  # kube-scheduler's own preemption stays out of it
        body["preemptionPolicy"] = "Never"
    api.apply(body)


def pod_spec(gpus: int, priority_class_name: str | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "main", "image": PAUSE, "resources": resources}],
    }
    if priority_class_name:
        spec["priorityClassName"] = priority_class_name
    return spec


def deployment(
    api: Rest,
    ns: str,
    name: str,
    gpus: int,
    replicas: int = 1,
    *,
    priority_class_name: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = {"app": name}
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations or {}},
                "spec": pod_spec(gpus, priority_class_name),
            },
        },
    }
    return api.post(f"/apis/apps/v1/namespaces/{ns}/deployments", body)


def bare_pod(api: Rest, ns: str, name: str, gpus: int, **kwargs: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": pod_spec(gpus, **kwargs),
    }
    return api.post(f"/api/v1/namespaces/{ns}/pods", body)


def pods(api: Rest, ns: str, selector: str = "") -> list[dict[str, Any]]:
    params = {"labelSelector": selector} if selector else {}
    return list(api.get(f"/api/v1/namespaces/{ns}/pods", **params)["items"])


def wait_pods(
    api: Rest,
    ns: str,
    selector: str,
    ok: Callable[[list[dict[str, Any]]], bool],
    timeout_s: float = 60,
    what: str = "pods",
) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def check() -> bool:
        nonlocal found
        found = pods(api, ns, selector)
        return ok(found)

    try:
        wait_for(what, check, timeout_s)
    except TimeoutError as exc:
        summary = [
            (p["metadata"]["name"], p["spec"].get("nodeName"), p["status"].get("phase"))
            for p in found
        ]
        raise AssertionError(f"{what}: {summary}") from exc
    return found


def running(expected: int) -> Callable[[list[dict[str, Any]]], bool]:
    def ok(found: list[dict[str, Any]]) -> bool:
        live = [p for p in found if not p["metadata"].get("deletionTimestamp")]
        return len(live) == expected and all(p["status"].get("phase") == "Running" for p in live)

    return ok


def node_of(pod: dict[str, Any]) -> str | None:
    return pod["spec"].get("nodeName")


# --- defrag's processes -----------------------------------------------------------------


def defrag_path() -> str:
    """The ``defrag`` command of this interpreter's environment."""
    return str(Path(sys.executable).parent / "defrag")


def defrag_json(*args: str, timeout_s: float = 60) -> Any:
    """Run a one-shot ``defrag`` command with ``-o json`` and return what it printed."""
    done = subprocess.run(
        [defrag_path(), *args, "-o", "json"], capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        raise AssertionError(f"defrag {' '.join(args)}: {done.returncode} {done.stderr[-2000:]}")
    return json.loads(done.stdout)


@dataclass
class Served:
    process: Process
    port: int

    def get(self, path: str) -> requests.Response:
        return requests.get(f"http://127.0.0.1:{self.port}{path}", timeout=5)

    def cycles(self, *, leading: bool = False) -> float:
        """The cycles a daemon has finished (``defrag_cycles_total``, every outcome); with
        ``leading``, 0 unless it holds the Lease now."""
        text = self.get("/metrics").text
        if leading and "defrag_leader 1.0" not in text:
            return 0.0
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("defrag_cycles_total")
        )


def wait_cycles(
    daemon: Served, more: int, timeout_s: float, *, leading_within_s: float | None = None
) -> None:
    """Until ``daemon`` has finished ``more`` cycles from now; with ``leading_within_s``, first
    until it leads (a cycle as leader), then ``more`` as leader."""
    leading = leading_within_s is not None
    if leading_within_s is not None:
        wait_for(
            f"{daemon.process.name} cycling as leader",
            lambda: daemon.cycles(leading=True) > 0,
            leading_within_s,
            daemon.process,
        )
    start = daemon.cycles(leading=leading)
    wait_for(
        f"{more} more cycles of {daemon.process.name}",
        lambda: daemon.cycles(leading=leading) >= start + more,
        timeout_s,
        daemon.process,
    )


def not_scheduled(pod: dict[str, Any], reason: str) -> dict[str, Any] | None:
    """The pod's PodScheduled condition when kube-scheduler (or the API server) set it for
    ``reason`` (``Unschedulable``, ``SchedulingGated``), else None."""
    for cond in pod["status"].get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond.get("reason") == reason:
            return dict(cond)
    return None


def wait_ready(process: Process, port: int, timeout_s: float = 60) -> None:
    wait_for(
        process.name,
        lambda: requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200,
        timeout_s,
        process,
    )


@contextmanager
def extender(
    plane: ControlPlane,
    kubeconfig: Path,
    settings: Path,
    name: str = "defrag-extender",
    port: int | None = None,
    extra: tuple[str, ...] = (),
) -> Iterator[Served]:
    port = port or free_port()
    metrics = free_port()
    proc = spawn(
        name,
        [
            defrag_path(),
            "extender",
            "--kubeconfig",
            str(kubeconfig),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics),
            "--metrics-host",
            "127.0.0.1",
            "--settings",
            str(settings),
            *extra,
        ],
        plane.folder,
    )
    plane.processes[name] = proc
    try:
        wait_ready(proc, metrics)
        yield Served(proc, metrics)
    finally:
        proc.stop()


def start_daemon(
    plane: ControlPlane,
    kubeconfig: Path,
    settings: Path,
    rules: Path,
    name: str,
    env: dict[str, str] | None = None,
) -> Served:
    port = free_port()
    proc = spawn(
        name,
        [
            defrag_path(),
            "run",
            "--kubeconfig",
            str(kubeconfig),
            "--settings",
            str(settings),
            "--rules",
            str(rules),
        ],
        plane.folder,
        env={
            "DEFRAG_HTTP__PORT": str(port),
            "DEFRAG_HTTP__HOST": "127.0.0.1",
            "DEFRAG_LEADERSHIP__IDENTITY": name,
            **(env or {}),
        },
    )
    plane.processes[name] = proc
    wait_for(
        name,
        lambda: requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200,
        30,
        proc,
    )
    return Served(proc, port)


def scheduler_config(extender_port: int, node_cache_capable: bool) -> dict[str, Any]:
    """The shipped kube-scheduler configuration, pointed at the extender's port here."""
    text = (DEPLOY / "components" / "extender" / "kube-scheduler-config.yaml").read_text()
    config = yaml.safe_load(text)
    for ext in config["extenders"]:
        ext["urlPrefix"] = f"http://127.0.0.1:{extender_port}"
        ext["nodeCacheCapable"] = node_cache_capable
    return dict(config)


def write_yaml(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def audit_writes(plane: ControlPlane, user: str, since: int = 0) -> list[dict[str, Any]]:
    """The mutating requests ``user`` made, from the API server's audit log."""
    return [
        e
        for e in plane.audit_events()[since:]
        if e["user"]["username"] == user
        and e["verb"] in ("create", "update", "patch", "delete", "deletecollection")
    ]


def sa_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def clean(plane: ControlPlane, ns: str, nodes: list[str]) -> None:
    """Remove the namespace's workloads and the nodes, so the next test starts empty."""
    for kind in ("deployments",):
        plane.admin.session.delete(
            plane.admin.url(f"/apis/apps/v1/namespaces/{ns}/{kind}"), timeout=30
        )
    deadline = time.monotonic() + 30
    while pods(plane.admin, ns) and time.monotonic() < deadline:
        for pod in pods(plane.admin, ns):
            plane.admin.delete(
                f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}",
                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
            )
        time.sleep(0.2)
    for node in nodes:
        with contextlib.suppress(requests.RequestException):
            plane.admin.delete(f"/api/v1/nodes/{node}")


def bind(api: Rest, pod: dict[str, Any], node: str) -> None:
    """Bind ``pod`` to ``node`` as a scheduler does (the ``pods/binding`` subresource)."""
    meta = pod["metadata"]
    api.post(
        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
    )
