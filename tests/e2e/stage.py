"""The make-room stage of the e2e suite and of ``bench/bench_controlplane.py``.

Three 8-GPU nodes, each partly used by one low-priority Deployment's pod (4, 4 and 6 GPUs: 10
GPUs free, no node with 8), then an 8-GPU pod of a non-preempting high-priority class (so
kube-scheduler's own preemption stays out of it) that waits. kube-scheduler runs the shipped
configuration with the defrag extender, both as the ``defrag-scheduler`` ServiceAccount.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from defrag.adapters.kube import WINDOW_SPEND_ANNOTATION as SPEND
from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane, Rest
from tests.e2e.kubelet import Kubelet, add_node
from tests.support.binaries import free_port

DAEMON = c.sa_user("defrag-system", "defrag")
SCHEDULER_SA = c.sa_user("defrag-system", "defrag-scheduler")
HIGH = "high-priority"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/defrag-system/leases/defrag"
"""The daemon's Lease (the shipped ``leadership`` settings), which carries the window's spend."""
STARVATION_RULE = {
    "rules": [
        {
            "name": "high-priority-starved",
            "detector": "starvation",
            "severity": "critical",
            # make-room-now: no execution window needed for a starved pod.
            "action": "make-room-now",
            "for": "3s",
            "min_priority": 1000,
            "priority_classes": [HIGH],
        }
    ]
}
PACKING_RULE = {
    "rules": [
        {
            # the shipped rules/spreading.yaml with the evidence a 4-node stage can give:
            # 7 placements of the history (the first, on an empty cluster, says nothing) and
            # 1 of the layout (b beside a's free half: spreading), 7 of 8 packing ≥ 0.85
            "name": "gpu-pods-spread",
            "detector": "spreading",
            "severity": "info",
            "action": "alert",
            "window": "24h",
            "min_placements": 6,
            "min_stranded_gpus": 4,
        }
    ]
}
# (deployment, GPUs, node it starts on)
LAYOUT = [("a", 4, "g1"), ("b", 4, "g2"), ("c", 6, "g3")]


def daemon_settings(**sections: dict[str, Any]) -> dict[str, Any]:
    """The e2e daemon's settings file, each of ``sections`` merged into its section
    (``daemon_settings(execution={"dry_run": False})``)."""
    settings: dict[str, dict[str, Any]] = {
        "scoring": {"policy": "reserve-binpack"},
        # the cycle deadline (ready_max_age_s) must hold a whole replacement wait
        "daemon": {"cycle_interval_s": 2, "ready_max_age_s": 120},
        "execution": {"replacement_timeout_s": 45, "poll_interval_s": 0.5},
        "leadership": {"lease_duration_s": 6, "enabled": True},
        # the pod has waited seconds, not hours: no worth check here
        "planner": {"make_room_worth": 0},
        "windows": {"max_evictions_per_window": 10, "max_evictions_per_namespace": 5},
        "logging": {"format": "json"},
    }
    for section, values in sections.items():
        settings[section] = {**settings.get(section, {}), **values}
    return settings


@dataclass
class Stage:
    plane: ControlPlane
    kubelet: Kubelet
    ns: str
    nodes: list[str]
    folder: Path
    kubeconfig: Path
    rules: Path

    def settings(self, **sections: dict[str, Any]) -> Path:
        name = f"settings-{len(list(self.folder.glob('settings-*')))}.yaml"
        return c.write_yaml(self.folder / name, daemon_settings(**sections))

    def node(self, short: str) -> str:
        return f"{self.ns}-{short}"

    def starving(self) -> dict[str, Any]:
        c.deployment(self.plane.admin, self.ns, "train", 8, priority_class_name=HIGH)
        found = c.wait_pods(
            self.plane.admin, self.ns, "app=train",
            lambda ps: len(ps) == 1 and _unschedulable(ps[0]), 30,
            what="train marked unschedulable by kube-scheduler",
        )  # fmt: skip
        return found[0]

    def evictions(self, since: int = 0) -> list[dict[str, Any]]:
        """The daemon's Evictions in this namespace (not their server-side dry runs)."""
        return [e for e in self._eviction_requests(since) if not _dry_run(e)]

    def rehearsals(self, since: int = 0) -> list[dict[str, Any]]:
        """The executor's preflight: Evictions asked with ``dryRun=All`` before any taint."""
        return [e for e in self._eviction_requests(since) if _dry_run(e)]

    def _eviction_requests(self, since: int) -> list[dict[str, Any]]:
        return [
            e
            for e in self.plane.audit_events()[since:]
            if e["user"]["username"] == DAEMON
            and e["verb"] == "create"
            and e.get("objectRef", {}).get("subresource") == "eviction"
            and e.get("objectRef", {}).get("namespace") == self.ns
        ]


def _dry_run(event: dict[str, Any]) -> bool:
    """Whether an audit event (audit.k8s.io/v1 ``Event``) records a dry-run request: its
    ``requestURI`` carries the ``dryRun=All`` query parameter as the client sent it."""
    return "dryRun=All" in event.get("requestURI", "")


def _unschedulable(pod: dict[str, Any]) -> bool:
    return c.not_scheduled(pod, "Unschedulable") is not None


