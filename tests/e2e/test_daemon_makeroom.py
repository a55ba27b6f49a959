"""The daemon on the real control plane, as the ``defrag`` ServiceAccount with the overlay's RBAC.

The stage (``tests/e2e/stage.py``): three 8-GPU nodes partly used (4, 4 and 6 GPUs), an 8-GPU
high-priority pod waiting, kube-scheduler with the defrag extender. Make-room must evict one
4-GPU pod through the Eviction API, its replacement (made by the ReplicaSet controller) must be
scheduled through the extender onto the node the plan named, and the waiting pod must bind on
the freed node.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from defrag.adapters.kube import KubeActuator, KubeClusterSource, connect
from defrag.daemon.cycle import SystemClock
from defrag.execute import Executor, ExecutorSettings, WindowStatus
from defrag.execute.mode import RunMode
from defrag.plan.model import Plan, Step
from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import Kubelet
from tests.e2e.stage import (
    DAEMON,
    LAYOUT,
    LEASE,
    Stage,
    bound_train,
    drain_to_bind_s,
    make_room_stage,
    window_spend,
)


@pytest.fixture
def stage(plane: ControlPlane, kubelet: Kubelet, tmp_path: Path, request: Any) -> Iterator[Stage]:
    ns = f"mr-{request.node.name.split('[')[0].removeprefix('test_')[:20].replace('_', '-')}"
    with make_room_stage(plane, kubelet, ns.rstrip("-"), tmp_path) as made:
        yield made


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


def test_dry_run_plans_the_room_and_writes_nothing(stage: Stage) -> None:
    stage.starving()
    time.sleep(3.5)  # past the rule's `for`
    mark = len(stage.plane.audit_events())
    result = once(stage, stage.settings())  # dry_run is the default
    steps = plan_steps(result)
    assert steps, result
    assert {s["pod"].split("/")[-1].split("-")[0] for s in steps} <= {"a", "b"}
    # And the daemon itself, several cycles of it, with leader election on.
    started = len(stage.plane.audit_events())
    daemon = c.start_daemon(
        stage.plane, stage.kubeconfig, stage.settings(), stage.rules, f"daemon-{stage.ns}"
    )
    c.wait_for("three cycles", lambda: daemon.cycles() >= 3, 60, daemon.process)
    assert daemon.process.alive()
    writes = c.audit_writes(stage.plane, DAEMON, since=mark)
    assert writes == [], [(w["verb"], w["requestURI"]) for w in writes]
    reads = [e for e in stage.plane.audit_events()[started:] if e["user"]["username"] == DAEMON]
    assert reads, "the daemon read nothing: it did not run as its ServiceAccount"


def test_make_room_end_to_end(stage: Stage) -> None:
    train = stage.starving()
    time.sleep(3.5)
    preview = once(stage, stage.settings())
    planned = {s["pod"].split("/")[-1].split("-")[0]: s for s in plan_steps(preview)}
    assert len(planned) == 1, preview  # one 4-GPU pod moves; the other 4-GPU node takes it
    mark = len(stage.plane.audit_events())
    c.start_daemon(
        stage.plane, stage.kubeconfig, stage.settings(execution={"dry_run": False}), stage.rules,
        f"daemon-{stage.ns}",
    )  # fmt: skip
    bound = bound_train(stage)
    ((moved, step),) = planned.items()
    source = next(node for name, _, node in LAYOUT if name == moved)
    assert c.node_of(bound) == f"{stage.ns}-{source}", "train bound on the freed node"
    evictions = stage.evictions(mark)
    assert [e["responseStatus"]["code"] for e in evictions] == [201]
    # The preflight: the same Eviction asked first with dryRun=All, before the node's taint.
    assert [e["responseStatus"]["code"] for e in stage.rehearsals(mark)] == [201]
    log = [e for e in stage.plane.audit_events()[mark:] if e["user"]["username"] == DAEMON]
    asked = next(i for i, e in enumerate(log) if "dryRun=All" in e.get("requestURI", ""))
    tainted = next(
        i for i, e in enumerate(log)
        if e["verb"] == "patch" and e.get("objectRef", {}).get("resource") == "nodes"
    )  # fmt: skip
    assert asked < tainted, (asked, tainted)
    replacement = c.wait_pods(stage.plane.admin, stage.ns, f"app={moved}", c.running(1), 30)[0]
    assert c.node_of(replacement) == step["to"], (step, c.node_of(replacement))
    # The seat before the move: the target was patched by the daemon before the eviction (the
    # owner reservation, defrag.io/reserved-for: owner:<ns>/ReplicaSet/<name>), and says so.
    evicted_at = next(
        i for i, e in enumerate(log)
        if e["verb"] == "create" and e.get("objectRef", {}).get("subresource") == "eviction"
        and "dryRun=All" not in e.get("requestURI", "")
    )  # fmt: skip
    seated = [
        i for i, e in enumerate(log)
        if e["verb"] == "patch" and e.get("objectRef", {}).get("name") == step["to"]
    ]  # fmt: skip
    assert seated and seated[0] < evicted_at, (seated, evicted_at)
    _wait_event(stage, "default", "Node", lambda name: name == step["to"])
    # Drain to bind: the extender sees the freed node at kube-scheduler's next attempt. (With
    # a view relisted every 10 s it was 45-58 s, or kube-scheduler's 5-minute flush; the
    # figures over 20 runs are bench/bench_controlplane.py's.)
    waited = drain_to_bind_s(stage, mark, bound["metadata"]["name"])
    assert waited < 30, waited
    # Events recorded on the pod (its namespace) and on the node (namespace default).
    node = f"{stage.ns}-{source}"
    _wait_event(stage, stage.ns, "Pod", lambda name: name.startswith(f"{moved}-"))
    _wait_event(stage, "default", "Node", lambda name: name == node)
    # Nothing left behind: no drain taint, no reservation once the pod is bound.
    _wait_clean_nodes(stage)
    assert train["metadata"]["name"] == bound["metadata"]["name"]


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
    result = once(stage, stage.settings(execution={"dry_run": False}))
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
    # The executor itself, as the daemon's ServiceAccount, given a plan that ignores the budget
    # (as a planner that had not seen it would): its preflight asks the Eviction API with
    # dryRun=All, gets the real 429 with its DisruptionBudget cause, and writes nothing on the
    # node — no taint, no journal, no eviction.
    api = connect(str(stage.kubeconfig))
    source = KubeClusterSource(api)
    snapshot = source.snapshot()
    victim = next(n for n in after if n.startswith("a-"))
    key = f"{stage.ns}/{victim}"
    node = snapshot.pods[key].node or ""
    target = next(n.name for n in snapshot.nodes if n.name.startswith(stage.ns) and n.name != node)
    ex = Executor(
        KubeActuator(api),
        source,
        SystemClock(),
        ExecutorSettings(replacement_timeout_s=5, poll_interval_s=0.5),
        mode=RunMode.live(leader_election=False),
    )
    mark = len(stage.plane.audit_events())
    plan = Plan("make-room", "e2e", (Step("migrate", key, node, target, "e2e"),), ())
    executed = ex.execute(plan, snapshot, WindowStatus(True, "e2e"))
    assert [(o.pod, o.result) for o in executed.outcomes] == [(key, "blocked")], executed
    assert "disruption budget" in executed.outcomes[0].reason.lower(), executed
    assert [e["responseStatus"]["code"] for e in stage.rehearsals(mark)] == [429]
    assert stage.evictions(mark) == []
    touched = [
        e for e in c.audit_writes(stage.plane, DAEMON, since=mark)
        if e.get("objectRef", {}).get("resource") == "nodes"
    ]  # fmt: skip
    assert touched == [], [(w["verb"], w["requestURI"]) for w in touched]
    # And the Eviction itself gets the same refusal with the API server's reason, never a delete.
    mark = len(stage.plane.audit_events())
    result = KubeActuator(api).evict(stage.ns, victim)
    assert result.outcome == "blocked", result
    assert "disruption budget" in result.reason.lower(), result
    assert [e["responseStatus"]["code"] for e in stage.evictions(mark)] == [429]
    assert victim in {p["metadata"]["name"] for p in c.pods(stage.plane.admin, stage.ns)}


def test_a_terminating_victim_is_never_evicted_again(stage: Stage) -> None:
    """The victim hangs in Terminating past the replacement wait; the cycles after it see a pod
    with a deletionTimestamp and neither evict it again nor charge a budget for it."""
    daemon, _, mark = _a_held_victim(stage, replacement_timeout_s=4)
    # The replacement wait (4 s) runs out, then several more 2 s cycles.
    c.wait_cycles(daemon, 5, 90)
    victims = [e["objectRef"]["name"] for e in stage.evictions(mark)]
    assert len(victims) == len(set(victims)), victims
    # the window's spend (on the Lease) counts each eviction once
    spend = window_spend(stage.plane.admin)
    assert sum(w["total"] for w in spend["windows"].values()) == len(victims), spend
    stage.kubelet.release(list(stage.kubelet.hold))
    bound_train(stage)
    _wait_clean_nodes(stage)
    victims = [e["objectRef"]["name"] for e in stage.evictions(mark)]
    assert len(victims) == len(set(victims)), victims


def test_a_new_leader_reconciles_a_drain_left_by_sigkill(stage: Stage) -> None:
    """Two replicas; the victim hangs in Terminating; the leader is SIGKILLed mid-drain."""
    first, settings, mark = _a_held_victim(stage, replacement_timeout_s=40, suffix="-1")
    tainted = c.wait_for(
        "the drain under way (the victim is held)",
        lambda: [n for n in stage.nodes if _defrag_marks(stage, n)],
        20,
    )
    second = c.start_daemon(
        stage.plane, stage.kubeconfig, settings, stage.rules, f"daemon-{stage.ns}-2"
    )
    first.process.proc.kill()  # SIGKILL mid-drain
    first.process.proc.wait()
    # what the first replica left (it may have released a seat between the read above and the
    # kill): the nodes the second one has to take up
    left = [n for n in stage.nodes if _defrag_marks(stage, n)]
    killed = len(stage.plane.audit_events())
    c.wait_for(
        "the second replica holds the Lease",
        lambda: (
            stage.plane.admin.get(LEASE)["spec"].get("holderIdentity") == f"daemon-{stage.ns}-2"
        ),
        60,
        second.process,
    )
    time.sleep(4)  # the new leader's first cycles, with the victim still Terminating
    stage.kubelet.release(list(stage.kubelet.hold))
    bound_train(stage)
    _wait_clean_nodes(stage)
    victims = [e["objectRef"]["name"] for e in stage.evictions(mark)]
    assert len(victims) == len(set(victims)), victims
    # The drain the first replica left was taken up by the second: it wrote to the tainted
    # node after the kill (the first one could not).
    patched = {
        e["objectRef"].get("name")
        for e in c.audit_writes(stage.plane, DAEMON, since=killed)
        if e["objectRef"].get("resource") == "nodes"
    }
    assert left and set(left) <= patched, (tainted, left, patched)


def _a_held_victim(
    stage: Stage, replacement_timeout_s: float, suffix: str = ""
) -> tuple[c.Served, Path, int]:
    """The 4-GPU pods held Terminating once evicted, the starving pod waiting, and an enforcing
    daemon started until its first eviction: (the daemon, its settings, the audit mark)."""
    stage.kubelet.hold.update({f"{stage.ns}/a-", f"{stage.ns}/b-"})
    stage.starving()
    time.sleep(3.5)  # past the rule's `for`
    mark = len(stage.plane.audit_events())
    settings = stage.settings(
        execution={"dry_run": False, "replacement_timeout_s": replacement_timeout_s},
        daemon={"ready_max_age_s": 60},
    )
    daemon = c.start_daemon(
        stage.plane, stage.kubeconfig, settings, stage.rules, f"daemon-{stage.ns}{suffix}"
    )
    c.wait_for("an eviction", lambda: stage.evictions(mark), 60, daemon.process)
    return daemon, settings, mark


def test_contradicting_settings_stop_the_daemon_before_it_touches_the_cluster(
    plane: ControlPlane, tmp_path: Path
) -> None:
    """A replacement wait longer than the cycle deadline once made the leader drop its own
    Lease mid-drain; now the daemon refuses to start, in one line naming both fields."""
    bad = c.write_yaml(
        tmp_path / "settings.yaml",
        {
            "execution": {"dry_run": False, "replacement_timeout_s": 65},
            "daemon": {"cycle_interval_s": 20},
        },
    )
    kubeconfig = plane.service_account_kubeconfig("defrag-system", "defrag")
    mark = len(plane.audit_events())
    done = subprocess.run(
        [c.defrag_path(), "run", "--kubeconfig", str(kubeconfig), "--settings", str(bad)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "replacement_timeout_s" in lines[0] and "cycle_interval_s" in lines[0], lines
    assert "Traceback" not in done.stderr
    assert [e for e in plane.audit_events()[mark:] if e["user"]["username"] == DAEMON] == []


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
