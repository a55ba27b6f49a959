"""The descheduler port against kubernetes-sigs/descheduler's own test tables.

Every row of :mod:`tests.conformance.descheduler_cases` runs the port once (one
``Balance``) and checks upstream's expectation: the number of pods evicted and, where the
case names them, which. What could not be mapped is listed in ``UNMAPPED`` there (and in
docs/benchmarks.md, "Peer conformance")."""

from __future__ import annotations

import pytest

from defrag.model.workload import WorkloadMix
from defrag.scoring.policies import make_policy
from defrag.sim.descheduler import (
    ConfigError,
    DefaultEvictor,
    HighNodeUtilization,
    Limits,
    LowNodeUtilization,
)
from defrag.sim.hooks import REQUEUE
from defrag.sim.state import SimState
from tests.conformance.descheduler_cases import HNU_CASES, LNU_CASES, UNMAPPED, Case


def build(case: Case) -> SimState:
    nodes = [n.node() for n in case.nodes]
    mix = WorkloadMix.default()
    state = SimState.new(nodes, make_policy("most-allocated", mix=mix), "most-allocated", mix)
    rows = {n.name: r for r, n in enumerate(state.nodes)}
    for p in case.pods:
        row = rows[p.node]
        free = [
            g
            for g in range(int(state.arrays.gpu_total[row]))
            if state.arrays.gpu_free[row, g] == 1000
        ]
        state.place(p.pod(), row, tuple(free[: p.gpus]))
    return state


def run(case: Case) -> list[str]:
    """The names of the pods the port evicts, in order."""
    evictor = DefaultEvictor(node_fit=case.node_fit)
    limits = Limits(per_node=case.per_node)
    hook: HighNodeUtilization | LowNodeUtilization
    if case.plugin == "hnu":
        hook = HighNodeUtilization(
            case.thresholds, eviction_modes=case.modes, evictor=evictor, limits=limits,
            exclude_namespaces=frozenset(case.exclude),
        )  # fmt: skip
    else:
        hook = LowNodeUtilization(
            case.thresholds, case.targets, use_deviation_thresholds=case.deviation,
            evictor=evictor, limits=limits, exclude_namespaces=frozenset(case.exclude),
        )  # fmt: skip
    state = build(case)
    moves = hook.on_tick(state, 0.0)
    assert all(m.target_row == REQUEUE for m in moves)
    return [m.pod_id.split("/", 1)[1] for m in moves]


CASES = (*HNU_CASES, *LNU_CASES)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.where} {c.name}" for c in CASES])
def test_upstream_case(case: Case) -> None:
    evicted = run(case)
    assert len(evicted) == case.expected
    if case.evicted:
        assert sorted(evicted) == sorted(case.evicted)


def test_the_tables_hold_every_upstream_case_or_say_why_not() -> None:
    # highnodeutilization_test.go: 14 TestHighNodeUtilization cases + 3 with taints;
    # lownodeutilization_test.go: 17 TestLowNodeUtilization cases + 4 with taints
    assert (len(HNU_CASES), len(LNU_CASES)) == (17, 21)
    assert all(reason for _, reason in UNMAPPED)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        # validation.go 79-100: the same resources on both sides, low ≤ high
        (lambda: LowNodeUtilization({"gpu": 20}, {"cpu": 50}), "configured different resources"),
        (lambda: LowNodeUtilization({"gpu": 60}, {"gpu": 50}), "greater than targetThresholds"),
        (lambda: LowNodeUtilization({}, {}), "no resource threshold is configured"),
        (lambda: HighNodeUtilization({"gpu": 120}), r"not in \[0, 100\] range"),
        (lambda: HighNodeUtilization({"disk": 10}), "unknown resource 'disk'"),
        (
            lambda: HighNodeUtilization({"gpu": 20}, eviction_modes=("Strict",)),
            "invalid eviction mode",
        ),
    ],
)
def test_arguments_upstream_refuses_are_refused_with_the_reason(make: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()  # type: ignore[operator]


def test_deviation_thresholds_allow_a_low_above_the_target() -> None:
    # validation.go 95: low > high only with useDeviationThresholds
    LowNodeUtilization({"gpu": 10}, {"gpu": 5}, use_deviation_thresholds=True)
