"""A short chaos soak (``bench/bench_soak.py``) on the real control plane: a few dozen daemon
cycles under API faults and chaos, every invariant 0 — among them no eviction of a pod nothing
recreates (bare pods, pods owned by a Pod or a ConfigMap, pods with only a non-controlling
reference, pods of Jobs with ``backoffLimit: 0``), no second room for a pod, and no window's
eviction budget overrun.

Its own control plane (the soak needs a second ServiceAccount, its own nodes and an audit log
of its own), so it does not use the module's ``plane`` fixture. The full soak is
``make soak`` / ``python -m bench.bench_soak --seed N --cycles 1000``.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_soak import NEVER_KINDS, WINDOW_BUDGET, Soak, table
from tests.e2e.controlplane import require_assets


def test_short_chaos_soak_holds_every_invariant(tmp_path: Path) -> None:
    require_assets()
    soak = Soak(seed=7, cycles=60, folder=tmp_path, nodes=6, drain_s=20, max_wall_s=150,
                chaos_every_s=(2.0, 5.0), verbose=False)  # fmt: skip
    report = soak.run()
    print(table(report))
    assert report["cycles"] >= 40, report["cycles"]
    assert report["violations"] == dict.fromkeys(report["violations"], 0), json.dumps(
        report["details"], indent=2, default=str
    )
    for name in ("evictions_not_returning", "jobs_backoff_exceeded", "second_rooms",
                 "budget_overruns"):  # fmt: skip
        assert report["violations"][name] == 0, json.dumps(report["details"][name], default=str)
    # the never-evict workloads ran beside the others, and the budgets were counted
    assert set(report["never_evict_created"]) == set(NEVER_KINDS), report["never_evict_created"]
    assert report["budget"]["limit"] == WINDOW_BUDGET
    assert sum(report["budget"]["evictions_by_key"].values()) == report["evictions_201"]
    assert report["faults"], "no fault was injected"
    assert sum(report["chaos"].values()) >= 3, report["chaos"]
