"""Per-pod constraints, the budget ledger and the cost formula."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import timedelta

import pytest

from defrag.model.cluster import PodDisruptionBudget
from defrag.model.resources import OwnerRef, Pod
from defrag.plan.config import Constraints, EvictionBudget
from defrag.plan.constraints import Ledger, blocked_from, check_pod, gang_of
from defrag.plan.cost import CostModel
from defrag.plan.spend import BudgetLedger
from tests.test_plan_support import NOW, running

CHECKPOINT = "defrag.io/last-checkpoint"


def terminating(pod: Pod) -> Pod:
    """``pod`` as the API server leaves it after a graceful delete: deletionTimestamp set
    (RFC 3339, 30 s after the delete: the default terminationGracePeriodSeconds)."""
    return replace(pod, deleting_since=NOW - timedelta(seconds=30))


@pytest.mark.parametrize(
    "pod,constraints,expected",
    [
        (running("a", "n"), Constraints(), None),
        (running("a", "n", annotations={"defrag.io/evictable": "false"}), Constraints(), "opt-out"),
        (running("a", "n", annotations={"defrag.io/evictable": "true"}), Constraints(), None),
        (running("a", "n", owner=None), Constraints(), "bare-pod"),
        (running("a", "n", owner=OwnerRef("Node", "n")), Constraints(), "bare-pod"),
        (running("a", "n", owner=OwnerRef("DaemonSet", "ds")), Constraints(), "daemonset"),
        (running("a", "n", priority=2_000_000_000), Constraints(), "system-critical"),
        (running("a", "n", hours=0.05), Constraints(min_age=timedelta(minutes=10)), "min-age"),
        (running("a", "n", hours=0.05), Constraints(min_age=timedelta(0)), None),
        # metadata.deletionTimestamp set: already going, whatever else holds; checked first
        (terminating(running("a", "n")), Constraints(), "terminating"),
        (
            terminating(running("a", "n", annotations={"defrag.io/evictable": "false"})),
            Constraints(),
            "terminating",
        ),
        (terminating(running("a", "n", hours=0.05)), Constraints(), "terminating"),
    ],
)
def test_check_pod(pod: Pod, constraints: Constraints, expected: str | None) -> None:
    status = check_pod(pod, constraints, NOW)
    if expected is None:
        assert status.ok
    else:
        assert not status.ok
        assert blocked_from(pod.key, status).constraint == expected


def test_system_critical_class() -> None:
    from dataclasses import replace

    pod = replace(running("a", "n"), priority_class="system-node-critical")
    assert blocked_from("x", check_pod(pod, Constraints(), NOW)).constraint == "system-critical"


def test_pdb_is_counted_down_as_the_plan_uses_it() -> None:
    pdb = PodDisruptionBudget("default", "web", {"app": "web"}, disruptions_allowed=1)
    a = running("a", "n1", labels={"app": "web"})
    b = running("b", "n2", labels={"app": "web"})
    other = running("c", "n2", labels={"app": "db"})
    ledger = Ledger([pdb], Constraints())
    status, culprit = ledger.check([(a, "n1"), (b, "n2")])
    assert not status.ok and culprit == "default/b"  # 2 disruptions asked, 1 allowed
    assert ledger.check([(a, "n1")])[0].ok
    ledger.commit([(a, "n1")])
    assert ledger.pdb_left["default/web"] == 0
    status, culprit = ledger.check([(b, "n2")])
    assert blocked_from(culprit or "", status).constraint == "pdb"
    assert ledger.check([(other, "n2")])[0].ok


def limits(total: int | None, node: int | None, namespace: int | None) -> Constraints:
    return Constraints(budget=EvictionBudget(total, node, namespace))


@pytest.mark.parametrize(
    "constraints,evictions,expected",
    [
        (limits(2, None, None), [("a", "n1", "x"), ("b", "n2", "x"), ("c", "n3", "x")],
         "budget-window"),
        (limits(None, 1, None), [("a", "n1", "x"), ("b", "n1", "x")], "budget-node"),
        (limits(None, None, 1), [("a", "n1", "x"), ("b", "n2", "x")],
         "budget-namespace"),
        (limits(None, None, 1), [("a", "n1", "x"), ("b", "n2", "y")], None),
    ],
)  # fmt: skip
def test_budgets(
    constraints: Constraints, evictions: list[tuple[str, str, str]], expected: str | None
) -> None:
    ledger = Ledger([], constraints)
    pairs = [(running(name, node, namespace=ns), node) for name, node, ns in evictions]
    status, _ = ledger.check(pairs)
    assert status.ok is (expected is None)
    if expected:
        assert blocked_from("p", status).constraint == expected


def test_snapshot_restore() -> None:
    pdb = PodDisruptionBudget("default", "web", {}, disruptions_allowed=2)
    ledger = Ledger([pdb], Constraints())
    state = ledger.snapshot()
    ledger.commit([(running("a", "n1"), "n1")])
    assert (ledger.count.total, ledger.pdb_left["default/web"]) == (1, 1)
    ledger.restore(state)
    assert (ledger.count.total, ledger.pdb_left["default/web"], ledger.count.by_node["n1"]) == (
        0,
        2,
        0,
    )


def test_a_plan_spends_what_is_left_of_its_window() -> None:
    """The plan's ledger starts from the window's spend: 3 of 4 spent leaves one eviction, and
    the node already emptied twice of 2 takes none."""
    spent = BudgetLedger(EvictionBudget(total=4, per_node=2), "w1", 3, Counter({"n1": 2}))
    ledger = Ledger([], Constraints(budget=EvictionBudget(total=4, per_node=2)), spent=spent)
    status, pod = ledger.check([(running("a", "n1"), "n1")])
    assert not status.ok and pod == "default/a" and "budget-node" in str(status)
    assert ledger.check([(running("b", "n2"), "n2")])[0].ok
    status, pod = ledger.check([(running("b", "n2"), "n2"), (running("c", "n3"), "n3")])
    assert not status.ok and pod == "default/c" and "budget-window: 3 of 4" in str(status)
    ledger.commit([(running("b", "n2"), "n2")])
    assert spent.total == 3, "the window's own ledger is counted by the executor, not the plan"


def test_gang_from_field_or_label() -> None:
    assert gang_of(running("a", "n", gang="job1")) == "default/job1"
    assert gang_of(running("a", "n", labels={"volcano.sh/job-name": "v"})) == "default/v"
    assert gang_of(running("a", "n")) is None


@pytest.mark.parametrize(
    "pod,expected",
    [
        # restart = GPUs × the kind's overhead (RESTART_HOURS): training 10 min, batch 5 min
        # 2 GPUs (training) × (10/60 + 3 h) × (1 + 1000/1000) = 2 × 3.1667 × 2 = 12.6667
        (running("a", "n", 2, priority=1000, hours=3), 12.666667),
        # 0.5 GPU (batch) × (5/60 + 4 h) × 1 = 2.041667
        (running("a", "n", 1, gpu_milli=500, hours=4), 2.041667),
        # checkpoint 1 h ago: 4 × (10/60 + 1) = 4.666667
        (running("a", "n", 4, hours=10, annotations={CHECKPOINT: "2026-11-29T11:00:00Z"}),
         4.666667),
        # unreadable checkpoint → since start (10 h): 1 × (5/60 + 10) = 10.083333
        (running("a", "n", 1, hours=10, annotations={CHECKPOINT: "yesterday"}), 10.083333),
        # capped at a week: 1 × (5/60 + 168) = 168.083333
        (running("a", "n", 1, hours=1000), 168.083333),
        # CPU-only: no GPU held, no GPU time lost: 0
        (running("a", "n", 0, hours=5), 0.0),
        # answers the checkpoint handshake: asked first, loses no work → the requested
        # checkpoint's stall and its restart, 4 × (2/60 + 10/60) = 0.8
        (running("a", "n", 4, hours=10, annotations={"defrag.io/checkpoint": "supported"}),
         0.8),
        # ... even with an old checkpoint (10 h ago): still 0.8 (known() too, below)
        (running("a", "n", 4, hours=10, annotations={"defrag.io/checkpoint": "supported",
                                                      CHECKPOINT: "2026-11-29T02:00:00Z"}),
         0.8),
    ],
)  # fmt: skip
def test_cost_formula(pod: Pod, expected: float) -> None:
    assert CostModel().eviction(pod, NOW) == pytest.approx(expected)
    if pod.checkpoints_on_request:
        assert CostModel().known(pod, NOW) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("gpus", "milli", "qos", "kind", "restart"),
    [
        # the restart alone (no time known): GPUs held × RESTART_HOURS[kind]
        (8, 1000, "", "training", 8 * 10 / 60),  # 1.333: an 8-GPU move is not cheap
        (1, 300, "", "batch", 0.3 * 5 / 60),  # 0.025: a 0.3-GPU share is cheap
        (1, 1000, "LS", "serving", 1 * 3 / 60),  # 0.05
        (2, 500, "", "batch", 0.083333),  # two half GPUs are no training job: 0.0833
        (0, 1000, "", "cpu", 0.0),  # holds no GPU
    ],
)
def test_restart_is_priced_by_gpus_held_times_the_kinds_overhead(
    gpus: int, milli: int, qos: str, kind: str, restart: float
) -> None:
    from dataclasses import replace

    from defrag.plan.cost import workload_kind

    pod = replace(running("a", "n", gpus, gpu_milli=milli), qos=qos)
    assert workload_kind(pod) == kind
    assert CostModel().eviction(pod, None) == pytest.approx(restart)


def test_preemption_costs_more_and_unknown_time_costs_the_restart() -> None:
    pod = running("a", "n", 2, hours=3)  # 2 × (10/60 + 3) = 6.3333
    assert CostModel().preemption(pod, NOW) == pytest.approx(12.666667)
    assert CostModel().eviction(pod, None) == pytest.approx(2 * 10 / 60)


def test_terminating_reason_names_when_the_delete_began() -> None:
    status = check_pod(terminating(running("a", "n")), Constraints(), NOW)
    blocked = blocked_from("default/a", status)
    assert blocked.constraint == "terminating"
    since = (NOW - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert blocked.detail == f"being deleted since {since}, already going"


def test_the_planner_never_picks_a_terminating_pod() -> None:
    """make-room for an 8-GPU pod: n1 holds a 4-GPU pod that is Terminating and n2 a movable
    4-GPU pod; both nodes have 8 GPUs (8 − 4 = 4 free on each). The terminating pod is the
    cheaper victim (cost = 1 + 4 GPUs × 0.5 h = 3 against 1 + 4 × 5 h = 21), so before it was
    the one moved. Its node is the pod's room once it is gone, so nothing is evicted; with n1
    kept for another pod, the planner refuses the terminating pod by name and moves the other,
    onto n1's 4 free GPUs (the terminating pod still holds its own 4 there)."""
    from defrag.model.cluster import Cluster
    from defrag.model.resources import RESERVED_FOR_ANNOTATION, Node
    from defrag.plan.model import Plan
    from defrag.plan.planner import make_plan
    from defrag.scoring.profile import ProfileConfig
    from tests.test_plan_support import pending

    def plan_for(n1_notes: dict[str, str]) -> Plan:
        nodes = [
            Node("n1", cpu_milli=64_000, memory_mib=512_000, num_gpu=8, annotations=n1_notes),
            Node("n2", cpu_milli=64_000, memory_mib=512_000, num_gpu=8),
        ]
        going = terminating(running("going", "n1", 4, hours=0.5))
        stays = running("stays", "n2", 4, hours=5)
        big = pending("big", 8, priority=1000)
        cluster = Cluster.build(nodes, [going, stays, big])
        assert cluster.arrays.gpu_free.sum() == 8 * 1000  # it still holds its GPUs
        profile = ProfileConfig("reserve-binpack", 0).for_cluster(cluster)
        return make_plan(cluster, "make-room", profile=profile, constraints=Constraints(), now=NOW)

    emptying = plan_for({})
    assert emptying.steps == () and emptying.blocked == ()
    plan = plan_for({RESERVED_FOR_ANNOTATION: "default/other"})
    assert [(s.pod, s.source, s.target) for s in plan.steps] == [("default/stays", "n2", "n1")]
    assert [(b.pod, b.constraint) for b in plan.blocked] == [("default/going", "terminating")]


@pytest.mark.parametrize(
    ("spent", "plan_total", "allowed"),
    [
        (2, 3, 3),  # the window (ceiling 10) has 8 left: the plan's own total, 3, holds
        (8, 3, 2),  # 2 left in the window: 2, whatever the plan's backlog asks
        (10, 3, 0),  # the window is spent
        (0, None, 10),  # a plan without a total of its own: what the window has left
    ],
)
def test_a_plan_evicts_its_own_total_within_what_the_window_has_left(
    spent: int, plan_total: int | None, allowed: int
) -> None:
    window = BudgetLedger(EvictionBudget(total=10, per_node=None, per_namespace=None), "w", spent)
    plan = Constraints(budget=EvictionBudget(total=plan_total, per_node=None, per_namespace=None))
    ledger = Ledger([], plan, spent=window)
    pods = [(running(f"p{i}", f"n{i}"), f"n{i}") for i in range(allowed + 1)]
    assert ledger.check(pods[:allowed])[0].ok
    status, pod = ledger.check(pods)
    assert not status.ok and pod == f"default/p{allowed}" and "budget-window" in str(status)
