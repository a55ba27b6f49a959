"""bench/bench_extender_binding.py at a tiny size: the loop runs, and with this code each
binding's filter is answered ahead of its build, never after waiting for one."""

from __future__ import annotations

from bench.bench_extender_binding import FIGURES, one_run


def test_the_binding_loop_answers_ahead() -> None:
    result = one_run(30, 12)
    assert set(FIGURES) <= result.keys()
    fresh = result["fresh"]
    assert sum(fresh.values()) == 12  # one fresh view a filter
    assert fresh.get("waited", 0) == 0
    assert fresh.get("ahead", 0) >= 1  # every binding after the first pod's filter
    assert result["builds"] >= 1
