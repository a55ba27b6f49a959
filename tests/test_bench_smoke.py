"""Every benchmark except the trace replays runs (tiny) through the one runner, so none can rot
(`make bench` runs them at full size; the figures live in docs/benchmarks.md, never in tests).
The trace replays are in tests/test_bench_smoke_sim.py (a file of their own, so that the two
halves run on different workers)."""

from __future__ import annotations

import pytest

from bench.run_all import BENCHES, Bench, run

OTHERS = [b for b in BENCHES if not b.simulator]


@pytest.mark.parametrize("bench", OTHERS, ids=[b.name for b in OTHERS])
def test_bench_runs_quick(bench: Bench) -> None:
    outcome = run(bench, quick=True)
    if outcome.status.startswith("skipped"):
        pytest.skip(f"{bench.name}: {outcome.status}")
    assert outcome.status == "ok", outcome.status
