"""The simulated cluster shows the checkpoint handshake as a cluster would: a pod that answers
defrag's checkpoint request in the run shows ``defrag.io/checkpoint: supported`` (and no other
pod does), so the daemon prices its eviction at its restart — through the simulator's ports and
through the API server alike."""

from __future__ import annotations

import numpy as np
import pytest

from defrag.adapters.kube_convert import pod_from_json
from defrag.decide import CycleConfig
from defrag.model.resources import (
    CHECKPOINT_ANNOTATION,
    CHECKPOINT_SUPPORT_ANNOTATION,
    CHECKPOINT_SUPPORTED,
    Node,
    Pod,
)
from defrag.model.workload import WorkloadMix
from defrag.plan.cost import CostModel
from defrag.rules import RuleSet
from defrag.scoring.policies import make_policy
from defrag.sim.daemon_driver import DaemonSetup
from defrag.sim.daemon_view import ClusterView, moment
from defrag.sim.migration import Job, MigrationCost, answers_handshake
from defrag.sim.state import SimState
from tests.support.sim_objects import kube_objects

# rules and served are test_one_decision's module fixtures (shared, not copied): hence F401
from tests.test_one_decision import (  # noqa: F401
    GPU_MODELS,
    ISSUE_PLANNER,
    WINDOWS,
    Served,
    as_the_api_shows,
    both_decide,
    rules,
    served,
)

NOW = 0.5
NODES = [
    as_the_api_shows(Node(name, 64_000, 512 * 1024, num_gpu=8, gpu_model=GPU_MODELS[0]))
    for name in ("gpu-a", "gpu-b")
]


def _pod(name: str, gpus: int, qos: str = "Burstable") -> Pod:
    return Pod(name, "team-a", gpus, cpu_milli=4000, memory_mib=16_384, qos=qos)


RUNNING = (_pod("train-a", 2), _pod("train-b", 2), _pod("serve-2", 1, "LS"))
PENDING = (_pod("job-2", 1), _pod("job-1", 1))


def test_the_names_fall_on_either_side_of_half() -> None:
    # by name alone, train-a, serve-2 and job-2 fall below half, train-b and job-1 do not;
    # serve-2 is a serving pod: no state to save, it never answers
    assert [answers_handshake(p, 0.5) for p in (*RUNNING, *PENDING)] == [
        True, False, True, True, False,
    ]  # fmt: skip


def _state(cost: MigrationCost) -> SimState:
    """``RUNNING`` started at hour 0 on gpu-a, ``PENDING`` queued at 0.25; each pod's job made
    by ``cost``, as the timeline makes it."""
    state = SimState.new(NODES, make_policy("least-allocated"), "least-allocated", _mix())
    rng = np.random.default_rng(3)
    slot = 0
    for p in RUNNING:
        state.place(p, 0, tuple(range(slot, slot + p.num_gpu)), 0.0)
        slot += p.num_gpu
        job = cost.job(p, 0.0, 10.0, rng)
        job.start(0.0, overhead=False)
        state.jobs[p.key] = job
    for p in PENDING:
        job = cost.job(p, 0.25, 10.0, rng)
        job.queued_at = 0.25
        state.jobs[p.key] = job
        state.pending[p.key] = p
    return state


def _mix() -> WorkloadMix:
    return WorkloadMix.default()


def _supported(pod: Pod) -> bool:
    return pod.annotations.get(CHECKPOINT_SUPPORT_ANNOTATION) == CHECKPOINT_SUPPORTED


