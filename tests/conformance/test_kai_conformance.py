"""The KAI consolidation port against NVIDIA/KAI-Scheduler's own test tables.

Every row of :mod:`tests.conformance.kai_cases` runs one session of the port, applies its
moves to the simulator's state (so they are valid one at a time), and checks each job
against upstream: its node afterwards, and whether it moved where the test says. What could
not be mapped is listed in ``UNMAPPED`` there (and in docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from defrag.model.resources import Node, Pod
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.sim.kai import KAI_PRIORITY_CLASSES, KaiBinpack, KaiConsolidation, kai_priority
from defrag.sim.migration import Job
from defrag.sim.state import SimState
from tests.conformance.kai_cases import KAI_CASES, UNMAPPED, J, KaiCase


def pod_of(job: J) -> Pod:
    whole = job.gpus >= 1
    return Pod(
        job.name, num_gpu=int(job.gpus) if whole else 1,
        gpu_milli=GPU_MILLI if whole else round(job.gpus * GPU_MILLI),
        priority=KAI_PRIORITY_CLASSES[job.cls], priority_class=job.cls,
    )  # fmt: skip


def build(case: KaiCase) -> tuple[SimState, list[Pod]]:
    nodes = [
        Node(n, cpu_milli=64_000, memory_mib=262_144, num_gpu=g, gpu_model="G")
        for n, g in case.nodes
    ]
    state = SimState.new(nodes, KaiBinpack(), "kai-binpack", WorkloadMix.default())
    rows = {n.name: r for r, n in enumerate(state.nodes)}
    pending: list[Pod] = []
    for k, job in enumerate(case.jobs):
        pod = pod_of(job)
        state.jobs[pod.key] = Job(pod, float(k), 1.0, None, 0.0)  # created in list order
        if job.node is None:
            pending.append(pod)
            state.pending[pod.key] = pod
            continue
        row = rows[job.node]
        free = [
            g
            for g in range(int(state.arrays.gpu_total[row]))
            if state.arrays.gpu_free[row, g] == GPU_MILLI
        ]
        state.place(pod, row, tuple(free[: pod.num_gpu]))
    return state, pending


@pytest.mark.parametrize("case", KAI_CASES, ids=[f"{c.where} {c.name[:60]}" for c in KAI_CASES])
def test_kai_consolidation_case(case: KaiCase) -> None:
    state, pending = build(case)
    outcome = KaiConsolidation().plan(state, pending)
    state.apply_moves(outcome.moves)  # each move fits when its turn comes
    moved = {m.pod_id for m in outcome.moves}
    for job in case.jobs:
        key = f"default/{job.name}"
        if key in state.placed:
            node: str | None = state.nodes[state.placed[key].row].name
        elif key in outcome.bound:
            node = state.nodes[outcome.bound[key]].name
        else:
            node = None
        assert node == job.expect_node, job.name
        if job.moved is not None:
            assert (key in moved) is job.moved, job.name


def test_the_table_holds_every_mappable_upstream_case() -> None:
    # consolidation_test.go: 20 cases, 10 mapped; integration consolidation_test.go: 4, 2 mapped;
    # consolidationFractional_test.go: 5, 4 mapped
    assert len(KAI_CASES) == 16
    assert all(reason for _, reason in UNMAPPED)


@pytest.mark.parametrize(
    ("pod", "priority", "preemptible"),
    [
        (Pod("t", priority_class="train"), 50, True),
        (Pod("i", priority_class="interactive-preemptible"), 75, True),
        (Pod("b", priority_class="build"), 100, False),
        (Pod("s", priority_class="inference"), 125, False),
        (Pod("own", priority_class="batch-low", priority=20), 20, True),  # its class's value
        (Pod("bare"), 50, True),  # no class: the default grouper's train
    ],
)
def test_preemptibility_is_the_priority_class_against_100(
    pod: Pod, priority: int, preemptible: bool
) -> None:
    # preemptible.go 22: priority < 100 is preemptible
    assert kai_priority(pod) == priority
    assert (kai_priority(pod) < 100) is preemptible