def window_spend(admin: Rest) -> dict[str, Any]:
    """The window spend the daemon records on its Lease (``{"windows": {key: {"total", …}}}``)."""
    spend: dict[str, Any] = json.loads(admin.get(LEASE)["metadata"]["annotations"][SPEND])
    return spend


@contextmanager
def make_room_stage(
    plane: ControlPlane, kubelet: Kubelet, ns: str, folder: Path, *, packed_history: int = 0
) -> Iterator[Stage]:
    """The stage of the module docstring in namespace ``ns`` (nodes ``<ns>-g1..3``), with the
    extender and kube-scheduler running; everything removed afterwards.

    ``packed_history``: first, that many 1-GPU pods placed one at a time by kube-scheduler with
    the extender on a fourth node ``<ns>-g4`` (a second apart, so their PodScheduled times order
    them): a packing history for the spreading rule, which the stage's rules then include
    (:data:`PACKING_RULE`). The layout is bound by hand afterwards, a second apart too."""
    c.namespace(plane.admin, ns)
    c.priority_class(plane.admin, HIGH, 100000, preempt=False)
    nodes = [f"{ns}-g{i}" for i in (1, 2, 3)]
    rules = folder / "rules"
    rules.mkdir(parents=True, exist_ok=True)
    c.write_yaml(rules / "starvation.yaml", STARVATION_RULE)
    sched_kc = plane.service_account_kubeconfig("defrag-system", "defrag-scheduler")
    settings = c.write_yaml(
        folder / "extender-settings.yaml", {"scoring": {"policy": "reserve-binpack"}}
    )
    port = free_port()
    scheduler = f"kube-scheduler-{ns}"
    with c.extender(plane, sched_kc, settings, name=f"extender-{ns}", port=port):
        try:
            if packed_history:
                c.write_yaml(rules / "spreading.yaml", PACKING_RULE)
                nodes.append(f"{ns}-g4")
                add_node(plane.admin, nodes[-1], 8)
                plane.start_scheduler(c.scheduler_config(port, True), sched_kc, scheduler)
                _place_history(plane, ns, packed_history, nodes[-1])
                # the layout is placed by hand, with no scheduler to race for it
                plane.processes.pop(scheduler).stop()
            for name in nodes[:3]:
                add_node(plane.admin, name, 8)
            for name, gpus, _ in LAYOUT:
                c.deployment(plane.admin, ns, name, gpus)
            for name, _, node in LAYOUT:
                pod = c.wait_pods(plane.admin, ns, f"app={name}", lambda ps: len(ps) == 1, 30)[0]
                c.bind(plane.admin, pod, f"{ns}-{node}")
                if packed_history:
                    time.sleep(1.1)
            c.wait_pods(plane.admin, ns, "", c.running(len(LAYOUT) + packed_history), 30,
                        what="the stage running")  # fmt: skip
            plane.start_scheduler(c.scheduler_config(port, True), sched_kc, scheduler)
            yield Stage(
                plane,
                kubelet,
                ns,
                nodes,
                folder,
                plane.service_account_kubeconfig("defrag-system", "defrag"),
                rules,
            )
        finally:
            for name in [n for n in plane.processes if n.startswith(f"daemon-{ns}")]:
                plane.processes.pop(name).stop()
            if scheduler in plane.processes:
                plane.processes.pop(scheduler).stop()
            kubelet.hold.clear()
            c.clean(plane, ns, nodes)
            plane.admin.delete(LEASE)


def _place_history(plane: ControlPlane, ns: str, count: int, node: str) -> None:
    """``count`` 1-GPU Deployments ``h0``…, each scheduled and running before the next; all on
    ``node``, the only node there is yet."""
    for i in range(count):
        c.deployment(plane.admin, ns, f"h{i}", 1)
        (pod,) = c.wait_pods(
            plane.admin, ns, f"app=h{i}", c.running(1), 30, what=f"{ns}/h{i} running"
        )
        assert c.node_of(pod) == node, (pod["metadata"]["name"], c.node_of(pod))
        time.sleep(1.1)


def bound_train(stage: Stage, timeout_s: float = 90) -> dict[str, Any]:
    return c.wait_pods(
        stage.plane.admin,
        stage.ns,
        "app=train",
        lambda ps: len(ps) == 1 and ps[0]["status"].get("phase") == "Running",
        timeout_s,
        what="the starving pod bound",
    )[0]


def drain_to_bind_s(stage: Stage, since: int, pod: str) -> float:
    """The last eviction → the starving pod's binding, in seconds, from the audit log."""
    events = stage.plane.audit_events()[since:]
    evictions = [e for e in stage.evictions(since) if e["responseStatus"]["code"] == 201]
    binding = [
        e
        for e in events
        if e.get("objectRef", {}).get("subresource") == "binding"
        and e.get("objectRef", {}).get("name") == pod
    ]
    if not evictions or not binding:
        raise AssertionError(f"{len(evictions)} evictions and {len(binding)} bindings of {pod}")
    return _stamp(binding[0]) - _stamp(evictions[-1])


def _stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00")).timestamp()