@pytest.mark.parametrize("checkpoints", [True, False], ids=["view", "blind-view"])
def test_exactly_the_pods_that_answer_show_support(checkpoints: bool) -> None:
    cost = MigrationCost(handshake_share=0.5)
    state = _state(cost)
    cluster = ClusterView(checkpoints=checkpoints).cluster(state, NOW)
    shown = {p.name: p for p in cluster.pods.values()}
    answering = {p.name for p in (*RUNNING, *PENDING) if state.jobs[p.key].answers_handshake}
    assert answering == {"train-a", "job-2"}  # a training pod and a batch pod; serving never
    assert {n for n, p in shown.items() if _supported(p)} == answering
    assert {n for n, p in shown.items() if p.checkpoints_on_request} == answering
    # the daemon's price: an answering pod's stall and restart alone, the other one its work at
    # risk too (2 GPUs × hours × 2: Burstable is shown at priority 1000, which doubles a price)
    prices = CostModel()
    at = moment(NOW)
    train_a, train_b = shown["train-a"], shown["train-b"]
    assert prices.eviction(train_a, at) == pytest.approx(2 * (2 + 10) / 60 * 2, abs=1e-6)
    assert prices.known(train_a, at) == pytest.approx(2 * (2 + 10) / 60 * 2, abs=1e-6)
    # train-b drew a checkpoint every 37 min: none yet at 0:30, its 30 min of work at risk
    assert state.jobs[train_b.key].interval_h == pytest.approx(0.618, abs=1e-3)
    assert prices.eviction(train_b, at) == pytest.approx(2 * (10 / 60 + 0.5) * 2, abs=1e-6)
    # an answering pod's state is saved on request: the view shows it fresh, when it shows any
    assert (CHECKPOINT_ANNOTATION in train_a.annotations) is checkpoints


def test_with_the_handshake_off_no_pod_shows_support() -> None:
    state = _state(MigrationCost())
    pods = list(ClusterView().cluster(state, NOW).pods.values())
    assert len(pods) == len(RUNNING) + len(PENDING)
    assert not any(CHECKPOINT_SUPPORT_ANNOTATION in p.annotations for p in pods)


def test_the_annotation_is_read_back_from_the_api_objects() -> None:
    """What the view shows is written as a Kubernetes object and read back by the daemon's
    converter: the annotation is a plain pod annotation."""
    state = _state(MigrationCost(handshake_share=0.5))
    cluster = ClusterView().cluster(state, NOW)
    pods = [o for o in kube_objects(cluster) if o["kind"] == "Pod"]
    read = {p.name: p for p in (pod_from_json(o)[0] for o in pods)}
    assert {n for n, p in read.items() if p.checkpoints_on_request} == {"train-a", "job-2"}
    assert read["train-a"].annotations[CHECKPOINT_SUPPORT_ANNOTATION] == CHECKPOINT_SUPPORTED


# --- the daemon through the API server and the simulator's daemon decide the same -----------


def _fragmented(answering: str) -> SimState:
    """gpu-a and gpu-b, four 1-GPU pods on each since hour 0 (a spreading scheduler's seats),
    none of which ever checkpoints (all their work at risk); those on ``answering`` answer the
    handshake. An 8-GPU pod has waited 20 minutes for a node at ``NOW`` (00:30, inside the
    00:00–01:00 window)."""
    state = SimState.new(NODES, make_policy("least-allocated"), "least-allocated", _mix())
    for row, node in enumerate(("gpu-a", "gpu-b")):
        for k in range(4):
            p = _pod(f"small-{node[-1]}{k}", 1, "")
            state.place(p, row, (2 * k,), 0.0)
            job = Job(p, 0.0, 10.0, None, 5 / 60, node == answering, 1 / 60)
            job.start(0.0, overhead=False)
            state.jobs[p.key] = job
    big = _pod("train-8g", 8, "Guaranteed")
    job = Job(big, NOW - 20 / 60, 10.0, 0.5, 10 / 60)
    job.queued_at = job.arrived
    state.jobs[big.key] = job
    state.pending[big.key] = big
    return state


@pytest.mark.parametrize("answering", ["gpu-a", "gpu-b"])
def test_the_room_is_made_where_the_pods_answer_alike_in_both_drivers(
    served: Served,  # noqa: F811
    rules: RuleSet,  # noqa: F811
    answering: str,
) -> None:
    setup = DaemonSetup(CycleConfig(windows=WINDOWS), ISSUE_PLANNER, rules)
    sim, daemon = both_decide(served, _fragmented(answering), NOW, setup)
    assert sim["window.open"] and sim["steps"], sim
    # the room empties the node whose pods lose only their restart (either node: not a tie)
    assert {source for _, _, source, _, _ in sim["steps"]} == {answering}
    assert daemon == sim
