"""The executor over the simulated cluster: drains, Events, budgets, 429s, breaker, reconcile."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest

from defrag.adapters.simcluster import SIM_START, SimClock, SimCluster, fragmented_cluster
from defrag.execute import EvictionBudget, Executor, ExecutorSettings, WindowStatus
from defrag.execute.journal import JOURNAL_ANNOTATIONS, PLAN_ANNOTATION, JournalStep, new_journal
from defrag.execute.mode import RunMode
from defrag.execute.reconcile import Reconciler
from defrag.model.cluster import Cluster
from defrag.model.resources import DRAIN_TAINT_KEY, Node, OwnerRef, Pod
from defrag.plan.model import Plan, Step
from defrag.ports import EvictionResult

OPEN = WindowStatus(True, "test window", SIM_START)


def movable_on(cluster: Cluster, node: str) -> list[Pod]:
    return sorted(
        (
            p
            for p in cluster.pods_on(node)
            if p.namespace == "inference"
            and p.owner
            and p.owner.name != "lg"
            and "defrag.io/evictable" not in p.annotations
        ),
        key=lambda p: p.key,
    )


LIVE = RunMode.live()


def plan_for(pods: list[Pod], target: str | None = "gpu-01", gang: str | None = None) -> Plan:
    steps = tuple(
        Step("migrate" if target else "preempt", p.key, p.node or "", target, "repack", gang=gang)
        for p in pods
    )
    return Plan("repack", "reserve-binpack", steps, ())


def make(
    cluster: Cluster | None = None,
    budgets: EvictionBudget | None = None,
    timeout_s: float = 120,
    mode: RunMode = LIVE,
) -> tuple[SimCluster, Executor]:
    clock = SimClock(speedup=0)  # time moves only when the executor sleeps
    sim = SimCluster(cluster or fragmented_cluster(), clock)
    settings = ExecutorSettings(
        budgets=budgets or EvictionBudget(50, 50, 50),
        batch_size=2,
        replacement_timeout_s=timeout_s,
        poll_interval_s=10,
    )
    return sim, Executor(sim, sim, clock, settings, mode=mode, sleep=clock.sleep)


def test_dry_run_changes_nothing_and_marks_its_events() -> None:
    sim, ex = make(mode=RunMode(dry_run=True, events=True))
    cluster = sim.snapshot()
    pods = movable_on(cluster, "gpu-00")
    result = ex.execute(plan_for(pods), cluster, OPEN)
    assert [o.result for o in result.outcomes] == ["planned"] * len(pods)
    assert sim.evictions == []
    assert sim.snapshot() is cluster  # not one change: the same object comes back
    assert sim.events and all(e.message.endswith("(dry run)") for e in sim.events)
    assert {e.name for e in sim.events if e.kind == "Pod"} == {p.name for p in pods}


def test_drain_evicts_waits_for_replacements_and_untaints() -> None:
    sim, ex = make()
    cluster = sim.snapshot()
    pods = movable_on(cluster, "gpu-00")  # embed-001, embed-002 (2 GPUs), chat-004 (1 GPU)
    result = ex.execute(plan_for(pods), cluster, OPEN)
    assert result.counts == {"evicted": 3}
    after = sim.snapshot()
    node = after.node("gpu-00")
    assert node.taints == () and not set(JOURNAL_ANNOTATIONS) & set(node.annotations)
    # Every replacement runs, none back on the drained node (the taint kept them off).
    replacements = [p for p in after.pods.values() if p.uid.startswith("sim-")]
    assert len(replacements) == 3 and all(p.node not in (None, "gpu-00") for p in replacements)
    reasons = [e.reason for e in sim.events]
    # The target (gpu-01) is seated for the three owners' replacements before the drain, and
    # released once they run, before the drain is reported finished.
    assert reasons[:2] == ["DefragReserved", "DefragDrainStarted"]
    assert reasons[-2:] == ["DefragReservationReleased", "DefragDrainFinished"]
    assert reasons.count("DefragEvicted") == 3


def test_journal_is_on_the_node_before_the_first_eviction() -> None:
    sim, ex = make()
    seen: list[Mapping[str, str]] = []
    evict = sim.evict

    def spy(namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        node = sim.snapshot().node("gpu-00")
        seen.append({**node.annotations, "taint": ",".join(t.value for t in node.taints)})
        return evict(namespace, name, uid=uid)

    sim.evict = spy  # type: ignore[method-assign]
    cluster = sim.snapshot()
    plan = plan_for(movable_on(cluster, "gpu-00"))
    ex.execute(plan, cluster, OPEN)
    assert seen and all(s[PLAN_ANNOTATION] == plan.id and s["taint"] == plan.id for s in seen)
    assert '"pod": "inference/embed-001"' in seen[0]["defrag.io/drain-steps"]


def test_a_pdb_refusal_found_before_the_drain_leaves_its_node_untouched() -> None:
    """The preflight asks every eviction as a server dry run before the first taint: gpu-00's
    ledger pod (PDB "ledger", disruptionsAllowed 0) is refused, so nothing on gpu-00 is touched
    — no taint, no eviction of its three movable pods, their budget given back — while gpu-02,
    whose pods all pass, is drained."""
    sim, ex = make()
    cluster = sim.snapshot()
    ledger_pod = cluster.pods["inference/chat-003"]  # on gpu-00
    elsewhere = movable_on(cluster, "gpu-02")
    plan = plan_for([ledger_pod, *movable_on(cluster, "gpu-00"), *elsewhere], target="gpu-05")
    result = ex.execute(plan, cluster, OPEN)
    first = result.outcomes[0]
    assert (first.pod, first.result) == ("inference/chat-003", "blocked")
    assert "server dry run" in first.reason and "disruption budget" in first.reason
    on_00 = [o for o in result.outcomes[1:] if o.source == "gpu-00"]
    assert len(on_00) == 3 and {o.result for o in on_00} == {"skipped"}
    assert all("drain of gpu-00 not started" in o.reason for o in on_00)
    assert "inference/chat-003" in on_00[0].reason
    assert {o.result for o in result.outcomes if o.source == "gpu-02"} == {"evicted"}
    assert {e.pod.split("/")[1] for e in sim.evictions} == {p.name for p in elsewhere}
    assert len(sim.rehearsals) == len(plan.steps)  # every pod asked once, nothing changed
    assert not any(e.name == "gpu-00" and e.reason == "DefragDrainStarted" for e in sim.events)
    assert sim.snapshot().node("gpu-00").taints == ()
    # Budgets: only gpu-02's evictions are spent (gpu-00's four were given back).
    assert ex.ledger.total == len(elsewhere)
    warning = [e for e in sim.events if e.name == "chat-003"]
    assert warning[0].reason == "DefragSkipped" and warning[0].warning


def test_a_gang_with_a_pod_on_a_refused_node_stops_whole_and_so_do_its_nodes() -> None:
    """gpu-00 is refused (its ledger pod); a gang has one pod there and one on gpu-01: the gang
    cannot go whole, so gpu-01 would keep its pod and is not freed either — nothing on gpu-00 or
    gpu-01 is evicted. gpu-02 has no part in it and is drained."""
    sim, ex = make()
    cluster = sim.snapshot()
    on_00, on_01, on_02 = (movable_on(cluster, n) for n in ("gpu-00", "gpu-01", "gpu-02"))

    def step(pod: Pod, gang: str | None = None) -> Step:
        return Step("migrate", pod.key, pod.node or "", "gpu-05", "repack", gang=gang)

    steps = (
        step(cluster.pods["inference/chat-003"]),
        step(on_00[0], gang="inference/pair"),
        step(on_01[0], gang="inference/pair"),
        *(step(p) for p in on_01[1:]),
        *(step(p) for p in on_02),
    )
    result = ex.execute(Plan("repack", "reserve-binpack", steps, ()), cluster, OPEN)
    by_node: dict[str, set[str]] = {}
    for o in result.outcomes:
        by_node.setdefault(o.source, set()).add(o.result)
    assert by_node == {
        "gpu-00": {"blocked", "skipped"},
        "gpu-01": {"skipped"},
        "gpu-02": {"evicted"},
    }
    gang_on_01 = next(o for o in result.outcomes if o.pod == on_01[0].key)
    assert "a gang with a pod here has one on a node a disruption budget stops" in gang_on_01.reason
    assert {e.pod for e in sim.evictions} == {p.key for p in on_02}


def test_a_gang_that_does_not_fit_the_budget_is_skipped_whole() -> None:
    sim, ex = make(budgets=EvictionBudget(total=3, per_node=50, per_namespace=50))
    cluster = sim.snapshot()
    gang = movable_on(cluster, "gpu-01")  # 4 pods > 3
    result = ex.execute(plan_for(gang, gang="inference/job"), cluster, OPEN)
    assert {o.result for o in result.outcomes} == {"skipped"} and sim.evictions == []


def test_closed_window_or_open_breaker_sends_nothing() -> None:
    sim, ex = make()
    cluster = sim.snapshot()
    plan = plan_for(movable_on(cluster, "gpu-00"))
    closed = ex.execute(plan, cluster, WindowStatus(False, "outside"))
    assert {o.result for o in closed.outcomes} == {"skipped"}
    assert all(o.reason.startswith("window closed") for o in closed.outcomes)
    ex.breaker.trip(("x/ReplicaSet/y",), "test", SIM_START)
    tripped = ex.execute(plan, cluster, OPEN)
    assert all(o.reason.startswith("circuit breaker open") for o in tripped.outcomes)
    assert sim.evictions == []


def tight_cluster() -> Cluster:
    """Two 4-GPU nodes; a 3-GPU pod on each: an evicted pod fits only back where it was."""
    nodes = [Node(f"n{i}", 32_000, 65_536, num_gpu=4, gpu_model="L4") for i in (1, 2)]
    pods = [
        Pod(
            f"job-{i}",
            "ml",
            num_gpu=3,
            owner=OwnerRef("ReplicaSet", f"job-{i}"),
            phase="Running",
            node=f"n{i}",
        )
        for i in (1, 2)
    ]
    return Cluster.build(nodes, pods)


def test_replacements_stuck_pending_open_the_breaker_until_they_run() -> None:
    sim, ex = make(tight_cluster(), timeout_s=60)
    cluster = sim.snapshot()
    result = ex.execute(plan_for([cluster.pods["ml/job-1"]], target="n2"), cluster, OPEN)
    assert result.stuck == ("ml/ReplicaSet/job-1",)
    assert ex.breaker.state.open and "Pending longer than 60 s" in ex.breaker.state.reason
    kinds = sorted(f.kind for f in result.findings)
    assert kinds == ["circuit-open", "execution-failed"]
    assert sim.snapshot().node("n1").taints == ()  # untainted even so
    # The breaker holds later plans back...
    blocked = ex.execute(plan_for([cluster.pods["ml/job-2"]], target="n1"), sim.snapshot(), OPEN)
    assert blocked.counts == {"skipped": 1}
    # ...until the replacement is scheduled (n1 is free again, so the scheduler places it).
    assert not ex.breaker.refresh(sim.snapshot()).open


class Lagging:
    """A source that answers the cluster as it was when it fell behind (a watched store whose
    watch is down): what it shows happened, what happened since it does not show."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.reads = 0

    def snapshot(self) -> Cluster:
        self.reads += 1
        return self.cluster


