"""One decision, two drivers: the daemon through its real adapters and the simulator through its
ports decide the same, cycle by cycle (the differential test of :func:`defrag.decide.decide`).

Each case (a seed) generates a small cluster — 3–12 nodes of 8 GPUs, 0–2 CPU nodes — and a short
history: a :func:`~defrag.sim.timeline.replay_timeline` run of seeded arrivals (pods of 1, 2, 4
or 8 whole GPUs, GPU shares, CPU pods; QoS classes LS, Guaranteed, Burstable and BE; run times
of hours; checkpoint intervals drawn by the run's cost model) under a spreading, packing or
random scheduler, with the simulator's daemon (:class:`~defrag.sim.daemon_driver.DaemonDriver`,
``record=True``) ticking every cycle and acting on its plans. Big pods queue, so the shipped
starvation rules (``for: 15m`` / ``30m``) fire; the execution window ``0 */6 * * *`` for an hour
is open for some cycles and closed for others (the driver does not simulate a cycle that cannot
act; :class:`RecordingDriver` asks it for that cycle's decision all the same and leaves it as it
was); the planner config is the issue's (budget 10, ``depth=0``, ``min_gain_per_cost=0.5``,
``max_rooms=32``, ``repack_on_demand``) or the defaults.

For every cycle of the compared stretch the world the simulator decided on (its view's cluster)
is written as Kubernetes objects (:mod:`tests.support.sim_objects`), served by the API emulator
(:mod:`tests.support.kubeapi`: one server, emptied between cases; each cycle writes what changed
since the last), and the daemon decides as its cycle does
(:func:`defrag.daemon.cycle.run_cycle`): the snapshot through its source
(:class:`~defrag.adapters.kube.KubeClusterSource`, what ``defrag run --once`` and the executor
read), ``profile.for_cluster``, :func:`~defrag.detection.cycle_detector` with the shipped rules
and no metrics, and :func:`~defrag.decide.decide` with :func:`~defrag.decide.planner_port` and
the owner lookup against the API (:class:`~defrag.adapters.kube_owners.KubeOwnerLookup`), the
simulator's ledger as it stood before that cycle, its ``last_packing``, ``plan_closed=False``.
Compared: the window (open, key), the goal, the held-back pods, the plan's steps as (pod, kind,
source, target, for_pod) in order, and the findings as (kind, subject).

Where the objects' shapes come from: kube_convert's module docstring (the conventions it reads:
``nvidia.com/gpu``, GPU Feature Discovery labels, ``defrag.io/gpu-milli``,
``defrag.io/gpu-indices``), its ``_pending`` / ``_scheduled`` (the ``PodScheduled`` condition's
``lastTransitionTime``), ``_owner`` (``ownerReferences`` with ``controller: true``) and the
upstream fields (k8s.io/api core/v1 types.go; meta/v1 OwnerReference) — see
tests/support/sim_objects.py. ``status.qosClass`` is what the API server computes for such pods
(``Burstable``), as the view shows it (it showed the trace's ``LS`` until this test found the
two drivers priced such a pod differently:
:func:`test_a_latency_sensitive_pod_shown_as_the_api_server_shows_it`).

A plan that names one pod in two steps fails a case (:func:`test_a_plan_names_each_pod_once`:
before the planner refused a pod it had already moved, one case in about 40 did, alike in both
drivers, and the timeline could not apply it).

The default run checks ``DEFRAG_FUZZ_EXAMPLES`` cases (default 150: about 40 s on two cores,
~800 compared cycles); the issue's bar, 1,000 cases (5,471 cycles, about 4.5 min on two cores)::

    DEFRAG_FUZZ_EXAMPLES=1000 .venv/bin/pytest -q -p no:cacheprovider tests/test_one_decision.py

``DEFRAG_ONE_DECISION_SEED`` moves the first seed; a divergence names its seed, and
``DEFRAG_ONE_DECISION_SEED=<seed> DEFRAG_FUZZ_EXAMPLES=1`` replays that case alone.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import numpy as np
import pytest

from defrag.adapters.kube import KubeClusterSource
from defrag.adapters.kube_convert import node_from_json
from defrag.adapters.kube_owners import KubeOwnerLookup
from defrag.daemon.cycle import rule_failed_finding
from defrag.decide import CycleConfig, Decision, Detected, decide, planner_port
from defrag.detect.findings import Finding
from defrag.detection import cycle_detector
from defrag.execute.windows import Window
from defrag.model.cluster import Cluster
from defrag.model.resources import CHECKPOINT_ANNOTATION, Node, Pod
from defrag.model.workload import WorkloadMix
from defrag.plan.config import Constraints, EvictionBudget, PlannerConfig, PlanOptions
from defrag.plan.model import Plan
from defrag.plan.patience import PackingPatience
from defrag.plan.recent import NONE as NO_EVICTIONS
from defrag.plan.recent import RecentEvictions
from defrag.rules import RuleSet, load_rules, rules_paths
from defrag.scoring.policies import make_policy
from defrag.sim.arrivals import Arrival, TimelineConfig
from defrag.sim.daemon_driver import CycleRecord, DaemonDriver, DaemonSetup, SimLedger
from defrag.sim.daemon_view import ClusterView, moment
from defrag.sim.migration import Job
from defrag.sim.moves import Move
from defrag.sim.state import SimState
from defrag.sim.timeline import replay_timeline
from tests.support.kubeapi import KubeApi, running
from tests.support.sim_objects import UPSTREAM_QOS, kube_objects, node_object

EXAMPLES = int(os.environ.get("DEFRAG_FUZZ_EXAMPLES", "150"))
FIRST_SEED = int(os.environ.get("DEFRAG_ONE_DECISION_SEED", "0"))

WINDOWS = (Window("0 */6 * * *", 3600),)
ISSUE_PLANNER = PlannerConfig(
    Constraints(budget=EvictionBudget(10, None, None)),
    PlanOptions(depth=0, min_gain_per_cost=0.5, max_rooms=32, repack_on_demand=True),
)
QOS_CLASSES = ("LS", "Guaranteed", "Burstable", "BE")
QOS_WEIGHTS = (0.25, 0.2, 0.35, 0.2)
GPU_MODELS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3")
NAMESPACES = ("openb", "team-a", "team-b")
OWNER_KINDS = ("ReplicaSet", "Job")


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return load_rules(rules_paths(()))


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    for api in running():
        yield Served(api)


# --- the simulator's side ---------------------------------------------------------------------


@dataclass(slots=True)
class Seen:
    """What the simulator's daemon decided on at one cycle: its view's cluster, its ledger and
    the packing finding that stood, as they were before the cycle."""

    hour: float
    cluster: Cluster
    ledger: SimLedger
    packing: Finding | None
    evicted: RecentEvictions = NO_EVICTIONS
    """The daemon's evictions it remembered (the anti-thrash guard's)."""
    opened_early: datetime | None = None


class _Capturing(ClusterView):
    """The driver's own view, keeping the cluster it showed last."""

    def __init__(self) -> None:
        super().__init__()
        self.last: Cluster | None = None

    def cluster(self, state: SimState, now: float) -> Cluster:
        self.last = super().cluster(state, now)
        return self.last


