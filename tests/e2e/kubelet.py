"""A kubelet stand-in: Nodes that are Ready, bound pods that run, deletions that finish.

There are no kubelets in the e2e control plane. This plays their part through the API, as the
kubelet does: node status through ``nodes/status`` (and the ``not-ready`` taint that admission
puts on each new Node lifted, as the node lifecycle controller would once it is Ready), a bound
pod marked Running and Ready through ``pods/status`` (the disruption controller counts only
healthy pods for a PodDisruptionBudget), and a pod with a ``deletionTimestamp`` deleted for good
(grace 0, uid precondition) after ``delete_delay_s`` — or held Terminating while its key is in
``hold``.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import requests

from tests.e2e.controlplane import Rest
from tests.support import kubeobjects

NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def add_node(api: Rest, name: str, gpus: int = 8, **kwargs: Any) -> dict[str, Any]:
    """A GPU node as the device plugin and GPU Feature Discovery publish it
    (``tests/support/kubeobjects.node``), created and then made Ready."""
    shape = kubeobjects.node(name, gpus, **kwargs)
    meta = {k: v for k, v in shape["metadata"].items() if k in ("name", "labels", "annotations")}
    api.post(
        "/api/v1/nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": shape["spec"]},
    )
    status = dict(shape["status"])
    stamp = now_rfc3339()
    status["conditions"] = [
        {**c, "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
        for c in status.get("conditions", [])
    ]
    api.patch(f"/api/v1/nodes/{name}/status", {"status": status})
    wanted = shape["spec"].get("taints", [])
    node = api.get(f"/api/v1/nodes/{name}")
    if any(t["key"] == NOT_READY_TAINT for t in node["spec"].get("taints", [])):
        node = api.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": wanted or None}})
    return node


def pod_key(pod: dict[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


class Kubelet:
    """Runs on a thread with a watch on every pod; ``stop()`` ends it."""

    def __init__(self, api: Rest, delete_delay_s: float = 0.0) -> None:
        self.api = api
        self.delete_delay_s = delete_delay_s
        self.hold: set[str] = set()
        """Pod keys (``namespace/name``) or key prefixes (ending ``-``) held Terminating."""
        self.started: dict[str, float] = {}
        """pod key → monotonic time it was marked Running."""
        self._due: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def start(self) -> Kubelet:
        for target in (self._watch_loop, self._delete_loop):
            thread = threading.Thread(target=target, daemon=True, name=f"kubelet-{target.__name__}")
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def held(self, key: str) -> bool:
        return any(key == h or (h.endswith("-") and key.startswith(h)) for h in self.hold)

    def release(self, keys: Iterable[str]) -> None:
        """Let held pods finish deleting now."""
        with self._lock:
            for key in keys:
                self.hold.discard(key)
        for pod in self.api.get("/api/v1/pods")["items"]:
            if pod["metadata"].get("deletionTimestamp"):
                self._handle(pod)

    # --- the loops --------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                listed = self.api.get("/api/v1/pods")
                for pod in listed["items"]:
                    self._handle(pod)
                version = listed["metadata"]["resourceVersion"]
                self._watch(version)
            except (requests.RequestException, ValueError, KeyError) as exc:
                if not self._stop.is_set():
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.5)

    def _watch(self, version: str) -> None:
        params = {
            "watch": "1",
            "resourceVersion": version,
            "timeoutSeconds": "5",
            "allowWatchBookmarks": "true",
        }
        while not self._stop.is_set():
            with self.api.session.get(
                self.api.url("/api/v1/pods"), params=params, stream=True, timeout=(5, 15)
            ) as answer:
                if answer.status_code != 200:
                    return
                for line in answer.iter_lines():
                    if self._stop.is_set():
                        return
                    if not line:
                        continue
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        return  # 410 Gone and the like: relist
                    params["resourceVersion"] = obj["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._handle(obj)

    def _handle(self, pod: dict[str, Any]) -> None:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
        key = pod_key(pod)
        if meta.get("deletionTimestamp"):
            with self._lock:
                if self.held(key):
                    return
                heapq.heappush(
                    self._due, (time.monotonic() + self.delete_delay_s, key, meta["uid"])
                )
            return
        if spec.get("nodeName") and status.get("phase", "Pending") == "Pending":
            self._run(pod)

    def _run(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        stamp = now_rfc3339()
        conditions = [
            {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp}
            for kind in (
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled",
            )
        ]
        containers = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": f"containerd://{meta['uid'].replace('-', '')}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": stamp}},
            }
            for c in pod["spec"]["containers"]
        ]
        body = {
            "status": {
                "phase": "Running",
                "conditions": conditions,
                "containerStatuses": containers,
                "startTime": stamp,
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
            }
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        try:
            self.api.patch(path, body)
        except requests.HTTPError as exc:
            if exc.response is None or exc.response.status_code not in (404, 409):
                self.errors.append(str(exc))
            return
        self.started.setdefault(pod_key(pod), time.monotonic())

    def _delete_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                ready = []
                while self._due and self._due[0][0] <= time.monotonic():
                    ready.append(heapq.heappop(self._due))
            for _, key, uid in ready:
                if self.held(key):
                    continue
                namespace, name = key.split("/", 1)
                with contextlib.suppress(requests.RequestException):
                    self.api.delete(
                        f"/api/v1/namespaces/{namespace}/pods/{name}",
                        {
                            "apiVersion": "v1",
                            "kind": "DeleteOptions",
                            "gracePeriodSeconds": 0,
                            "preconditions": {"uid": uid},
                        },
                    )
            time.sleep(0.05)
