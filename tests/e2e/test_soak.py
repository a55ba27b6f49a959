"""A short chaos soak (``bench/bench_soak.py``) on the real control plane: a few dozen daemon
cycles under API faults and chaos, every invariant 0.

Its own control plane (the soak needs a second ServiceAccount, its own nodes and an audit log
of its own), so it does not use the module's ``plane`` fixture. The full soak is
``make soak`` / ``python -m bench.bench_soak --seed N --cycles 1000``.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_soak import Soak, table
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
    assert report["faults"], "no fault was injected"
    assert sum(report["chaos"].values()) >= 3, report["chaos"]