class RecordingDriver(DaemonDriver):
    """The simulator's daemon, recording (from ``compare_from`` on) what each cycle saw.

    A cycle that cannot act (outside the windows, no make-room-now rule) the driver does not
    simulate (:func:`defrag.decide.may_act`); its decision is still asked of the driver here, for
    the comparison, and the driver left as it was (its packing memory)."""

    def __init__(self, setup: DaemonSetup, compare_from: float = 0.0) -> None:
        self.capturing = _Capturing()
        super().__init__(setup, view=self.capturing, record=True)
        self.compare_from = compare_from
        self.seen: list[tuple[Seen, CycleRecord]] = []
        self.twice: list[tuple[float, str]] = []
        """(hour, pod) of each plan that moved one pod twice."""

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]:
        ledger, packing = copy_ledger(self.ledger), self.packing
        evicted, opened = self.evicted, self.opened_early
        assert self.history is not None
        recorded = len(self.history)
        moves = super().on_tick(state, now)
        compared = now >= self.compare_from - 1e-9
        if len(self.history) > recorded:
            record = self.history[-1]
        elif compared:  # not simulated: what it would have decided, nothing kept
            decision, findings = self.decide(state, now)
            self.packing, self.evicted, self.opened_early = packing, evicted, opened
            record = CycleRecord(now, decision, findings)
        if compared:
            assert self.capturing.last is not None and record.hour == now
            seen = Seen(now, self.capturing.last, ledger, packing, evicted, opened)
            self.seen.append((seen, record))
        return self.once_each(moves, now)

    def once_each(self, moves: Sequence[Move], now: float) -> Sequence[Move]:
        """The moves up to the first that names a pod an earlier one moved (the timeline cannot
        apply those: a plan that evicts one pod twice, see the module docstring)."""
        names: set[str] = set()
        for i, move in enumerate(moves):
            if move.pod_id in names:
                self.twice.append((now, move.pod_id))
                return moves[:i]
            names.add(move.pod_id)
        return moves