@pytest.mark.parametrize("confirmed", [False, True])
def test_a_drain_is_done_only_when_a_fresh_read_says_so(confirmed: bool) -> None:
    sim, _ = make(tight_cluster(), timeout_s=60)
    cluster = sim.snapshot()
    lagging = Lagging(cluster)  # before the eviction: no replacement pending in it
    clock = sim.clock
    settings = ExecutorSettings(
        budgets=EvictionBudget(50, 50, 50), batch_size=2, replacement_timeout_s=60,
        poll_interval_s=10,
    )  # fmt: skip
    ex = Executor(
        sim, lagging, clock, settings, mode=LIVE, sleep=clock.sleep,
        confirm=sim if confirmed else None,
    )  # fmt: skip
    result = ex.execute(plan_for([cluster.pods["ml/job-1"]], target="n2"), cluster, OPEN)
    assert lagging.reads >= 1
    if confirmed:
        # the lagging read showed nothing pending; the fresh one, the stuck replacement
        assert result.stuck == ("ml/ReplicaSet/job-1",) and ex.breaker.state.open
    else:
        assert result.stuck == () and not ex.breaker.state.open  # the lag taken for done


def test_stop_request_finishes_the_batch_untaints_and_sends_no_more() -> None:
    sim, ex = make()
    evict = sim.evict

    def stop_after_first(namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        ex.stop_requested.set()  # SIGTERM arrives while the first batch is out
        return evict(namespace, name, uid=uid)

    sim.evict = stop_after_first  # type: ignore[method-assign]
    cluster = sim.snapshot()
    pods = movable_on(cluster, "gpu-01") + movable_on(cluster, "gpu-02")
    result = ex.execute(plan_for(pods, target="gpu-05"), cluster, OPEN)
    assert result.stopped
    assert [o.result for o in result.outcomes[:2]] == ["evicted", "evicted"]  # batch of 2
    assert {o.result for o in result.outcomes[2:]} == {"skipped"}
    after = sim.snapshot()
    assert all(n.taints == () for n in after.nodes)


def test_taint_failure_means_no_eviction_from_that_node() -> None:
    sim, ex = make()

    def broken(node: str, key: str, value: str, effect: str) -> None:
        raise RuntimeError("403 forbidden")

    sim.taint_node = broken  # type: ignore[method-assign]
    cluster = sim.snapshot()
    result = ex.execute(plan_for(movable_on(cluster, "gpu-00")), cluster, OPEN)
    assert sim.evictions == [] and {o.result for o in result.outcomes} == {"skipped"}
    assert "could not taint" in result.outcomes[0].reason
    assert [f.kind for f in result.findings] == ["execution-failed"]


@pytest.mark.parametrize(("evict_count", "action"), [(2, "rolled-back"), (3, "finished")])
def test_restart_after_a_crash_reconciles_and_leaves_no_node_tainted(
    evict_count: int, action: str
) -> None:
    sim, _ = make()
    cluster = sim.snapshot()
    pods = movable_on(cluster, "gpu-00")
    # The crashed run: taint, journal, and evict the first ``evict_count`` pods, then nothing.
    journal = new_journal(
        "gpu-00",
        "plan-crashed",
        SIM_START,
        tuple(
            JournalStep(p.key, f"inference/ReplicaSet/{p.owner.name}")  # type: ignore[union-attr]
            for p in pods
        ),
    )
    sim.taint_node("gpu-00", DRAIN_TAINT_KEY, "plan-crashed", "NoSchedule")
    sim.annotate_node("gpu-00", journal.annotations())
    for p in pods[:evict_count]:
        sim.evict(p.namespace, p.name)
    sim.clock.sleep(60)  # the scheduler places the replacements
    _, restarted = make()
    restarted.actuator = restarted.source = sim  # type: ignore[assignment]
    outcomes = Reconciler(restarted).reconcile()
    assert [(o.node, o.plan_id, o.action) for o in outcomes] == [("gpu-00", "plan-crashed", action)]
    assert outcomes[0].remaining == tuple(p.key for p in pods[evict_count:])
    after = sim.snapshot()
    assert all(n.taints == () for n in after.nodes)
    assert not set(JOURNAL_ANNOTATIONS) & set(after.node("gpu-00").annotations)
    assert not restarted.breaker.state.open


def test_reconcile_with_replacements_still_pending_trips_the_breaker() -> None:
    sim, ex = make(tight_cluster())
    sim.taint_node("n1", DRAIN_TAINT_KEY, "plan-x", "NoSchedule")
    sim.annotate_node(
        "n1",
        new_journal(
            "n1",
            "plan-x",
            datetime(2026, 1, 5, tzinfo=UTC),
            (JournalStep("ml/job-1", "ml/ReplicaSet/job-1"),),
        ).annotations(),
    )
    sim.evict("ml", "job-1")
    sim.clock.sleep(60)  # n1 tainted, n2 full: the replacement stays Pending
    outcomes = Reconciler(ex).reconcile()
    assert outcomes[0].action == "finished" and outcomes[0].pending == ("ml/ReplicaSet/job-1",)
    assert ex.breaker.state.open
    assert sim.snapshot().node("n1").taints == ()


def test_no_new_drain_starts_once_the_window_has_closed() -> None:
    sim, ex = make()
    cluster = sim.snapshot()
    # The window ends 30 s after the start; each drain waits at least one 10 s poll and the
    # replacements need 20 s to be scheduled: gpu-00 finishes at +20 s, gpu-01 at +40 s.
    window = WindowStatus(True, "short", SIM_START, SIM_START + timedelta(seconds=30))
    pods = (
        movable_on(cluster, "gpu-00")
        + movable_on(cluster, "gpu-01")
        + movable_on(cluster, "gpu-02")
    )
    result = ex.execute(plan_for(pods, target="gpu-05"), cluster, window)
    by_node = {o.source: o.result for o in result.outcomes}
    assert by_node == {"gpu-00": "evicted", "gpu-01": "evicted", "gpu-02": "skipped"}
    skipped = [o for o in result.outcomes if o.result == "skipped"]
    assert all("no new drain started" in o.reason for o in skipped)


def test_stop_during_the_wait_untaints_without_blaming_the_replacements() -> None:
    sim, ex = make(tight_cluster(), timeout_s=600)
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        sim.clock.sleep(seconds)
        ex.stop_requested.set()  # SIGTERM while waiting for the (stuck) replacement

    ex.sleep = sleep
    cluster = sim.snapshot()
    result = ex.execute(plan_for([cluster.pods["ml/job-1"]], target="n2"), cluster, OPEN)
    assert naps == [10]  # one poll, not the 600 s timeout
    assert result.counts == {"evicted": 1} and result.stuck == ()
    assert not ex.breaker.state.open
    assert sim.snapshot().node("n1").taints == ()
