"""The daemon on the real control plane, as the ``defrag`` ServiceAccount with the overlay's RBAC.

The stage: three 8-GPU nodes, each partly used by one low-priority Deployment's pod (4, 4 and 6
GPUs: 10 GPUs free, no node with 8), then an 8-GPU pod of a non-preempting high-priority class
(so kube-scheduler's own preemption stays out of it) that waits. kube-scheduler runs the shipped
configuration with the defrag extender. Make-room must evict one 4-GPU pod through the Eviction
API, its replacement (made by the ReplicaSet controller) must be scheduled through the extender
onto the node the plan named, and the waiting pod must bind on the freed node.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from defrag.adapters.kube import KubeActuator, connect
from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import Kubelet, add_node
from tests.support.binaries import free_port

DAEMON = c.sa_user("defrag-system", "defrag")
SCHEDULER_SA = c.sa_user("defrag-system", "defrag-scheduler")
HIGH = "high-priority"
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
# (deployment, GPUs, node it starts on)
LAYOUT = [("a", 4, "g1"), ("b", 4, "g2"), ("c", 6, "g3")]


def daemon_settings(**overrides: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "policy": "reserve-binpack",
        "cycle_interval_s": 2,
        "ready_max_age_s": 120,  # the cycle deadline: it must hold a whole replacement wait
        "replacement_timeout_s": 45,
        "poll_interval_s": 0.5,
        "lease_duration_s": 6,
        "leader_election": True,
        "make_room_worth": 0,  # the pod has waited seconds, not hours: no worth check here
        "max_evictions_per_window": 10,
        "max_evictions_per_namespace": 5,
        "log_format": "json",
    }
    settings.update(overrides)
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

    def settings(self, **overrides: Any) -> Path:
        name = f"settings-{len(list(self.folder.glob('settings-*')))}.yaml"
        return c.write_yaml(self.folder / name, daemon_settings(**overrides))

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
        return [
            e
            for e in self.plane.audit_events()[since:]
            if e["user"]["username"] == DAEMON
            and e["verb"] == "create"
            and e.get("objectRef", {}).get("subresource") == "eviction"
            and e.get("objectRef", {}).get("namespace") == self.ns
        ]


def _unschedulable(pod: dict[str, Any]) -> bool:
    return any(
        cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable"
        for cond in pod["status"].get("conditions", [])
    )


@pytest.fixture
def stage(plane: ControlPlane, kubelet: Kubelet, tmp_path: Path, request: Any) -> Iterator[Stage]:
    ns = f"mr-{request.node.name.split('[')[0].removeprefix('test_')[:20].replace('_', '-')}"
    ns = ns.rstrip("-")
    c.namespace(plane.admin, ns)
    c.priority_class(plane.admin, HIGH, 100000, preempt=False)
    nodes = [f"{ns}-g{i}" for i in (1, 2, 3)]
    for name in nodes:
        add_node(plane.admin, name, 8)
    for name, gpus, _ in LAYOUT:
        c.deployment(plane.admin, ns, name, gpus)
    for name, _, node in LAYOUT:
        pod = c.wait_pods(plane.admin, ns, f"app={name}", lambda ps: len(ps) == 1, 30)[0]
        c.bind(plane.admin, pod, f"{ns}-{node}")
    c.wait_pods(plane.admin, ns, "", c.running(len(LAYOUT)), 30, what="the stage running")
    rules = tmp_path / "rules"
    rules.mkdir()
    c.write_yaml(rules / "starvation.yaml", STARVATION_RULE)
    sched_kc = plane.service_account_kubeconfig("defrag-system", "defrag-scheduler")
    settings = c.write_yaml(tmp_path / "extender-settings.yaml", {"policy": "reserve-binpack"})
    port = free_port()
    scheduler = f"kube-scheduler-{ns}"
    with c.extender(plane, sched_kc, settings, name=f"extender-{ns}", port=port):
        plane.start_scheduler(c.scheduler_config(port, True), sched_kc, scheduler)
        try:
            yield Stage(
                plane, kubelet, ns, nodes, tmp_path,
                plane.service_account_kubeconfig("defrag-system", "defrag"), rules,
            )  # fmt: skip
        finally:
            for name in [n for n in plane.processes if n.startswith(f"daemon-{ns}")]:
                plane.processes.pop(name).stop()
            plane.processes.pop(scheduler).stop()
            kubelet.hold.clear()
            c.clean(plane, ns, nodes)
            with_lease = "/apis/coordination.k8s.io/v1/namespaces/defrag-system/leases/defrag"
            plane.admin.delete(with_lease)


def once(stage: Stage, settings: Path) -> dict[str, Any]:
    """``defrag run --once`` as the daemon's ServiceAccount; its JSON."""
    out = c.defrag_json(
        "run", "--once", "--kubeconfig", str(stage.kubeconfig), "--settings", str(settings),
        "--rules", str(stage.rules), timeout_s=120,
    )  # fmt: skip
    return dict(out)