def copy_ledger(ledger: SimLedger) -> SimLedger:
    return SimLedger(ledger.budgets, {k: v.copy() for k, v in ledger.ledgers.items()})


# --- the daemon's side ------------------------------------------------------------------------


class Served:
    """What the one emulator serves: exactly the objects of the cycle (and the controllers their
    pods name). Within a case only what changed since the last cycle is written."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.client = api.client()
        self.source = KubeClusterSource(self.client)
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}

    def reset(self) -> None:
        for kind in ("Pod", "Node", *OWNER_KINDS):
            for obj in self.api.objects(kind):
                meta = obj["metadata"]
                self.api.remove(kind, meta["name"], meta.get("namespace", ""))
        self.objects = {}

    def serve(self, objects: Sequence[dict[str, Any]]) -> None:
        now = {_key(o): o for o in objects}
        for kind, name, namespace in self.objects.keys() - now.keys():
            self.api.remove(kind, name, namespace)
        for key, obj in now.items():
            if self.objects.get(key) != obj:
                self.api.put(obj)
        self.objects = now


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta["name"], meta.get("namespace", "")


def daemon_decides(
    served: Served,
    objects: Sequence[dict[str, Any]],
    setup: DaemonSetup,
    detector: Callable[..., Any],
    seen: Seen,
) -> tuple[Decision, tuple[Finding, ...]]:
    """The daemon's decision on ``objects`` at the cycle ``seen``, as its cycle makes it."""
    served.serve(objects)
    at = moment(seen.hour)
    cluster = served.source.snapshot()
    profile = setup.cycle.profile.for_cluster(cluster)
    detected = detector(cluster, at, profile)
    assert isinstance(detected, Detected)
    findings = [*detected.findings]
    findings += [rule_failed_finding(r, why) for r, why in sorted(detected.failed.items())]
    # KEEP_S (10 s) is far below the cycle interval: each cycle reads its owners afresh.
    planner = planner_port(setup.planner, KubeOwnerLookup(served.client))
    decision = decide(
        cluster, findings, at, setup.cycle, planner, profile,
        last_packing=seen.packing, spent=seen.ledger.spent, plan_closed=False,
        evicted=seen.evicted, opened_early=seen.opened_early,
    )  # fmt: skip
    return decision, tuple(findings)


# --- what is compared -------------------------------------------------------------------------


def steps(plan: Plan | None) -> list[tuple[str, str, str, str | None, str | None]] | None:
    if plan is None:
        return None
    return [(s.pod, s.kind, s.source, s.target, s.for_pod) for s in plan.steps]


