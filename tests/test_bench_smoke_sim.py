"""The trace-replay benchmarks run (tiny) through the one runner, so none can rot."""

from __future__ import annotations

import pytest

from bench.run_all import BENCHES, Bench, run

SIMULATORS = [b for b in BENCHES if b.simulator]


@pytest.mark.parametrize("bench", SIMULATORS, ids=[b.name for b in SIMULATORS])
def test_simulator_bench_runs_quick(bench: Bench) -> None:
    outcome = run(bench, quick=True)
    if outcome.status.startswith("skipped"):
        pytest.skip(f"{bench.name}: {outcome.status}")
    assert outcome.status == "ok", outcome.status
