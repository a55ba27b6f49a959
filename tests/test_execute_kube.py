"""The executor and the cycle with the real Kubernetes client against the emulated API server.

Each test reads the server's request log: what was written, in which order, and what not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from defrag.adapters.kube import KubeActuator, KubeClusterSource, LeaseElector, RetryPolicy
from defrag.cli.run import _detector, _planner, default_rules_dir
from defrag.daemon.cycle import CyclePorts, SystemClock, run_cycle
from defrag.daemon.service import Daemon
from defrag.decide import CycleConfig
from defrag.execute import EvictionBudget, Executor, ExecutorSettings, Window, WindowStatus
from defrag.execute.journal import JOURNAL_ANNOTATIONS, JournalStep, new_journal
from defrag.execute.mode import RunMode
from defrag.execute.reconcile import Reconciler
from defrag.plan.model import Plan, Step
from defrag.rules import load_rules
from defrag.settings import load_settings
from tests.support import kubeobjects as k
from tests.support.kubeapi import KubeApi, running
from tests.support.snapshots import scattered_20

FAST = RetryPolicy(attempts=2, backoff_s=0.0, timeout_s=2.0)
DRAIN = "defrag.io/draining"
ALWAYS = (Window("* * * * *", 120),)
OPEN = WindowStatus(True, "test", None)


def ledger_pod(name: str) -> dict[str, Any]:
    """A 1-GPU pod of StatefulSet ``ledger`` on gpu-1, selected by the ``ledger`` PDB."""
    return k.pod(
        name, "inf", 1, node_name="gpu-1", owner=("StatefulSet", "ledger"), labels={"app": "ledger"}
    )


def small_cluster() -> list[dict[str, Any]]:
    """gpu-1 runs three movable pods and one under a PDB with no disruption left."""
    items = [k.node(f"gpu-{i}") for i in (1, 2, 3)]
    items += [
        k.pod("web-a", "inf", 2, node_name="gpu-1", owner=("ReplicaSet", "web-a")),
        k.pod("web-b", "inf", 2, node_name="gpu-1", owner=("ReplicaSet", "web-b")),
        k.pod("web-c", "inf", 1, node_name="gpu-1", owner=("ReplicaSet", "web-c")),
        ledger_pod("ledger-0"),
        k.pod("big-0", "inf", 6, node_name="gpu-2", owner=("ReplicaSet", "big")),
        k.pod("big-1", "inf", 6, node_name="gpu-3", owner=("ReplicaSet", "big")),
        k.pdb("ledger", "inf", match_labels={"app": "ledger"}, disruptions_allowed=0),
    ]
    return items


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running(small_cluster())


def executor(
    api: KubeApi,
    budgets: EvictionBudget | None = None,
    mode: RunMode = RunMode.live(),
    **kw: Any,
) -> Executor:
    client = api.client()
    settings = ExecutorSettings(
        budgets=budgets or EvictionBudget(20, 20, 20),
        replacement_timeout_s=kw.pop("timeout_s", 2.0),
        batch_size=kw.pop("batch_size", 2),
        poll_interval_s=0.02,
        **kw,
    )
    return Executor(
        KubeActuator(client, retry=FAST),
        KubeClusterSource(client, retry=FAST),
        SystemClock(),
        settings,
        mode=mode,
    )


def plan_of(*pods: str, source: str = "gpu-1", target: str = "gpu-2") -> Plan:
    steps = tuple(Step("migrate", p, source, target, "repack") for p in pods)
    return Plan("repack", "reserve-binpack", steps, ())


def evictions(api: KubeApi) -> list[str]:
    """The Evictions sent (not their server-side rehearsals, ``dryRun=All``)."""
    return [
        f"{r.namespace}/{r.name}"
        for r in api.requests
        if r.resource == "pods/eviction" and not r.dry_run
    ]


def rehearsals(api: KubeApi) -> list[str]:
    """The Evictions asked as a server-side dry run before any taint (the preflight)."""
    return [
        f"{r.namespace}/{r.name}"
        for r in api.requests
        if r.resource == "pods/eviction" and r.dry_run
    ]


def taints(api: KubeApi, node: str) -> list[dict[str, str]]:
    return (api.get("Node", node) or {}).get("spec", {}).get("taints", [])


def annotations(api: KubeApi, node: str) -> dict[str, str]:
    return (api.get("Node", node) or {}).get("metadata", {}).get("annotations", {})


def cycle_ports(api: KubeApi, **execution: Any) -> CyclePorts:
    """``execution``: settings of the ``execution`` section (``dry_run=False``)."""
    client = api.client()
    source = KubeClusterSource(client, retry=FAST)
    actuator = KubeActuator(client, retry=FAST)
    s = load_settings(None, {"planner.min_pod_age_s": 0, "execution": execution})
    ex = Executor(
        actuator,
        source,
        SystemClock(),
        ExecutorSettings(poll_interval_s=0.02, replacement_timeout_s=2.0),
        mode=s.run_mode,
    )
    return CyclePorts(
        source, SystemClock(), _detector(load_rules([default_rules_dir()]), None), _planner(s), ex
    )


@pytest.mark.parametrize("events", [False, True])
def test_dry_run_sends_no_write_request(events: bool) -> None:
    with KubeApi(scattered_20()["items"]) as server:
        result = run_cycle(cycle_ports(server, dry_run_events=events), CycleConfig())
        assert result.plan is not None and result.plan.steps  # there was something to do
        writes = server.writes()
        if not events:
            assert writes == []
        else:  # Events only, each one marked
            assert writes and {(w.method, w.resource) for w in writes} == {("POST", "events")}
            assert all(w.body["message"].endswith("(dry run)") for w in writes)


def test_drain_order_is_preflight_taint_journal_evictions_untaint(api: KubeApi) -> None:
    ex = executor(api)
    plan = plan_of("inf/web-a", "inf/web-b", "inf/web-c")
    result = ex.execute(plan, ex.source.snapshot(), OPEN)
    assert result.counts == {"evicted": 3}
    writes = [r for r in api.writes() if r.resource != "events"]
    # First every eviction as a server-side dry run (``?dryRun=All``), before anything changes.
    assert [(r.resource, r.dry_run) for r in writes[:3]] == [("pods/eviction", True)] * 3
    assert all(r.query["dryRun"] == ["All"] for r in writes[:3])
    node_writes = [(r.method, r.resource, r.name) for r in writes[3:]]
    taint_journal = [("PATCH", "nodes", "gpu-1")] * 2
    seat = [("PATCH", "nodes", "gpu-2")]  # the target kept for the replacements (item 4)
    assert node_writes[:3] == taint_journal + seat
    assert [w[:2] for w in node_writes[3:6]] == [("POST", "pods/eviction")] * 3
    assert not any(r.dry_run for r in writes[3:])
    # untaint, clear the journal; then the seat goes (no scheduler here: at the timeout)
    assert node_writes[6:] == [("PATCH", "nodes", "gpu-1")] * 2 + seat
    assert taints(api, "gpu-1") == []
    assert not set(JOURNAL_ANNOTATIONS) & set(annotations(api, "gpu-1"))
    # Evictions use the policy/v1 Eviction subresource; nothing is deleted directly.
    assert not [r for r in api.requests if r.method == "DELETE"]


def test_a_pdb_refusal_in_the_preflight_writes_nothing_on_its_node(api: KubeApi) -> None:
    """ledger-0's PDB allows no disruption: the server dry run answers 429 with the
    DisruptionBudget cause, so gpu-1 is never tainted and web-a, beside it, is not evicted."""
    ex = executor(api)
    result = ex.execute(plan_of("inf/ledger-0", "inf/web-a"), ex.source.snapshot(), OPEN)
    assert [(o.pod, o.result) for o in result.outcomes] == [
        ("inf/ledger-0", "blocked"),
        ("inf/web-a", "skipped"),
    ]
    assert "disruption budget" in result.outcomes[0].reason
    assert "drain of gpu-1 not started" in result.outcomes[1].reason
    assert sorted(rehearsals(api)) == ["inf/ledger-0", "inf/web-a"] and evictions(api) == []
    assert [r for r in api.writes() if r.resource not in ("events", "pods/eviction")] == []
    assert api.get("Pod", "ledger-0", "inf") is not None and api.evicted == []
    assert ex.ledger.total == 0  # both steps' budget given back
    events = [r.body for r in api.writes() if r.resource == "events"]
    skipped = [e for e in events if e["involvedObject"]["name"] == "ledger-0"]
    assert skipped and skipped[0]["type"] == "Warning" and skipped[0]["reason"] == "DefragSkipped"
    assert "disruption budget" in skipped[0]["message"]


def test_a_429_at_eviction_time_still_skips_that_pod_and_the_drain_goes_on() -> None:
    """Each pod is asked alone: with one disruption allowed, ledger-0 and ledger-1 both pass the
    preflight; the first eviction spends it and the second is refused (429) — a skip with its
    reason and a Warning Event, never a delete; the rest of the drain goes on."""
    items = small_cluster()
    items.append(ledger_pod("ledger-1"))
    items = [
        k.pdb("ledger", "inf", match_labels={"app": "ledger"}, disruptions_allowed=1)
        if i["kind"] == "PodDisruptionBudget"
        else i
        for i in items
    ]
    with KubeApi(items) as server:
        ex = executor(server, batch_size=1)  # one at a time: ledger-0 goes first
        plan = plan_of("inf/ledger-0", "inf/ledger-1", "inf/web-a")
        result = ex.execute(plan, ex.source.snapshot(), OPEN)
        assert [(o.pod, o.result) for o in result.outcomes] == [
            ("inf/ledger-0", "evicted"),
            ("inf/ledger-1", "blocked"),
            ("inf/web-a", "evicted"),
        ]
        assert "disruption budget" in result.outcomes[1].reason
        assert sorted(rehearsals(server)) == ["inf/ledger-0", "inf/ledger-1", "inf/web-a"]
        assert server.get("Pod", "ledger-1", "inf") is not None
        events = [r.body for r in server.writes() if r.resource == "events"]
        (warning,) = [e for e in events if e["involvedObject"]["name"] == "ledger-1"]
        assert warning["type"] == "Warning" and warning["reason"] == "DefragSkipped"


@pytest.mark.parametrize(("per_window", "per_node"), [(1, 20), (20, 2)])
def test_evictions_never_exceed_the_budgets(api: KubeApi, per_window: int, per_node: int) -> None:
    ex = executor(api, EvictionBudget(per_window, per_node, 20))
    plan = plan_of("inf/web-a", "inf/web-b", "inf/web-c")
    ex.execute(plan, ex.source.snapshot(), OPEN)
    ex.execute(
        plan_of("inf/big-0", source="gpu-2", target="gpu-3"),
        ex.source.snapshot(),
        OPEN,
    )
    sent = evictions(api)
    assert len(sent) <= per_window
    assert sum(1 for p in sent if p.startswith("inf/web-")) <= per_node


def test_crash_mid_drain_then_restart_reconciles_and_untaints(api: KubeApi) -> None:
    client = api.client()
    actuator = KubeActuator(client, retry=FAST)
    pods = ["inf/web-a", "inf/web-b", "inf/web-c"]
    # The crashed daemon got this far: taint, journal, two of three evictions. Then SIGKILL.
    actuator.taint_node("gpu-1", DRAIN, "plan-dead", "NoSchedule")
    journal = new_journal(
        "gpu-1",
        "plan-dead",
        SystemClock().now(),
        tuple(JournalStep(p, f"inf/ReplicaSet/{p[4:]}") for p in pods),
    )
    actuator.annotate_node("gpu-1", journal.annotations())
    for p in pods[:2]:
        actuator.evict("inf", p[4:])
    assert taints(api, "gpu-1")[0]["value"] == "plan-dead"
    restarted = executor(api)
    outcomes = Reconciler(restarted).reconcile()
    assert [(o.node, o.plan_id, o.action, o.remaining) for o in outcomes] == [
        ("gpu-1", "plan-dead", "rolled-back", ("inf/web-c",)),
    ]
    assert all(taints(api, n) == [] for n in ("gpu-1", "gpu-2", "gpu-3"))
    assert not set(JOURNAL_ANNOTATIONS) & set(annotations(api, "gpu-1"))
    assert api.get("Pod", "web-c", "inf") is not None  # the rest is not evicted blindly
    assert json.loads(json.dumps([o.to_dict() for o in outcomes]))  # reportable


def test_replacements_stuck_pending_open_the_breaker(api: KubeApi) -> None:
    def controller(server: KubeApi, evicted: dict[str, Any]) -> None:
        # The ReplicaSet recreates the pod; no node has room, so it stays Pending.
        server.put(k.pod("web-a-x7k2p", "inf", 2, owner=("ReplicaSet", "web-a")))

    api.on_eviction = controller
    ex = executor(api, timeout_s=0.2)
    result = ex.execute(plan_of("inf/web-a"), ex.source.snapshot(), OPEN)
    assert result.stuck == ("inf/ReplicaSet/web-a",)
    assert ex.breaker.state.open
    assert sorted(f.kind for f in result.findings) == ["circuit-open", "execution-failed"]
    assert taints(api, "gpu-1") == []
    again = ex.execute(plan_of("inf/web-b"), ex.source.snapshot(), OPEN)
    assert again.counts == {"skipped": 1} and evictions(api) == ["inf/web-a"]


def test_only_the_lease_holder_executes() -> None:
    with KubeApi(scattered_20()["items"]) as server:
        daemons = []
        for who in ("a", "b"):
            elector = LeaseElector(
                server.client(),
                "defrag-system",
                "defrag",
                identity=who,
                lease_duration_s=15,
                retry=FAST,
            )
            daemons.append(
                Daemon(
                    cycle_ports(server, dry_run=False),
                    CycleConfig(windows=ALWAYS),
                    elector=elector,
                )
            )
        first, second = (d.run_once() for d in daemons)
        assert (first.leader, second.leader) == (True, False)
        assert first.executed is not None and first.executed.evicted
        assert second.executed is None
        assert len(evictions(server)) == len(first.executed.outcomes) - first.executed.counts.get(
            "skipped", 0
        )
        lease = server.get("Lease", "defrag", "defrag-system")
        assert lease is not None and lease["spec"]["holderIdentity"] == "a"


def run_defrag(settings: Path, kubeconfig_path: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEFRAG_")}
    env.update(
        {
            "DEFRAG_CLUSTER__KUBECONFIG": str(kubeconfig_path),
            "DEFRAG_LEADERSHIP__IDENTITY": "defrag-0",
        }
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from defrag.cli import main; main()",
            "run",
            "--once",
            "--no-dry-run",
            "--settings",
            str(settings),
            *args,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_killed_mid_drain_then_restarted_leaves_no_node_tainted(tmp_path: Path) -> None:
    from tests.test_daemon_cli import kubeconfig

    live = tmp_path / "live.yaml"
    live.write_text(
        "windows: {schedule: [{cron: '* * * * *', length_s: 120}]}\n"
        "planner: {min_pod_age_s: 0}\n"
        "execution: {batch_size: 1, poll_interval_s: 0.2, replacement_timeout_s: 600}\n"
    )
    closed = tmp_path / "closed.yaml"
    closed.write_text("windows: {schedule: []}\n")
    with KubeApi(scattered_20()["items"]) as server:
        # The second eviction request hangs until the test has killed the process, then fails:
        # the kill always lands while the node is tainted and one pod is gone. The test waits on
        # that request's arrival (an Event), not on the clock; the timeout is only a safety net.
        second_arrived, release = threading.Event(), threading.Event()
        handle = server.handle
        seen = {"evictions": 0}

        def hold_second_eviction(
            method: str, raw_path: str, body: bytes, content_type: str
        ) -> tuple[int, bytes]:
            path, _, query = raw_path.partition("?")
            if method == "POST" and path.endswith("/eviction") and "dryRun=All" not in query:
                seen["evictions"] += 1
                if seen["evictions"] >= 2:
                    second_arrived.set()
                    release.wait(timeout=600)
                    return 503, b'{"kind": "Status", "code": 503}'
            return handle(method, raw_path, body, content_type)

        server.handle = hold_second_eviction  # type: ignore[method-assign]
        config = kubeconfig(tmp_path, server.url)
        first = run_defrag(live, config)
        try:
            waited = 0.0
            while not second_arrived.wait(timeout=0.5) and first.poll() is None and waited < 600:
                waited += 0.5
            if second_arrived.is_set():
                first.send_signal(signal.SIGKILL)
        finally:
            release.set()
            if first.poll() is None:
                first.kill()
            _, first_err = first.communicate()
        server.handle = handle  # type: ignore[method-assign]
        assert second_arrived.is_set(), (
            f"defrag exited {first.returncode} before its second eviction; stderr:\n{first_err}"
        )
        tainted = [
            n["metadata"]["name"]
            for n in server.objects("Node")
            if any(t["key"] == DRAIN for t in n.get("spec", {}).get("taints", []))
        ]
        # The crash left its trail.
        assert len(tainted) == 1 and len(server.evicted) == 1, first_err
        # The restart (in this process, same identity: it holds the Lease at once).
        from typer.testing import CliRunner

        from defrag.cli import app

        second = CliRunner().invoke(
            app,
            ["run", "--once", "--no-dry-run", "--settings", str(closed), "-o", "json"],
            env={
                "DEFRAG_CLUSTER__KUBECONFIG": str(config),
                "DEFRAG_LEADERSHIP__IDENTITY": "defrag-0",
            },
        )
        assert second.exit_code == 0, second.output
        assert json.loads(second.stdout)["executed"] is None  # no window: nothing new
        for node in server.objects("Node"):
            assert not [t for t in node.get("spec", {}).get("taints", []) if t["key"] == DRAIN]
            assert not set(JOURNAL_ANNOTATIONS) & set(node["metadata"].get("annotations", {}))
        reconciled = [
            r.body
            for r in server.writes()
            if r.resource == "events" and r.body.get("reason") == "DefragReconciled"
        ]
        assert len(reconciled) == 1 and "rolled-back" in reconciled[0]["message"]


# --- pods already Terminating ------------------------------------------------------------------


def mark_deleted(api: KubeApi, name: str, namespace: str = "inf") -> None:
    """What the API server does on a graceful delete (or an eviction) of a pod whose kubelet
    has not confirmed yet: ``metadata.deletionTimestamp`` (RFC 3339, now + the grace period)
    and ``deletionGracePeriodSeconds`` set; the pod stays listed, Running, until it is gone."""
    pod = api.get("Pod", name, namespace)
    assert pod is not None
    pod["metadata"]["deletionTimestamp"] = "2026-11-29T12:00:30Z"
    pod["metadata"]["deletionGracePeriodSeconds"] = 30
    api.put(pod)


def test_a_terminating_pod_is_not_evicted_and_spends_no_budget(api: KubeApi) -> None:
    """Before: web-a, already Terminating, was evicted again and charged to the namespace
    budget (1 of 1 in inf), so web-b was skipped ("namespace budget: 1 of 1 evictions in inf
    spent"). Now web-a gets no Eviction call and no charge ("gone": already going), web-b is
    evicted with the one eviction inf may spend, and the drain waits until web-a is gone."""
    mark_deleted(api, "web-a")
    ex = executor(api, EvictionBudget(total=20, per_node=20, per_namespace=1))
    cluster = ex.source.snapshot()
    threading.Timer(0.3, api.remove, ("Pod", "web-a", "inf")).start()  # its kubelet is done
    result = ex.execute(plan_of("inf/web-a", "inf/web-b"), cluster, OPEN)
    assert evictions(api) == ["inf/web-b"]
    assert result.counts == {"evicted": 1, "gone": 1}
    (going,) = [o for o in result.outcomes if o.pod == "inf/web-a"]
    assert going.reason.startswith("terminating: being deleted since 2026-11-29T12:00:30Z")
    assert (ex.ledger.total, ex.ledger.by_namespace["inf"]) == (1, 1)  # web-b only
    assert result.problems == ()  # web-a left within the replacement timeout
    assert api.get("Pod", "web-a", "inf") is None


def test_the_drain_waits_for_a_terminating_pod_at_most_the_replacement_timeout(
    api: KubeApi,
) -> None:
    mark_deleted(api, "web-a")  # stuck Terminating (a finalizer, a dead kubelet)
    ex = executor(api, timeout_s=0.3)
    result = ex.execute(plan_of("inf/web-a"), ex.source.snapshot(), OPEN)
    assert evictions(api) == []
    assert result.counts == {"gone": 1}
    assert result.problems == ("still Terminating 0.3 s later: inf/web-a",)
    assert taints(api, "gpu-1") == []  # the drain ended all the same


def test_a_pod_terminating_by_its_drain_is_not_evicted_and_its_budget_is_given_back(
    api: KubeApi,
) -> None:
    """big-0 was running when planned and is Terminating by the time gpu-2's drain comes (it
    starts deleting while gpu-1 drains): no Eviction call for it, and the budget its step was
    admitted with (1 of the window's 2) is given back: 2 admitted − 1 = 1 spent."""

    def delete_big(server: KubeApi, evicted: dict[str, Any]) -> None:
        if evicted["metadata"]["name"] == "web-a":
            mark_deleted(server, "big-0")
            threading.Timer(0.3, server.remove, ("Pod", "big-0", "inf")).start()

    api.on_eviction = delete_big
    ex = executor(api, EvictionBudget(total=2, per_node=20, per_namespace=20))
    plan = Plan(
        "repack",
        "reserve-binpack",
        (
            Step("migrate", "inf/web-a", "gpu-1", "gpu-3", "repack"),
            Step("migrate", "inf/big-0", "gpu-2", "gpu-3", "repack"),
        ),
        (),
    )
    result = ex.execute(plan, ex.source.snapshot(), OPEN)
    assert evictions(api) == ["inf/web-a"]
    assert result.counts == {"evicted": 1, "gone": 1}
    assert ex.ledger.total == 1


def test_dry_run_shows_a_terminating_pod_as_gone_and_spends_nothing(api: KubeApi) -> None:
    mark_deleted(api, "web-a")
    ex = executor(api, EvictionBudget(total=20, per_node=20, per_namespace=1), RunMode())
    cluster = ex.source.snapshot()
    result = ex.execute(plan_of("inf/web-a", "inf/web-b"), cluster, OPEN)
    assert [(o.pod, o.result) for o in result.outcomes] == [
        ("inf/web-a", "gone"),
        ("inf/web-b", "planned"),
    ]
    assert api.writes() == []


class CheckpointingWorkload(threading.Thread):
    """Plays a workload that honours the checkpoint handshake (docs/daemon.md): once its pod
    carries ``defrag.io/checkpoint-requested``, it writes ``defrag.io/last-checkpoint`` (the
    time now, RFC 3339) through its own client, as a sidecar with ``patch`` on its pod would."""

    def __init__(self, api: KubeApi, namespace: str, name: str) -> None:
        super().__init__(daemon=True)
        self.api, self.namespace, self.name = api, namespace, name
        self.stop = threading.Event()
        self.wrote = ""

    def run(self) -> None:
        from datetime import UTC, datetime

        writer = KubeActuator(self.api.client(), retry=FAST)
        while not self.stop.wait(0.02):
            pod = self.api.get("Pod", self.name, self.namespace) or {}
            notes = pod.get("metadata", {}).get("annotations") or {}
            if "defrag.io/checkpoint-requested" in notes and not self.wrote:
                self.wrote = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                writer.annotate_pod(
                    self.namespace, self.name, {"defrag.io/last-checkpoint": self.wrote}
                )


def test_a_supporting_pod_is_asked_by_a_pod_patch_after_the_taint_and_before_its_eviction() -> None:
    items = small_cluster()
    (web_a,) = [i for i in items if i["metadata"]["name"] == "web-a"]
    web_a["metadata"].setdefault("annotations", {})["defrag.io/checkpoint"] = "supported"
    with KubeApi(items) as server:
        workload = CheckpointingWorkload(server, "inf", "web-a")
        workload.start()
        try:
            ex = executor(server, checkpoint_wait_s=30.0)
            plan = plan_of("inf/web-a", "inf/web-b")
            result = ex.execute(plan, ex.source.snapshot(), OPEN)
        finally:
            workload.stop.set()
            workload.join()
        by_pod = {o.pod: o for o in result.outcomes}
        assert by_pod["inf/web-a"].checkpoint == "checkpointed"
        assert by_pod["inf/web-b"].checkpoint == ""  # never asked: no annotation
        assert result.counts == {"evicted": 2}
        writes = [
            (r.method, r.resource, r.name)
            for r in server.writes()
            if r.resource != "events" and not r.dry_run
        ]
        request = writes.index(("PATCH", "pods", "web-a"))  # defrag's request, then the answer
        # taint, journal and the target's seat first
        assert writes[:request] == [("PATCH", "nodes", "gpu-1")] * 2 + [("PATCH", "nodes", "gpu-2")]
        answer = writes.index(("PATCH", "pods", "web-a"), request + 1)
        assert writes.index(("POST", "pods/eviction", "web-a")) > answer
        (asked,) = [r.body for r in server.writes() if r.resource == "pods" and r.name == "web-a"][
            :1
        ]
        notes = asked["metadata"]["annotations"]
        assert set(notes) == {"defrag.io/checkpoint-requested", "defrag.io/checkpoint-deadline"}
        events = [e["reason"] for e in server.objects("Event")]
        assert "DefragCheckpointRequested" in events and "DefragCheckpointed" in events
