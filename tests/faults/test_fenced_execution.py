"""Fault injection: the executor against the emulated API server when leadership is lost, answers
are lost, the API throttles, a taint will not come off, or a crashed run left its marks.

Each test replays one failure issue 15 observed ("fenced execution") and says how it failed
before the change. They run the real ``kubernetes`` client against
:mod:`tests.support.kubeapi` and read its request log.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from defrag.adapters.kube import KubeActuator, KubeClusterSource, LeaseElector, RetryPolicy
from defrag.daemon.cycle import SystemClock, run_cycle
from defrag.daemon.service import Daemon
from defrag.decide import CycleConfig
from defrag.execute import EvictionBudget, Executor, ExecutorSettings, WindowStatus
from defrag.execute.executor import NOT_LEADER
from defrag.execute.fence import Fence, NoFence, Tenure
from defrag.execute.journal import OWNER_ANNOTATION, JournalStep, new_journal
from defrag.execute.mode import RunMode
from defrag.execute.reconcile import Reconciler
from defrag.execute.reservation import Reservation
from defrag.plan.model import Plan, Step
from tests.support import kubeobjects as k
from tests.support.kubeapi import KubeApi, running

FAST = RetryPolicy(attempts=3, backoff_s=0.0, timeout_s=2.0)
DRAIN = "defrag.io/draining"
OPEN = WindowStatus(True, "test", None)
NS = "defrag-system"


def cluster_objects() -> list[dict[str, Any]]:
    """gpu-1 runs four movable pods (one a StatefulSet's); gpu-2 and gpu-3 have room."""
    items = [k.node(f"gpu-{i}") for i in (1, 2, 3)]
    items += [
        k.pod(f"web-{c}", "inf", 1, node_name="gpu-1", owner=("ReplicaSet", f"web-{c}"))
        for c in "abc"
    ]
    items.append(k.pod("ledger-0", "inf", 1, node_name="gpu-1", owner=("StatefulSet", "ledger")))
    return items


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running(cluster_objects())


class Clock:
    """A settable clock (the Lease is judged by each replica's own clock)."""

    def __init__(self, offset_s: float = 0.0) -> None:
        self.offset = timedelta(seconds=offset_s)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


def elector(api: KubeApi, who: str, clock: Clock | None = None) -> LeaseElector:
    return LeaseElector(
        api.client(), NS, "defrag", identity=who, lease_duration_s=15, clock=clock, retry=FAST
    )


def executor(
    api: KubeApi, fence: Fence | None = None, mode: RunMode = RunMode.live(), **settings: Any
) -> Executor:
    client = api.client()
    return Executor(
        KubeActuator(client, retry=FAST),
        KubeClusterSource(client, retry=FAST),
        SystemClock(),
        ExecutorSettings(
            budgets=EvictionBudget(20, 20, 20),
            batch_size=settings.pop("batch_size", 1),
            replacement_timeout_s=1.0,
            poll_interval_s=0.02,
            untaint_backoff_s=0.0,
            **settings,
        ),
        mode=mode,
        fence=fence,
    )


def plan_of(*pods: str) -> Plan:
    return Plan(
        "repack", "test", tuple(Step("migrate", p, "gpu-1", "gpu-2", "t") for p in pods), ()
    )


def evictions(api: KubeApi) -> list[str]:
    """The Evictions sent, not their server-side dry runs (the executor's preflight)."""
    return [r.name for r in api.requests if r.resource == "pods/eviction" and not r.dry_run]


def taints(api: KubeApi, node: str) -> list[str]:
    return [t["key"] for t in (api.get("Node", node) or {}).get("spec", {}).get("taints", [])]


def notes(api: KubeApi, node: str) -> dict[str, str]:
    return dict((api.get("Node", node) or {}).get("metadata", {}).get("annotations", {}))


def leave_a_drain(api: KubeApi, owner: Tenure | None, reservation: bool = False) -> None:
    """Taint and journal on gpu-1, as a drain in progress (or a crashed one) leaves them."""
    act = KubeActuator(api.client(), retry=FAST)
    act.taint_node("gpu-1", DRAIN, "plan-x", "NoSchedule")
    steps = (JournalStep("inf/web-a", "inf/ReplicaSet/web-a"),)
    act.annotate_node(
        "gpu-1", new_journal("gpu-1", "plan-x", SystemClock().now(), steps, owner).annotations()
    )
    if reservation:
        act.annotate_node(
            "gpu-1", Reservation("gpu-1", "ml/trainer", SystemClock().now()).annotations()
        )


# --- leadership ------------------------------------------------------------------------------


def test_a_leader_that_loses_the_lease_mid_plan_evicts_nothing_more(api: KubeApi) -> None:
    """Before: leadership was checked once per cycle, so the deposed leader went on evicting
    (3 evictions here; the issue saw 2 more after the takeover). After: the fence is asked before
    every write, so the eviction during which the Lease changed hands is the last one, and the
    taint stays for the new leader to reconcile (the old one writes nothing more, not even that)."""
    a = elector(api, "replica-a")
    b = elector(api, "replica-b", Clock(offset_s=3600))  # its clock says a's hold has expired
    assert a.is_leader()

    def take_over(server: KubeApi, pod: dict[str, Any]) -> None:
        b.tick()  # the takeover lands during the first eviction

    api.on_eviction = take_over
    result = executor(api, fence=a).execute(
        plan_of("inf/web-a", "inf/web-b", "inf/web-c"),
        KubeClusterSource(api.client()).snapshot(),
        OPEN,
    )
    assert evictions(api) == ["web-a"]
    assert [(o.pod, o.result) for o in result.outcomes] == [
        ("inf/web-a", "evicted"),
        ("inf/web-b", "skipped"),
        ("inf/web-c", "skipped"),
    ]
    assert result.outcomes[1].reason == NOT_LEADER
    assert any("lost the Lease while draining gpu-1" in p for p in result.problems)
    assert taints(api, "gpu-1") == [DRAIN]  # not a write the old leader may make any more
    assert notes(api, "gpu-1")[OWNER_ANNOTATION] == "replica-a@0"
    # The new leader's reconcile rolls the drain back: its owner's generation is over; and it
    # releases the seat the old leader left on the target (gpu-2) for the replacements.
    outcomes = Reconciler(executor(api, fence=b)).reconcile()
    assert [(o.node, o.action) for o in outcomes] == [
        ("gpu-1", "rolled-back"),
        ("gpu-2", "released"),
    ]
    assert taints(api, "gpu-1") == []
    assert "defrag.io/reserved-for" not in notes(api, "gpu-2")


def test_a_leader_that_cannot_confirm_the_lease_writes_nothing(api: KubeApi) -> None:
    """Before: a failing Lease read changed nothing for a running execution. After: any doubt
    about the Lease (here the read answers 503 every time) stops the plan before its first write."""
    a = elector(api, "replica-a")
    assert a.is_leader()
    api.clear_log()
    api.fail("GET", "/leases/defrag$", 503, times=100)
    result = executor(api, fence=a).execute(
        plan_of("inf/web-a"), KubeClusterSource(api.client()).snapshot(), OPEN
    )
    assert result.counts == {"skipped": 1}
    assert [r for r in api.writes() if r.resource != "events"] == []


def test_reconcile_leaves_alone_a_drain_whose_owner_still_holds_the_lease(api: KubeApi) -> None:
    """Before: a reconcile untainted every drained node, including one whose owner was still
    draining it (the issue: the new leader untainted the node the old one was draining). After:
    the journal names its owner and Lease generation; while that holding is unexpired the node is
    deferred, and once it has expired the drain is rolled back."""
    a = elector(api, "replica-a")
    assert a.is_leader()
    leave_a_drain(api, a.tenure())
    b_clock = Clock()
    b = elector(api, "replica-b", b_clock)
    first = Reconciler(executor(api, fence=b)).reconcile()
    assert [(o.node, o.action, o.owner) for o in first] == [
        ("gpu-1", "deferred", "replica-a (lease generation 0)")
    ]
    assert taints(api, "gpu-1") == [DRAIN]
    b_clock.offset = timedelta(seconds=60)  # a stopped renewing: its hold lapses
    assert b.is_leader()
    second = Reconciler(executor(api, fence=b)).reconcile()
    assert [(o.node, o.action) for o in second] == [("gpu-1", "rolled-back")]
    assert taints(api, "gpu-1") == []


def test_the_daemon_fences_its_executor_with_its_elector(api: KubeApi) -> None:
    """Before: the daemon handed its elector to nobody but itself. After: the executor's fence is
    the daemon's LeaseElector (and a daemon without election keeps the no-op fence)."""
    from defrag.daemon.cycle import CyclePorts

    a = elector(api, "replica-a")
    ex = executor(api)
    ports = CyclePorts(ex.source, SystemClock(), lambda c, t, p: [], _no_plan, ex)
    Daemon(ports, CycleConfig(), elector=a)
    assert ex.fence is a
    ex2 = executor(api)
    Daemon(CyclePorts(ex2.source, SystemClock(), lambda c, t, p: [], _no_plan, ex2), CycleConfig())
    assert isinstance(ex2.fence, NoFence)


def _no_plan(cluster: Any, goal: str, now: datetime, *, profile: Any, pods: Any = None) -> Plan:
    return Plan(goal, "test", (), ())


# --- evictions -----------------------------------------------------------------------------------


def test_a_retried_eviction_never_evicts_the_same_named_replacement(api: KubeApi) -> None:
    """Before: the eviction carried no UID precondition; its answer lost (503 after the pod was
    evicted), the retry evicted the StatefulSet's replacement ledger-0 — 2 evictions for one
    step. After: ``deleteOptions.preconditions.uid`` makes the retry a 409, reported as gone."""

    def recreate(server: KubeApi, pod: dict[str, Any]) -> None:
        replacement = copy.deepcopy(pod)
        replacement["metadata"]["uid"] = str(uuid.uuid4())
        server.put(replacement)

    api.on_eviction = recreate
    api.fail("POST", "/pods/ledger-0/eviction$", 503, after=True, dry_run=False)
    planned = KubeClusterSource(api.client()).snapshot()
    result = executor(api).execute(plan_of("inf/ledger-0"), planned, OPEN)
    assert api.evicted == [("inf", "ledger-0")]  # once: the original
    assert [(o.pod, o.result) for o in result.outcomes] == [("inf/ledger-0", "gone")]
    assert "replacement" in result.outcomes[0].reason
    sent = [r.body for r in api.requests if r.resource == "pods/eviction" and not r.dry_run]
    # Since the chaos soak, the adapter reads the pod before trying again: the name is a
    # replacement's (another UID), so no second Eviction is sent at all.
    assert len(sent) == 1
    assert {b["deleteOptions"]["preconditions"]["uid"] for b in sent} == {
        planned.pods["inf/ledger-0"].uid
    }
    survivor = api.get("Pod", "ledger-0", "inf")
    assert survivor is not None and survivor["metadata"]["uid"] != planned.pods["inf/ledger-0"].uid


@pytest.mark.parametrize(
    ("throttled", "result", "tries"),
    [
        (1, "evicted", 2),  # once: the backoff retry goes through
        (100, "failed", 3),  # throughout: failed (FAST: 3 tries), never "blocked"
    ],
)
def test_api_throttling_is_retried_and_never_reported_as_a_pdb_block(
    api: KubeApi, throttled: int, result: str, tries: int
) -> None:
    """Before: a 429 without a DisruptionBudget cause (API priority and fairness) that outlasted
    the retries came back "blocked" with the PDB wording, and no alert. After: it is "failed",
    named as throttling, and the execution reports an ``execution-failed`` finding."""
    api.fail(
        "POST",
        "/pods/web-a/eviction$",
        429,
        times=throttled,
        message="too many requests",
        dry_run=False,
    )
    out = executor(api).execute(
        plan_of("inf/web-a"), KubeClusterSource(api.client()).snapshot(), OPEN
    )
    assert [o.result for o in out.outcomes] == [result]
    assert len(evictions(api)) == tries
    if result == "failed":
        assert "throttling" in out.outcomes[0].reason
        assert "disruption budget" not in out.outcomes[0].reason.lower()
        assert [f.kind for f in out.findings] == ["execution-failed"]


# --- untaint ---------------------------------------------------------------------------------


def test_a_taint_that_will_not_come_off_is_retried_and_alerted_until_it_does(
    api: KubeApi,
) -> None:
    """Before: a failed untaint left the node NoSchedule until a restart, and its
    ``execution-failed`` finding (subject ``cluster``) was gone the next cycle, so the alert
    resolved while the node stayed tainted. After: the untaint is retried with backoff, then every
    cycle (:meth:`Executor.maintain`); each cycle the node stays tainted reports the same finding
    (same fingerprint: the alert stays firing) and the first cycle it comes off reports none."""
    # Each node patch fails from the first eviction on: the drain's 2 untaint tries (3 requests
    # each with FAST), then the next cycle's try (3 more); the cycle after that succeeds.
    api.on_eviction = lambda server, pod: server.fail("PATCH", "/nodes/gpu-1$", 500, times=9)
    ex = executor(api, untaint_attempts=2)
    source = KubeClusterSource(api.client())
    run = ex.execute(plan_of("inf/web-a"), source.snapshot(), OPEN)
    assert taints(api, "gpu-1") == [DRAIN]
    node_findings = [f for f in run.findings if f.subject == "node/gpu-1"]
    assert len(node_findings) == 1 and node_findings[0].severity == "critical"
    fingerprint = node_findings[0].fingerprint
    cycles = []
    for _ in range(3):
        found = Reconciler(ex).maintain(source.snapshot())
        cycles.append(([f.fingerprint for f in found], taints(api, "gpu-1")))
    assert cycles == [
        ([fingerprint], [DRAIN]),  # still failing: still reported
        ([], []),  # retried next cycle: off, nothing to report (the alert resolves now)
        ([], []),
    ]


# --- leftovers -------------------------------------------------------------------------------


def test_dry_run_reports_a_crashed_runs_leftovers_and_writes_nothing(api: KubeApi) -> None:
    """Before: dry run never looked at leftovers (the taint and the reservation stayed, silently,
    and the extender kept honouring the reservation). After: each node carrying one is reported
    (a warning finding naming what is left), and dry run still writes nothing."""
    leave_a_drain(api, Tenure("crashed-0", 3), reservation=True)
    api.clear_log()
    ex = executor(api, mode=RunMode())
    found = Reconciler(ex).maintain(ex.source.snapshot())
    assert [(f.kind, f.subject, f.severity) for f in found] == [
        ("execution-failed", "node/gpu-1", "warning")
    ]
    assert "crashed-0 (lease generation 3)" in found[0].summary
    assert "reserved-for=ml/trainer" in found[0].summary
    assert api.writes() == []


def test_the_leader_cleans_a_crashed_runs_leftovers_every_cycle(api: KubeApi) -> None:
    """Before: leftovers were cleaned only by the reconcile at start; a crash of another replica
    after this one started (or a taint that came back) stayed until the next restart. After: the
    leader's cycle reconciles them (here a cycle in enforce mode with every window closed)."""
    ex = executor(api)
    ports = _ports(api, ex)
    run_cycle(ports, CycleConfig())  # started clean
    leave_a_drain(api, Tenure("crashed-0", 3), reservation=True)
    run_cycle(ports, CycleConfig())
    assert taints(api, "gpu-1") == []
    assert not {k for k in notes(api, "gpu-1") if k.startswith("defrag.io/")}


def _ports(api: KubeApi, ex: Executor) -> Any:
    from defrag.daemon.cycle import CyclePorts

    return CyclePorts(ex.source, SystemClock(), lambda c, t, p: [], _no_plan, ex)