def plan_steps(result: dict[str, Any]) -> list[dict[str, Any]]:
    plan = result.get("plan") or {}
    return list(plan.get("steps", []))


def _stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00")).timestamp()


def test_dry_run_plans_the_room_and_writes_nothing(stage: Stage) -> None:
    stage.starving()
    time.sleep(3.5)  # past the rule's `for`
    mark = len(stage.plane.audit_events())
    result = once(stage, stage.settings())  # dry_run is the default
    steps = plan_steps(result)
    assert steps, result
    assert {s["pod"].split("/")[-1].split("-")[0] for s in steps} <= {"a", "b"}
    # And the daemon itself, several cycles of it, with leader election on.
    daemon = c.start_daemon(
        stage.plane, stage.kubeconfig, stage.settings(), stage.rules, f"daemon-{stage.ns}"
    )
    time.sleep(8)
    assert daemon.process.alive()
    writes = c.audit_writes(stage.plane, DAEMON, since=mark)
    assert writes == [], [(w["verb"], w["requestURI"]) for w in writes]
    reads = [e for e in stage.plane.audit_events()[mark:] if e["user"]["username"] == DAEMON]
    assert reads, "the daemon read nothing: it did not run as its ServiceAccount"


def test_make_room_end_to_end(stage: Stage) -> None:
    train = stage.starving()
    time.sleep(3.5)
    preview = once(stage, stage.settings())
    planned = {s["pod"].split("/")[-1].split("-")[0]: s for s in plan_steps(preview)}
    assert len(planned) == 1, preview  # one 4-GPU pod moves; the other 4-GPU node takes it
    mark = len(stage.plane.audit_events())
    c.start_daemon(
        stage.plane, stage.kubeconfig, stage.settings(dry_run=False), stage.rules,
        f"daemon-{stage.ns}",
    )  # fmt: skip
    bound = c.wait_pods(
        stage.plane.admin, stage.ns, "app=train",
        lambda ps: len(ps) == 1 and ps[0]["status"].get("phase") == "Running", 90,
        what="the starving pod bound",
    )  # fmt: skip
    ((moved, step),) = planned.items()
    source = next(node for name, _, node in LAYOUT if name == moved)
    assert c.node_of(bound[0]) == f"{stage.ns}-{source}", "train bound on the freed node"
    evictions = stage.evictions(mark)
    assert [e["responseStatus"]["code"] for e in evictions] == [201]
    replacement = c.wait_pods(stage.plane.admin, stage.ns, f"app={moved}", c.running(1), 30)[0]
    target = step.get("to") or step.get("target")
    assert c.node_of(replacement) == target, (step, c.node_of(replacement))
    # Drain to bind: the last eviction → the starving pod's binding (audit log times).
    binding = [
        e for e in stage.plane.audit_events()[mark:]
        if e.get("objectRef", {}).get("subresource") == "binding"
        and e.get("objectRef", {}).get("name") == bound[0]["metadata"]["name"]
    ]  # fmt: skip
    assert binding, "no binding of the starving pod in the audit log"
    drain_to_bind = _stamp(binding[0]) - _stamp(evictions[-1])
    print(f"drain-to-bind {drain_to_bind:.2f} s")
    assert drain_to_bind < 30, drain_to_bind  # before the watch: 49-58 s, or the 5-min flush
    # Events recorded on the pod (its namespace) and on the node (namespace default).
    node = f"{stage.ns}-{source}"
    _wait_event(stage, stage.ns, "Pod", lambda name: name.startswith(f"{moved}-"))
    _wait_event(stage, "default", "Node", lambda name: name == node)
    # Nothing left behind: no drain taint, no reservation once the pod is bound.
    _wait_clean_nodes(stage)
    assert train["metadata"]["name"] == bound[0]["metadata"]["name"]


