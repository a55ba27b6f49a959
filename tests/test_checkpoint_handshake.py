"""The checkpoint handshake before eviction (defrag/execute/checkpoint.py), over the simulated
cluster: a pod that declares ``defrag.io/checkpoint: supported`` is asked (annotation + Event),
waited for until its ``defrag.io/last-checkpoint`` is newer than the request, its deadline
passes or it is gone; every other pod is evicted exactly as before."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from defrag.adapters.simcluster import SIM_START, SimClock, SimCluster, fragmented_cluster
from defrag.execute import EvictionBudget, Executor, ExecutorSettings, WindowStatus
from defrag.execute.checkpoint import (
    CHECKPOINT_DEADLINE_ANNOTATION,
    CHECKPOINT_MAX_WAIT_ANNOTATION,
    CHECKPOINT_REQUESTED_ANNOTATION,
    CheckpointRequest,
    pod_wait,
)
from defrag.execute.fence import Tenure
from defrag.execute.mode import RunMode
from defrag.model.cluster import Cluster
from defrag.model.resources import CHECKPOINT_ANNOTATION, CHECKPOINT_SUPPORT_ANNOTATION, Pod
from defrag.plan.model import Plan, Step
from defrag.ports import EvictionResult

OPEN = WindowStatus(True, "test window", SIM_START)
POLL_S = 10.0
SUPPORTED = {CHECKPOINT_SUPPORT_ANNOTATION: "supported"}


@dataclass
class Workload:
    """Plays the workloads: on each read of the cluster, a pod asked ``answer_after_s`` ago
    writes ``defrag.io/last-checkpoint`` (None: never answers); ``vanish`` pods are evicted by
    someone else once asked."""

    sim: SimCluster
    answer_after_s: float | None = 30.0
    vanish: frozenset[str] = frozenset()
    reads: list[datetime] = field(default_factory=list)

    def snapshot(self) -> Cluster:
        now = self.sim.clock.now()
        self.reads.append(now)
        for pod in list(self.sim.snapshot().pods.values()):
            asked = pod.annotations.get(CHECKPOINT_REQUESTED_ANNOTATION)
            if asked is None or CHECKPOINT_ANNOTATION in pod.annotations:
                continue
            if pod.key in self.vanish:
                self.sim.evict(pod.namespace, pod.name)
                continue
            since = datetime.fromisoformat(asked)
            if self.answer_after_s is not None and now >= since + timedelta(
                seconds=self.answer_after_s
            ):
                stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
                self.sim.annotate_pod(pod.namespace, pod.name, {CHECKPOINT_ANNOTATION: stamp})
        return self.sim.snapshot()


def setup(
    supported: dict[str, dict[str, str]],
    *,
    answer_after_s: float | None = 30.0,
    vanish: frozenset[str] = frozenset(),
    mode: RunMode | None = None,
    time_left: Callable[[], float | None] | None = None,
) -> tuple[SimCluster, Executor, list[Pod]]:
    """The fragmented cluster's three movable pods on gpu-00; ``supported``: pod name → the
    annotations it carries (its template's)."""
    clock = SimClock(speedup=0)  # time moves only when the executor sleeps
    sim = SimCluster(fragmented_cluster(), clock)
    for name, notes in supported.items():
        sim.annotate_pod("inference", name, notes)
    workload = Workload(sim, answer_after_s, vanish)
    settings = ExecutorSettings(
        budgets=EvictionBudget(50, 50, 50),
        batch_size=2,
        replacement_timeout_s=120,
        poll_interval_s=POLL_S,
        checkpoint_wait_s=60,
        checkpoint_max_wait_s=300,
    )
    ex = Executor(
        sim,
        workload,
        clock,
        settings,
        mode=mode or RunMode.live(),
        sleep=clock.sleep,
        time_left=time_left,
    )
    cluster = sim.snapshot()
    pods = sorted(
        (p for p in cluster.pods_on("gpu-00") if p.name in ("embed-001", "embed-002", "chat-004")),
        key=lambda p: p.key,
    )
    return sim, ex, pods


def plan_for(pods: list[Pod]) -> Plan:
    steps = tuple(Step("migrate", p.key, "gpu-00", "gpu-01", "repack") for p in pods)
    return Plan("repack", "reserve-binpack", steps, ())


def eviction_times(sim: SimCluster) -> dict[str, datetime]:
    """When each pod was evicted, read from the executor's DefragEvicted Events."""
    return {e.name: e.at for e in sim.events if e.reason == "DefragEvicted"}


def test_an_unsupported_pod_is_evicted_as_before_nothing_asked() -> None:
    sim, ex, pods = setup({})
    result = ex.execute(plan_for(pods), sim.snapshot(), OPEN)
    assert result.counts == {"evicted": 3}
    assert all(o.checkpoint == "" for o in result.outcomes)
    assert "checkpoint" not in result.outcomes[0].to_dict()
    assert not any("Checkpoint" in e.reason for e in sim.events)
    # No wait before the evictions: they go out at the start time.
    assert set(eviction_times(sim).values()) == {SIM_START}


@pytest.mark.parametrize(
    ("answer_after_s", "notes", "result", "evicted_after_s"),
    [
        # Answers 30 s after the request; polled every 10 s → seen at the read at 30 s.
        (30.0, SUPPORTED, "checkpointed", 30),
        # Never answers; waits its own 45 s (checkpoint-max-wait), polls at 10, 20, 30, 40,
        # then sleeps the last 5 s → evicted at 45 s.
        (None, {**SUPPORTED, CHECKPOINT_MAX_WAIT_ANNOTATION: "45s"}, "deadline-passed", 45),
        # Never answers, names no wait: the daemon's checkpoint_wait_s (60 s).
        (None, SUPPORTED, "deadline-passed", 60),
        # Asks for 2 h: capped at checkpoint_max_wait_s (300 s).
        (None, {**SUPPORTED, CHECKPOINT_MAX_WAIT_ANNOTATION: "2h"}, "deadline-passed", 300),
    ],
)
def test_a_supporting_pod_is_asked_then_evicted_when_checkpointed_or_at_its_deadline(
    answer_after_s: float | None, notes: dict[str, str], result: str, evicted_after_s: int
) -> None:
    sim, ex, pods = setup({"embed-001": notes}, answer_after_s=answer_after_s)
    out = ex.execute(plan_for(pods), sim.snapshot(), OPEN)
    assert out.counts == {"evicted": 3}
    by_pod = {o.pod: o for o in out.outcomes}
    asked = by_pod["inference/embed-001"]
    assert (asked.checkpoint, asked.result) == (result, "evicted")
    assert {o.checkpoint for o in out.outcomes if o is not asked} == {""}
    steps = {step["pod"]: step for step in out.to_dict()["steps"]}
    assert steps["inference/embed-001"]["checkpoint"] == result
    when = eviction_times(sim)
    assert when["embed-001"] == SIM_START + timedelta(seconds=evicted_after_s)
    requested = next(e for e in sim.events if e.reason == "DefragCheckpointRequested")
    assert (requested.name, requested.at) == ("embed-001", SIM_START)
    assert CHECKPOINT_ANNOTATION in requested.message
    assert "at or after 2026-01-05T01:50:00Z" in requested.message
    closing = "DefragCheckpointed" if result == "checkpointed" else "DefragCheckpointMissed"
    assert [e.reason for e in sim.events if e.name == "embed-001"].count(closing) == 1


def test_the_request_carries_its_time_and_deadline_before_the_eviction() -> None:
    sim, ex, pods = setup({"embed-001": SUPPORTED}, answer_after_s=30.0)
    seen: dict[str, str] = {}
    evict = sim.evict

    def spy(namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        if name == "embed-001":
            seen.update(sim.snapshot().pods[f"{namespace}/{name}"].annotations)
        return evict(namespace, name, uid=uid)

    sim.evict = spy  # type: ignore[method-assign]
    ex.execute(plan_for(pods), sim.snapshot(), OPEN)
    # SIM_START is 01:50:00Z; the deadline is the daemon's default wait of 60 s later.
    assert seen[CHECKPOINT_REQUESTED_ANNOTATION] == "2026-01-05T01:50:00Z"
    assert seen[CHECKPOINT_DEADLINE_ANNOTATION] == "2026-01-05T01:51:00Z"
    assert seen[CHECKPOINT_ANNOTATION] == "2026-01-05T01:50:30Z"


@pytest.mark.parametrize(
    ("window_end_s", "time_left_s", "limit", "evicted_after_s"),
    [
        # The window closes 25 s in: the wait (60 s) ends there.
        (25, None, "the window's end", 25),
        # The cycle has 150 s left, less one replacement wait (120 + 10 s) → 20 s.
        (None, 150.0, "the cycle's deadline less a replacement wait", 20),
        # The cycle has no time to spare: asked, and evicted at once.
        (None, 100.0, "the cycle's deadline less a replacement wait", 0),
    ],
)
def test_the_wait_counts_against_the_window_and_the_cycle_deadline(
    window_end_s: int | None, time_left_s: float | None, limit: str, evicted_after_s: int
) -> None:
    sim, ex, pods = setup(
        {"embed-001": SUPPORTED}, answer_after_s=None, time_left=lambda: time_left_s
    )
    end = SIM_START + timedelta(seconds=window_end_s) if window_end_s is not None else None
    out = ex.execute(plan_for(pods), sim.snapshot(), WindowStatus(True, "w", SIM_START, end))
    asked = next(o for o in out.outcomes if o.pod == "inference/embed-001")
    assert asked.checkpoint == "deadline-passed" and limit in asked.checkpoint_detail
    assert eviction_times(sim)["embed-001"] == SIM_START + timedelta(seconds=evicted_after_s)


def test_a_pod_gone_while_it_was_awaited_is_not_evicted_and_spends_no_budget() -> None:
    sim, ex, pods = setup(
        {"embed-001": SUPPORTED}, answer_after_s=None, vanish=frozenset({"inference/embed-001"})
    )
    out = ex.execute(plan_for(pods), sim.snapshot(), OPEN)
    asked = next(o for o in out.outcomes if o.pod == "inference/embed-001")
    assert (asked.result, asked.checkpoint) == ("gone", "gone")
    assert "while its checkpoint was awaited" in asked.reason
    executor_evictions = {"embed-002", "chat-004"}
    assert set(eviction_times(sim)) == executor_evictions
    # Two evictions spent: the gone pod's admission was given back (3 admitted - 1).
    assert ex.ledger.total == 2


def test_dry_run_asks_nothing_and_says_who_would_be_asked() -> None:
    sim, ex, pods = setup({"embed-001": SUPPORTED}, mode=RunMode(dry_run=True, events=True))
    before = sim.snapshot()
    out = ex.execute(plan_for(pods), before, OPEN)
    by_pod = {o.pod: o for o in out.outcomes}
    assert by_pod["inference/embed-001"].checkpoint == "would-ask"
    assert "wait up to 60 s" in by_pod["inference/embed-001"].checkpoint_detail
    assert by_pod["inference/chat-004"].checkpoint == ""
    assert sim.snapshot() is before  # nothing written
    planned = next(e for e in sim.events if e.name == "embed-001")
    assert "would ask for a checkpoint, then evict" in planned.message


class LosesLeadOnFirstAsk:
    """Leads until it is asked before a write to a pod (the checkpoint request)."""

    def __init__(self) -> None:
        self.lost = False

    def still_leader(self) -> bool:
        return not self.lost

    def tenure(self) -> Tenure:
        return Tenure("a", 1)

    def holds(self, tenure: Tenure) -> bool:
        return False


def test_the_request_is_fenced_a_deposed_replica_asks_nothing_and_evicts_nothing() -> None:
    sim, ex, pods = setup({"embed-001": SUPPORTED})
    fence = LosesLeadOnFirstAsk()
    ex.fence = fence
    annotate = sim.annotate_pod
    written: list[str] = []

    def taint_then_lose(node: str, key: str, value: str, effect: str) -> None:
        SimCluster.taint_node(sim, node, key, value, effect)
        fence.lost = True  # the Lease goes between the taint and the request

    def spy_annotate(namespace: str, name: str, notes: dict[str, str | None]) -> None:
        written.append(name)
        annotate(namespace, name, notes)

    sim.taint_node = taint_then_lose  # type: ignore[method-assign]
    sim.annotate_pod = spy_annotate  # type: ignore[method-assign]
    out = ex.execute(plan_for(pods), sim.snapshot(), OPEN)
    assert written == [] and sim.evictions == []
    assert {o.result for o in out.outcomes} == {"skipped"}
    assert any("left to the new leader" in p for p in out.problems)


def test_a_request_left_on_a_pod_that_was_not_evicted_is_withdrawn() -> None:
    sim, ex, pods = setup({"embed-001": SUPPORTED}, answer_after_s=10.0)
    evict = sim.evict

    def refuse_embed_001(namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        if name == "embed-001":
            return EvictionResult(f"{namespace}/{name}", "blocked", "PDB says no")
        return evict(namespace, name, uid=uid)

    sim.evict = refuse_embed_001  # type: ignore[method-assign]
    out = ex.execute(plan_for(pods), sim.snapshot(), OPEN)
    asked = next(o for o in out.outcomes if o.pod == "inference/embed-001")
    assert (asked.result, asked.checkpoint) == ("blocked", "checkpointed")
    notes = sim.snapshot().pods["inference/embed-001"].annotations
    assert CHECKPOINT_REQUESTED_ANNOTATION not in notes
    assert CHECKPOINT_DEADLINE_ANNOTATION not in notes


@pytest.mark.parametrize(
    ("value", "seconds", "note"),
    [
        (None, 60.0, ""),  # none named: the default
        ("90", 90.0, ""),  # bare seconds
        ("5m", 300.0, ""),  # a duration
        ("1h", 600.0, "capped at 600 s"),  # over the cap
        ("soon", 60.0, "unreadable"),  # not a duration: the default, said
        ("-5", 60.0, "negative"),
    ],
)
def test_pod_wait_reads_the_annotation_with_default_and_cap(
    value: str | None, seconds: float, note: str
) -> None:
    notes = {CHECKPOINT_MAX_WAIT_ANNOTATION: value} if value is not None else {}
    wait = pod_wait(Pod("p", annotations=notes), default_s=60.0, cap_s=600.0)
    assert wait.seconds == seconds
    assert (note in wait.note) and (bool(wait.note) == bool(note))


@pytest.mark.parametrize(
    ("support", "asked"),
    [("supported", True), (" Supported ", True), ("no", False), ("", False)],
)
def test_only_supported_declares_support(support: str, asked: bool) -> None:
    pod = Pod("p", annotations={CHECKPOINT_SUPPORT_ANNOTATION: support})
    assert pod.checkpoints_on_request is asked


def test_a_checkpoint_stamped_within_the_request_second_counts() -> None:
    """The request is written in whole seconds (01:50:00Z for a request at 01:50:00.7), so a
    workload that stamps its checkpoint to the second (01:50:00Z) is newer, not older."""
    pod = Pod("p", uid="u1", node="n", phase="Running", annotations=dict(SUPPORTED))
    now = SIM_START + timedelta(milliseconds=700)
    req = CheckpointRequest.at(pod, now, now + timedelta(seconds=60), "its wait")
    stamped = Pod(
        "p",
        uid="u1",
        node="n",
        phase="Running",
        annotations={CHECKPOINT_ANNOTATION: "2026-01-05T01:50:00Z"},
    )
    cluster = fragmented_cluster()
    cluster = cluster.with_pod_added(Pod("p", uid="u1", annotations=dict(stamped.annotations)))
    verdict = req.verdict(cluster, now)
    assert verdict is not None and verdict[0] == "checkpointed"
