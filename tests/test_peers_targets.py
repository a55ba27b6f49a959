"""Issue 36's targets counted from bench_peers' JSON: which row is the best peer, the fixed
scheduler rows shown under every policy, the 0.1-point and 0.7 × / 1.05 × rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import peers_targets


def run(
    policy: str, row: str, seed: int, goodput: float, multi: float, **kw: Any
) -> dict[str, Any]:
    shapes = {
        "multi": multi,
        "4": kw.get("four", 0.0),
        "1": 0.0,
        "share": kw.get("share", 0.0),
    }
    return {
        "policy": policy,
        "defragmenter": row,
        "seed": seed,
        "goodput_pct": goodput,
        "lost_gpu_hours": kw.get("lost", 0.0),
        "evictions": kw.get("evictions", 0),
        "max_evictions_per_pod": kw.get("most", 0),
        "pending_by_gpus": {k: {"p95_wait_h": v} for k, v in shapes.items()},
    }


def write(tmp_path: Path, name: str, runs: list[dict[str, Any]]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(runs))
    return path


def test_each_target_is_counted_per_scheduler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [
        # seed 1: defrag the best goodput, p95 low
        run("least-allocated", "none", 1, 66.0, 30.0),
        run("least-allocated", "defrag", 1, 90.0, 2.0, lost=30, evictions=100, most=2),
        run("least-allocated", "kai-consolidation", 1, 89.0, 1.0),  # its own scheduler
        run("least-allocated", "descheduler-hnu", 1, 88.0, 5.0),
        # seed 2: 0.05 below KAI (within 0.1, not the highest), p95 above 1.05 × KAI's,
        # the 4-GPU class 0.3 h worse than none's, a pod evicted three times
        run("least-allocated", "none", 2, 66.0, 30.0),
        run("least-allocated", "defrag", 2, 89.95, 2.0, four=0.3, most=3),
        run("least-allocated", "kai-consolidation", 2, 90.0, 1.0),
        run("least-allocated", "descheduler-hnu", 2, 88.0, 5.0),
    ]
    path = write(tmp_path, "held-multigpu20.json", runs)
    cases = peers_targets.runs_by_case([path])
    assert set(cases) == {("multigpu20", 1), ("multigpu20", 2)}
    t = peers_targets.tally(cases, "least-allocated")
    assert (t.runs, t.goodput_highest, t.goodput_within) == (2, 1, 2)
    assert t.below_by == ()
    assert (t.p95_vs_none, t.p95_vs_peer) == (2, 0)  # 2.0 > 1.05 × 1.0
    assert (t.four_gpu, t.share, t.evicted_at_most_twice) == (1, 2, 1)
    assert t.lost == (30, 0)
    assert peers_targets.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| least-allocated | multigpu20, 1 |" in out
    assert "goodput the highest 1/2, within 0.1 point 2/2 (below: none)" in out


def test_a_fixed_scheduler_peer_counts_under_every_policy_and_a_gap_is_named(
    tmp_path: Path,
) -> None:
    runs = [
        run("least-allocated", "none", 7, 66.0, 30.0),
        run("least-allocated", "defrag", 7, 88.0, 1.0),
        run("least-allocated", "kai-consolidation", 7, 89.5, 0.0),
        run("least-allocated", "descheduler-hnu", 7, 87.0, 4.0),
        run("most-allocated", "none", 7, 88.0, 10.0),
        run("most-allocated", "defrag", 7, 89.6, 1.0),
    ]
    cases = peers_targets.runs_by_case([write(tmp_path, "x-cpu050.json", runs)])
    assert peers_targets.policies_of(cases) == ["least-allocated", "most-allocated"]
    low = peers_targets.tally(cases, "least-allocated")
    assert low.below_by == (("cpu050 7", 1.5),)
    assert low.p95_vs_peer == 0  # KAI's p95 is 0: only 0 would do
    most = peers_targets.tally(cases, "most-allocated")  # KAI's one run counts here too
    assert (most.goodput_highest, most.below_by) == (1, ())


def test_unreadable_runs_are_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "runs-default.json"
    bad.write_text("{not json")
    assert peers_targets.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: not bench_peers --json runs") and err.count("\n") == 1