def test_pdb_refusal_is_a_skip_not_a_delete(stage: Stage) -> None:
    for name, _, _ in LAYOUT:
        stage.plane.admin.post(
            f"/apis/policy/v1/namespaces/{stage.ns}/poddisruptionbudgets",
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": name},
                "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": name}}},
            },
        )
    # The disruption controller has computed the budgets (the planner reads them too: wait
    # until the status says 0 disruptions allowed with the pod healthy).
    c.wait_for(
        "PDB status",
        lambda: all(
            stage.plane.admin.get(f"/apis/policy/v1/namespaces/{stage.ns}/poddisruptionbudgets/{n}")
            .get("status", {})
            .get("currentHealthy")
            == 1
            for n, _, _ in LAYOUT
        ),
        30,
    )
    before = {p["metadata"]["name"]: c.node_of(p) for p in c.pods(stage.plane.admin, stage.ns)}
    stage.starving()
    time.sleep(3.5)
    mark = len(stage.plane.audit_events())
    result = once(stage, stage.settings(dry_run=False))
    blocked = " ".join(str(b) for b in (result.get("plan") or {}).get("blocked", []))
    refused = [e for e in stage.evictions(mark) if e["responseStatus"]["code"] == 429]
    # Either the planner already saw the budget (blocked, with the reason) or the Eviction API
    # refused with 429 and the executor skipped: never a delete, nothing moved.
    assert refused or "budget" in blocked.lower(), result
    deletes = [
        e for e in c.audit_writes(stage.plane, DAEMON, since=mark) if e["verb"] == "delete"
    ]  # fmt: skip
    assert deletes == []
    after = {p["metadata"]["name"]: c.node_of(p) for p in c.pods(stage.plane.admin, stage.ns)}
    assert {k: v for k, v in after.items() if not k.startswith("train")} == before
    _wait_clean_nodes(stage)
    # The Eviction API itself, through defrag's adapter as the daemon's ServiceAccount: the real
    # 429 with its DisruptionBudget cause is a refusal with the API server's reason, never a
    # delete, for a real eviction and for a server-side dry run alike.
    actuator = KubeActuator(connect(str(stage.kubeconfig)))
    victim = next(n for n in after if n.startswith("a-"))
    mark = len(stage.plane.audit_events())
    for dry_run in (True, False):
        result = actuator.evict(stage.ns, victim, dry_run=dry_run)
        assert result.outcome == "blocked", result
        assert "disruption budget" in result.reason.lower(), result
    codes = [e["responseStatus"]["code"] for e in stage.evictions(mark)]
    assert codes == [429, 429], codes
    assert victim in {p["metadata"]["name"] for p in c.pods(stage.plane.admin, stage.ns)}


def test_terminating_victim_is_not_evicted_again_and_a_new_leader_reconciles(
    stage: Stage,
) -> None:
    """Two replicas; the victim hangs in Terminating; the leader is SIGKILLed mid-drain."""
    stage.kubelet.hold.update({f"{stage.ns}/a-", f"{stage.ns}/b-"})
    stage.starving()
    time.sleep(3.5)
    mark = len(stage.plane.audit_events())
    settings = stage.settings(dry_run=False, replacement_timeout_s=6, ready_max_age_s=60)
    first = c.start_daemon(
        stage.plane, stage.kubeconfig, settings, stage.rules, f"daemon-{stage.ns}-1"
    )
    c.wait_for("an eviction", lambda: stage.evictions(mark), 60, first.process)
    # Several cycles while the victim stays Terminating: it is never evicted again.
    time.sleep(10)
    victims = [e["objectRef"]["name"] for e in stage.evictions(mark)]
    assert len(victims) == len(set(victims)), victims
    tainted = [n for n in stage.nodes if _defrag_marks(stage, n)]
    assert tainted, "the drain should still be under way (the victim is held)"
    second = c.start_daemon(
        stage.plane, stage.kubeconfig, settings, stage.rules, f"daemon-{stage.ns}-2"
    )
    first.process.proc.kill()  # SIGKILL mid-drain
    first.process.proc.wait()
    lease = "/apis/coordination.k8s.io/v1/namespaces/defrag-system/leases/defrag"
    c.wait_for(
        "the second replica holds the Lease",
        lambda: (
            stage.plane.admin.get(lease)["spec"].get("holderIdentity") == f"daemon-{stage.ns}-2"
        ),
        60,
        second.process,
    )
    stage.kubelet.release(list(stage.kubelet.hold))
    c.wait_pods(
        stage.plane.admin, stage.ns, "app=train",
        lambda ps: len(ps) == 1 and ps[0]["status"].get("phase") == "Running", 90,
        what="the starving pod bound after the takeover",
    )  # fmt: skip
    _wait_clean_nodes(stage)
    victims = [e["objectRef"]["name"] for e in stage.evictions(mark)]
    assert len(victims) == len(set(victims)), victims


# --- helpers ------------------------------------------------------------------------------


def _defrag_marks(stage: Stage, node: str) -> list[str]:
    obj = stage.plane.admin.get(f"/api/v1/nodes/{node}")
    marks = [t["key"] for t in obj["spec"].get("taints", []) if t["key"].startswith("defrag.io/")]
    marks += [k for k in obj["metadata"].get("annotations", {}) if k.startswith("defrag.io/")]
    return [m for m in marks if m != "defrag.io/nvlink-domains"]


def _wait_clean_nodes(stage: Stage) -> None:
    c.wait_for(
        "no defrag taint or annotation left on any node",
        lambda: not any(_defrag_marks(stage, n) for n in stage.nodes),
        60,
    )


def _wait_event(stage: Stage, ns: str, kind: str, name_ok: Any) -> None:
    def found() -> bool:
        items = stage.plane.admin.get(f"/api/v1/namespaces/{ns}/events")["items"]
        return any(
            e["involvedObject"]["kind"] == kind
            and name_ok(e["involvedObject"]["name"])
            and (
                e.get("source", {}).get("component") or e.get("reportingComponent", "")
            ).startswith("defrag")
            for e in items
        )

    c.wait_for(f"an Event about the {kind} in {ns}", found, 30)