def facts(decision: Decision, findings: Sequence[Finding]) -> dict[str, object]:
    """What one cycle decided, in the terms both drivers must agree on."""
    return {
        "window.open": decision.window.open,
        "window.key": decision.window.key,
        "goal": decision.goal,
        "held_back": sorted(decision.held_back),
        "steps": steps(decision.plan),
        "findings": sorted({(f.kind, f.subject) for f in (*findings, *decision.findings)}),
    }


def differences(sim: dict[str, object], daemon: dict[str, object]) -> dict[str, object]:
    return {k: {"sim": sim[k], "daemon": daemon[k]} for k in sim if sim[k] != daemon[k]}


# --- the generated cases ----------------------------------------------------------------------


@dataclass(slots=True)
class Case:
    seed: int
    nodes: list[Node]
    arrivals: list[Arrival]
    setup: DaemonSetup
    policy: str
    compare_from: float
    end: float
    stats: dict[str, int] = field(default_factory=dict)


def as_the_api_shows(node: Node) -> Node:
    """The node as the daemon reads it back (labels the GPU Feature Discovery sets, …): the
    simulator runs on the very node the API serves."""
    return node_from_json(node_object(node))


def make_nodes(rng: np.random.Generator) -> list[Node]:
    model = str(rng.choice(GPU_MODELS))
    nvlink = bool(rng.random() < 0.3)
    nodes = [
        Node(
            f"gpu-{i:02d}",
            cpu_milli=int(rng.choice([64_000, 96_000, 128_000])),
            memory_mib=int(rng.choice([512, 1024])) * 1024,
            num_gpu=8,
            gpu_model=model,
            gpu_memory_mib=81920,
            nvlink_domains=((0, 1, 2, 3), (4, 5, 6, 7)) if nvlink else (),
        )
        for i in range(int(rng.integers(3, 13)))
    ]
    nodes += [
        Node(f"cpu-{i}", cpu_milli=32_000, memory_mib=128 * 1024)
        for i in range(int(rng.integers(0, 3)))
    ]
    return [as_the_api_shows(n) for n in nodes]


def make_pod(rng: np.random.Generator, k: int, big: bool = False) -> Pod:
    """One arrival's pod: mostly 1–8 whole GPUs, some shares and CPU pods; ``big``: 2–8 GPUs."""
    roll = rng.random()
    gpu_milli = 1000
    if big:
        gpus = int(rng.choice([2, 4, 8], p=[0.2, 0.35, 0.45]))
    elif roll < 0.08:
        gpus = 0
    elif roll < 0.2:
        gpus, gpu_milli = 1, int(rng.choice([250, 500]))
    else:
        gpus = int(rng.choice([1, 2, 4, 8], p=[0.45, 0.25, 0.18, 0.12]))
    qos = str(rng.choice(QOS_CLASSES, p=QOS_WEIGHTS))
    return Pod(
        f"p{k:03d}-{gpus}g",
        namespace=str(rng.choice(NAMESPACES)),
        num_gpu=gpus,
        gpu_milli=gpu_milli,
        cpu_milli=int(rng.integers(1, 17)) * 500,
        memory_mib=int(rng.integers(1, 65)) * 1024,
        qos=qos,
    )


