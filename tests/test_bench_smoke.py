"""Every benchmark runs (tiny) through the one runner, so none can rot (`make bench` runs them
at full size; the figures live in docs/benchmarks.md, never in tests)."""

from __future__ import annotations

import pytest

from bench.run_all import BENCHES, run


@pytest.mark.parametrize("bench", BENCHES, ids=[b.name for b in BENCHES])
def test_bench_runs_quick(bench: object) -> None:
    outcome = run(bench, quick=True)  # type: ignore[arg-type]
    assert outcome.status == "ok", outcome.status
