"""``make bench``'s targets table: each figure read from a bench's output, beside its target and
divided by the calibration."""

from __future__ import annotations

from bench.run_all import BENCHES, Outcome, targets_table

PLAN_OUT = """| cluster | nodes | GPUs | allocated | steps | targets | plan s | target s | peak |
| openb 90% | 1213 | 6212 | 90.0% | 3 | 0 | 0.41 | 2 | 300 |
| synthetic 10000 | 10000 | 80000 | 71.3% | 50 | 40 | 6.20 | 20 | 900 |
"""
EXTENDER_OUT = """path                      p50 ms    p99 ms    max ms
handler CPU time            2.74      3.35      6.01
HTTP keep-alive            12.79     33.79     98.35
"""


def test_figures_are_read_and_compared() -> None:
    by_name = {b.name: b for b in BENCHES}
    outcomes = [
        Outcome(by_name["plan"], "ok", 1.0, PLAN_OUT),
        Outcome(by_name["extender"], "ok", 1.0, EXTENDER_OUT),
        Outcome(by_name["cycle"], "ok", 1.0, "best cycle: 2.50 s (target ≤ 3 s): PASS\n"),
    ]
    rows = targets_table(outcomes, cal_s=0.5)
    # plan s is the 7th column; ÷ calibration: 0.41 / 0.5 = 0.82, 6.2 / 0.5 = 12.4
    assert "| plan | plan, openb 90% | 0.41 s | ≤ 2 s | yes | 0.82 |" in rows
    assert "| plan | plan, 10,000 nodes | 6.2 s | ≤ 5 s | no | 12.40 |" in rows
    # the p99 over HTTP, in ms: 33.79 ms / 0.5 s = 0.068 → 0.07
    extender = "| extender | prioritize p99, 5,000 nodes, HTTP | 33.79 ms | ≤ 5 ms | no | 0.07 |"
    assert extender in rows
    assert "| cycle | cycle, 5,000 nodes / 40,000 pods | 2.5 s | ≤ 3 s | yes | 5.00 |" in rows
    assert "| cycle | its snapshot | not found | ≤ 0.5 s |" in rows