def make_case(seed: int, rules: RuleSet) -> Case:
    rng = np.random.default_rng([seed, 20260101])
    nodes = make_nodes(rng)
    gpus = sum(n.num_gpu for n in nodes)
    # Where the compared stretch lies: in the window (00:00–01:00), across its end, across the
    # next opening (06:00), or outside. Nothing arrives before ``start``.
    start = float(rng.choice([0.0, 0.0, 0.25, 4.5, 5.25]))
    history = float(rng.uniform(0.3, 1.2))  # before the compared stretch
    compared = float(rng.uniform(0.3, 0.8))
    compare_from = start + history
    end = compare_from + compared
    arrivals: list[Arrival] = []
    k = 0
    # The cluster fills at ``start`` (the steady state the timeline's prefill stands for) …
    filled = 0.0
    target = float(rng.uniform(0.6, 1.0)) * gpus
    while filled < target:
        pod = make_pod(rng, k)
        arrivals.append(Arrival(start, pod, _duration(rng, pod)))
        filled += pod.gpu_demand_milli / 1000
        k += 1
    # … then pods keep arriving, big ones among them (they queue behind the small ones).
    t = start
    rate = float(rng.uniform(4.0, 16.0))  # per hour
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t >= end:
            break
        pod = make_pod(rng, k, big=bool(rng.random() < 0.4))
        arrivals.append(Arrival(t, pod, _duration(rng, pod)))
        k += 1
    planner = ISSUE_PLANNER if rng.random() < 0.7 else PlannerConfig()
    cycle = CycleConfig(windows=WINDOWS, repack_on_demand=bool(rng.random() < 0.8))
    interval = float(rng.choice([300.0, 300.0, 600.0]))
    setup = DaemonSetup(cycle, planner, rules, interval)
    policy = str(rng.choice(["least-allocated", "least-allocated", "most-allocated", "random"]))
    return Case(seed, nodes, arrivals, setup, policy, compare_from, end)


def _duration(rng: np.random.Generator, pod: Pod) -> float:
    median = 8.0 if pod.num_gpu > 1 else 2.0
    return float(min(median * math.exp(rng.standard_normal()), 200.0))


def run_case(case: Case) -> RecordingDriver:
    """The case's history, the simulator's daemon ticking in it."""
    driver = RecordingDriver(case.setup, case.compare_from)
    config = TimelineConfig(
        hours=case.end,
        warmup_hours=0.0,
        window_every_h=1e6,  # the daemon acts at its cycles only
        sample_every_h=1e6,
        tick_every_h=driver.tick_every_h,
    )
    replay_timeline(
        case.nodes, case.arrivals, case.policy, case.seed, config=config,
        mix=WorkloadMix.from_pods([a.pod for a in case.arrivals]), hook=driver,
    )  # fmt: skip
    return driver


def as_the_view_shows(pod: Pod) -> str:
    """``status.qosClass`` as the view shows it (what the API server computes)."""
    return pod.qos or UPSTREAM_QOS


def compare_case(
    served: Served, case: Case, qos_class: Callable[[Pod], str] = as_the_view_shows
) -> list[str]:
    """Run the case's history; each compared cycle decided by both drivers. The divergences."""
    driver = run_case(case)
    detector = cycle_detector(case.setup.rules, None)
    served.reset()
    out: list[str] = []
    for seen, record in driver.seen:
        objects = kube_objects(seen.cluster, qos_class)
        decision, findings = daemon_decides(served, objects, case.setup, detector, seen)
        sim = facts(record.decision, record.findings)
        tally(case.stats, sim)
        diff = differences(sim, facts(decision, findings))
        if diff:
            out.append(f"seed {case.seed}, hour {seen.hour:.4f}: {diff}")
    case.stats["moved twice"] = len(driver.twice)
    out += [
        f"seed {case.seed}, hour {hour:.4f}: the plan names {pod} twice"
        for hour, pod in driver.twice
    ]
    return out


def tally(stats: dict[str, int], sim: dict[str, Any]) -> None:
    counts = {
        "cycles": True,
        "in window": sim["window.open"],
        "with steps": bool(sim["steps"]),
        "starved": any(kind == "starvation" for kind, _ in sim["findings"]),
        "held back": bool(sim["held_back"]),
    }
    for key, counted in counts.items():
        stats[key] = stats.get(key, 0) + bool(counted)


# --- the tests --------------------------------------------------------------------------------


def test_the_daemon_and_the_simulator_decide_the_same_cycle_by_cycle(
    served: Served, rules: RuleSet
) -> None:
    totals: dict[str, int] = {}
    failures: list[str] = []
    for seed in range(FIRST_SEED, FIRST_SEED + EXAMPLES):
        case = make_case(seed, rules)
        failures += compare_case(served, case)
        for k, v in case.stats.items():
            totals[k] = totals.get(k, 0) + v
    print(f"{EXAMPLES} cases from seed {FIRST_SEED}: {totals}")
    assert not failures, f"{len(failures)} cycle(s) diverged:\n" + "\n".join(failures[:20])
    # the cases reach what they are for: plans, starved pods, both sides of the window
    assert totals["cycles"] >= EXAMPLES
    if EXAMPLES >= 20:
        assert totals["with steps"] > 0 and totals["starved"] > 0
        assert 0 < totals["in window"] < totals["cycles"]


# --- one case, read -------------------------------------------------------------------------------


Seat = tuple[str, int, str, int]
"""A running pod: name, GPUs, QoS class, first GPU slot (its GPUs are the slots from there)."""
Waiting = tuple[str, int, str, float]
"""A pending pod: name, GPUs, QoS class, the hour it was queued."""


def _state(
    running: dict[str, list[Seat]], pending: list[Waiting], checkpoint_h: float = 0.5
) -> SimState:
    """8-GPU nodes running pods (all started at hour 0, on the least-allocated scheduler's
    seats), and pods queued for GPUs, all in namespace ``team-a``; the running pods checkpoint
    every ``checkpoint_h`` hours of work (0: nothing to lose), the pending ones every 30 min."""
    nodes = [
        as_the_api_shows(Node(name, 64_000, 512 * 1024, num_gpu=8, gpu_model=GPU_MODELS[0]))
        for name in running
    ]
    mix = WorkloadMix.default()
    state = SimState.new(nodes, make_policy("least-allocated"), "least-allocated", mix)
    for row, seats in enumerate(running.values()):
        for name, gpus, qos, first in seats:
            pod = Pod(name, "team-a", gpus, cpu_milli=4000, memory_mib=16_384, qos=qos)
            state.place(pod, row, tuple(range(first, first + gpus)), 0.0)
            job = Job(pod, 0.0, work_h=10.0, interval_h=checkpoint_h, overhead_h=5 / 60)
            job.start(0.0, overhead=False)
            state.jobs[pod.key] = job
    for name, gpus, qos, queued in pending:
        pod = Pod(name, "team-a", gpus, cpu_milli=8000, memory_mib=65_536, qos=qos)
        job = Job(pod, queued, work_h=10.0, interval_h=0.5, overhead_h=10 / 60)
        job.queued_at = queued
        state.jobs[pod.key] = job
        state.pending[pod.key] = pod
    return state


def _fragmented(queued: float) -> SimState:
    """Two 8-GPU nodes, four 1-GPU pods on each (the least-allocated scheduler's spread), and
    an 8-GPU training pod queued at ``queued``: 8 GPUs free, none of them together."""
    spread = {
        node: [(f"small-{row}{slot}", 1, "", 2 * slot) for slot in range(4)]
        for row, node in enumerate(("gpu-a", "gpu-b"))
    }
    return _state(spread, [("train-8g", 8, "Guaranteed", queued)])


def both_decide(
    served: Served,
    state: SimState,
    now: float,
    setup: DaemonSetup,
    qos_class: Callable[[Pod], str] = as_the_view_shows,
    change: Callable[[list[dict[str, Any]]], None] | None = None,
    tweak: Callable[[Seen], Seen] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The simulator's daemon's decision on ``state`` at ``now``, and the daemon's on the same
    world through the API (``change``: applied to the objects first; ``tweak``: to the rest of
    what the daemon's cycle is given)."""
    driver = RecordingDriver(setup)
    sim = facts(*driver.decide(state, now))
    assert driver.capturing.last is not None
    seen = Seen(now, driver.capturing.last, copy_ledger(driver.ledger), None)
    objects = kube_objects(seen.cluster, qos_class)
    if change is not None:
        change(objects)
    if tweak is not None:
        seen = tweak(seen)
    served.reset()
    daemon = facts(*daemon_decides(served, objects, setup, cycle_detector(setup.rules, None), seen))
    return sim, daemon


def test_an_8_gpu_pod_pending_20_minutes_in_a_window_gets_the_same_room(
    served: Served, rules: RuleSet
) -> None:
    now = 0.5  # 00:30, inside the 00:00–01:00 window
    state = _fragmented(queued=now - 20 / 60)
    setup = DaemonSetup(CycleConfig(windows=WINDOWS), ISSUE_PLANNER, rules)
    sim, daemon = both_decide(served, state, now, setup)

    assert ("starvation", "pod/team-a/train-8g") in sim["findings"]
    assert sim["window.open"] and sim["window.key"] == moment(0).isoformat()
    # the room: one node emptied for the pod, its four pods moved to the other one
    assert len(sim["steps"]) == 4
    assert len({(source, target) for _, _, source, target, _ in sim["steps"]}) == 1
    assert {(kind, for_pod) for _, kind, *_, for_pod in sim["steps"]} == {
        ("migrate", "team-a/train-8g")
    }
    assert daemon == sim


def _priority(objects: list[dict[str, Any]]) -> None:
    _named(objects, "train-8g")["spec"]["priority"] = 999  # below min_priority: not starved


def _pending_since(objects: list[dict[str, Any]]) -> None:
    condition = _named(objects, "train-8g")["status"]["conditions"][0]
    condition["lastTransitionTime"] = "2026-01-01T00:20:00.000000Z"  # 10 min, not 15


def _owner_deleting(objects: list[dict[str, Any]]) -> None:
    for pod in [o for o in objects if o["metadata"]["name"].startswith("small-")]:
        ref = pod["metadata"]["ownerReferences"][0]  # its Job is being deleted
        meta = {"name": ref["name"], "namespace": pod["metadata"]["namespace"], "uid": ref["uid"]}
        meta["deletionTimestamp"] = "2026-01-01T00:29:00Z"
        objects.append({"kind": ref["kind"], "metadata": meta, "spec": {"backoffLimit": 6}})


def _checkpoint(objects: list[dict[str, Any]]) -> None:
    for name in ("small-00", "small-01", "small-02", "small-03"):  # gpu-a: days of work at risk
        annotations = _named(objects, name)["metadata"]["annotations"]
        annotations[CHECKPOINT_ANNOTATION] = "2025-12-01T00:00:00Z"


def _named(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == "Pod" and o["metadata"]["name"] == name]
    return obj


def _an_hour_late(seen: Seen) -> Seen:
    return replace(seen, hour=seen.hour + 1)


def _packing_stands(seen: Seen) -> Seen:
    packing = Finding("packing", "cluster", "info", "the scheduler packs", since=moment(0.25))
    return replace(seen, packing=packing)


def _window_spent(seen: Seen) -> Seen:
    """The window's whole budget spent (its ceiling: each plan may spend its own total, sized by
    its backlog, within what the window has left)."""
    ledger = copy_ledger(seen.ledger)
    spent = ledger.ledger(moment(0).isoformat())
    limit = spent.budgets.total
    assert limit is not None
    assert spent.admit([("team-a", f"node-{i % 64}") for i in range(limit)]).ok
    return replace(seen, ledger=ledger)


def _all_evicted_an_hour_ago(seen: Seen) -> Seen:
    """Every running pod evicted an hour before (within the day's anti-thrash guard)."""
    running = [p for p in seen.cluster.pods.values() if p.node is not None]
    return replace(seen, evicted=seen.evicted.record(running, moment(seen.hour - 1)))


@pytest.mark.parametrize(
    ("tweak", "differs"),
    [
        (_an_hour_late, {"window.open", "window.key", "steps"}),
        (_packing_stands, {"held_back", "goal", "steps"}),
        (_window_spent, {"steps", "findings"}),
        (_all_evicted_an_hour_ago, {"steps", "findings"}),
    ],
    ids=["clock", "last-packing", "ledger", "evicted"],
)
def test_the_comparison_sees_another_input(
    served: Served, rules: RuleSet, tweak: Callable[[Seen], Seen], differs: set[str]
) -> None:
    """…and the rest of what the daemon's cycle is given: its clock, the packing finding that
    stands (with a patience that holds every pod back while it does), the window's ledger, the
    evictions it remembers."""
    now = 0.5
    config = CycleConfig(windows=WINDOWS, patience=PackingPatience(None))
    setup = DaemonSetup(config, ISSUE_PLANNER, rules)
    sim, daemon = both_decide(served, _fragmented(now - 20 / 60), now, setup, tweak=tweak)
    assert set(differences(sim, daemon)) == differs


@pytest.mark.parametrize(
    ("change", "differs"),
    [
        (_priority, {"findings", "goal", "steps"}),
        (_pending_since, {"findings", "goal", "steps"}),
        (_owner_deleting, {"steps", "findings"}),
        (_checkpoint, {"steps"}),
    ],
    ids=["priority", "pending-since", "owner-deleting", "checkpoint-annotation"],
)
def test_the_comparison_sees_one_changed_field(
    served: Served,
    rules: RuleSet,
    change: Callable[[list[dict[str, Any]]], None],
    differs: set[str],
) -> None:
    """Each compared field can fail: one field of the objects the daemon reads, changed."""
    now = 0.5
    setup = DaemonSetup(CycleConfig(windows=WINDOWS), ISSUE_PLANNER, rules)
    sim, daemon = both_decide(served, _fragmented(now - 20 / 60), now, setup, change=change)
    assert set(differences(sim, daemon)) == differs


# --- what the differential test found -------------------------------------------------------------


def test_a_latency_sensitive_pod_shown_as_the_api_server_shows_it(
    served: Served, rules: RuleSet
) -> None:
    """Make room for an 8-GPU pod on gpu-a (evict a 1-GPU LS pod) or on gpu-b (evict a 1-GPU
    Guaranteed pod), both with nothing to lose. Found by this test: the view showed the trace's
    ``LS``, which no API server serves, and the simulator's daemon priced the LS pod as serving
    (3/60 h × 1 GPU × (1 + 2000/1000) = 0.15 against 5/60 × 1 × 2.5 = 0.21) and evicted it,
    where the daemon, reading ``status.qosClass: Burstable``, prices it as batch (5/60 × 3 =
    0.25) and evicts the Guaranteed one. The view now shows the class a cluster computes."""
    now = 0.5
    running = {
        "gpu-a": [("serve-ls", 1, "LS", 0)],
        "gpu-b": [("batch-g", 1, "Guaranteed", 0)],
        "gpu-c": [("train-be", 6, "BE", 0)],
    }
    state = _state(running, [("train-8g", 8, "Guaranteed", now - 20 / 60)], checkpoint_h=0.0)
    setup = DaemonSetup(CycleConfig(windows=WINDOWS), ISSUE_PLANNER, rules)
    sim, daemon = both_decide(served, state, now, setup, qos_class=lambda _: UPSTREAM_QOS)
    assert [pod for pod, *_ in sim["steps"]] == ["team-a/batch-g"]
    assert daemon == sim


def test_a_plan_names_each_pod_once(served: Served, rules: RuleSet) -> None:
    """Two 8-GPU pods starve: the room for the first (gpu-a) moves x to gpu-b; the room for the
    second (gpu-b) must not evict x again — on the cluster x is gone by then (its controller's
    replacement has another name). Found by this test: the planner named x twice (migrate, then
    preempt) until a pod the plan has moved was refused as a victim (constraint ``moved``)."""
    now = 0.5
    running = {
        "gpu-a": [("x", 2, "BE", 0)],
        "gpu-b": [("y", 4, "BE", 0)],
        "gpu-c": [("z", 4, "LS", 0)],
    }
    pending = [("p1", 8, "Guaranteed", 0.1), ("p2", 8, "Guaranteed", 0.2)]
    setup = DaemonSetup(CycleConfig(windows=WINDOWS), ISSUE_PLANNER, rules)
    sim, daemon = both_decide(served, _state(running, pending), now, setup)
    assert daemon == sim
    pods = [pod for pod, *_ in sim["steps"]]
    assert len(pods) == len(set(pods)), sim["steps"]
