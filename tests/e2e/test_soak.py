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

import pytest

from bench.bench_soak import CHAOS_STARTED, NEVER_KINDS, WINDOW_BUDGET, Soak, table
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


def test_the_memory_soaks_slope_is_fitted_after_the_warm_up_per_process() -> None:
    """The long soak's figure (``bench_soak.long_rss_figures``): a least-squares slope over
    the samples taken ``WARMUP_S`` or more after the start, per process; a warm-up that grows
    fast does not count, a restart shows as a second PID."""
    from bench.bench_soak import WARMUP_S, long_rss_figures

    start = 1_000_000.0
    rows = []
    for minute in range(60):
        t = start + 60 * minute
        warm = t - start < WARMUP_S
        # 5 MB/min during the warm-up, then 8 kB/min with a sawtooth of ±40 kB (GC)
        flat = 100_000 + (5_000 * minute if warm else 75_000 + 8 * minute + 40 * (minute % 2))
        rows.append((t, "daemon", 11, flat))
        rows.append((t, "leaky", 12 if minute < 30 else 13, 100_000 + 300 * minute))
    figures = long_rss_figures(rows, start)
    daemon, leaky = figures["daemon"], figures["leaky"]
    assert daemon["samples"] == 60 and daemon["pids"] == 1
    assert daemon["samples_after_warmup"] == 60 - int(WARMUP_S // 60)
    assert 6 <= daemon["slope_kb_per_min_after_warmup"] <= 10, daemon
    assert 290 <= leaky["slope_kb_per_min_after_warmup"] <= 310, leaky
    # the interval holds the slope drawn; the sawtooth widens the flat one's, the line has none
    low, high = daemon["slope_ci95_kb_per_min"]
    assert low < 8 < high and high - low > 0, daemon
    low, high = leaky["slope_ci95_kb_per_min"]
    assert abs(low - 300) < 1e-6 and abs(high - 300) < 1e-6, leaky
    assert leaky["pids"] == 2
    assert daemon["peak_mb"] >= daemon["mb_at_end"]


def test_the_soak_keeps_only_the_audit_events_its_invariants_read() -> None:
    """A soak of hours logs millions of requests; the harness holds node and Lease writes,
    evictions and pod deletions only (audit.k8s.io/v1 Event ``objectRef``: kubernetes
    staging/src/k8s.io/apiserver/pkg/apis/audit/v1/types.go)."""
    from bench.bench_soak import kept

    def event(verb: str, resource: str, subresource: str | None = None) -> dict[str, object]:
        ref = {"resource": resource, "namespace": "soak", "name": "x", "apiVersion": "v1"}
        if subresource:
            ref["subresource"] = subresource
        return {"kind": "Event", "verb": verb, "objectRef": ref}

    assert kept(event("create", "pods", "eviction"))
    assert kept(event("delete", "pods"))
    assert kept(event("patch", "nodes"))
    assert kept(event("update", "leases"))
    assert not kept(event("get", "pods"))
    assert not kept(event("list", "nodes"))
    assert not kept(event("get", "leases"))
    assert not kept(event("patch", "pods", "status"))
    assert not kept(event("create", "deployments"))
    assert not kept({"kind": "Event", "verb": "get"})


def test_the_soak_plot_finds_when_the_chaos_began_beside_the_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bench/soak_plot.py`` reads the chaos's start from the file the soak writes beside
    ``rss.csv`` (so ``make soak-memory`` plots without being told it); without the file and
    without ``--since`` it says which file is missing, one ``error:`` line."""
    from bench import soak_plot
    from bench.bench_soak import WARMUP_S

    lines = ["time_utc,elapsed_s,process,pid,rss_kb"]
    for minute in range(40):
        stamp = f"2026-12-04T10:{minute:02d}:00+00:00"
        lines.append(f"{stamp},{60 * minute},daemon-defrag,7,{200_000 + 100 * minute}")
    (tmp_path / "rss.csv").write_text("\n".join(lines) + "\n")
    args = [str(tmp_path / "rss.csv"), "--out", str(tmp_path / "rss.png")]
    assert soak_plot.main(args) == 2
    assert f"error: {tmp_path / CHAOS_STARTED}" in capsys.readouterr().err
    (tmp_path / CHAOS_STARTED).write_text("2026-12-04T10:10:00+00:00\n")
    assert soak_plot.main([*args, "--json", str(tmp_path / "figures.json")]) == 0
    figure = json.loads((tmp_path / "figures.json").read_text())["daemon-defrag"]
    # samples from minute 10 (the chaos) + WARMUP_S on: 100 kB/min exactly
    assert figure["samples_after_warmup"] == 40 - 10 - int(WARMUP_S // 60)
    assert abs(figure["slope_kb_per_min_after_warmup"] - 100) < 1e-6
    assert (tmp_path / "rss.png").stat().st_size > 0


def test_an_eviction_is_the_leaders_while_it_renews_the_lease_without_a_break() -> None:
    """The soak's Lease invariant: an eviction the API server finished after the Lease's
    duration from the last renewal before it came is still the leader's when a renewal by the
    same replica landed in time meanwhile (the one-replica 2 h soak's flagged eviction: received
    3.7 s into a 4 s Lease, finished 0.5 s later, the Lease renewed 0.1 s after it came); not
    when the renewal came late, nor once another replica took the Lease."""
    from bench.bench_soak import held_until

    first = (100.0, 100.01, "defrag")
    renewed = [first, (103.8, 103.9, "defrag"), (107.5, 107.6, "defrag")]
    assert held_until(renewed, first, 4.0) == pytest.approx(111.5)
    late = [first, (104.2, 104.3, "defrag")]  # after the first tenure ran out at 104.0
    assert held_until(late, first, 4.0) == pytest.approx(104.0)
    taken = [first, (103.0, 103.1, "defrag"), (105.0, 105.1, "defrag-2")]
    assert held_until(taken, first, 4.0) == pytest.approx(105.0)
    assert held_until([first], first, 4.0) == pytest.approx(104.0)


def test_an_alert_that_lapsed_under_a_leader_that_did_not_find_it_has_not_re_fired() -> None:
    """The soak's re-fired-alerts invariant (``bench_soak.refired``) on the two-replica 2 h
    soak's timeline (seconds from 20:26:00 UTC): ``defrag-2`` led and found its circuit open at
    18 s, then followed; ``defrag`` led from 61 s to 128 s without the finding (its breaker was
    closed) and never knew the alert, which lapsed in Alertmanager at its ``endsAt`` (18 s +
    ``ttl_s``), with no cycle there; ``defrag-2`` led again at 226.6 s and its breaker tripped
    anew. The invariant looked from 3 s before the resolution only, found no leader cycle and
    counted a re-fire; the finding had cleared from the alert's last refresh on."""
    from bench.bench_soak import refired

    t0 = 1_796_415_960.0  # 2026-12-04T20:26:00Z
    labels = {"alertname": "DefragCircuitOpen", "detector": "executor", "severity": "critical"}
    kind_of = {"DefragCircuitOpen": "circuit-open"}
    received = [
        (t0 + 18.1, "firing", labels, None),
        (t0 + 138.0, "resolved", labels, t0 + 138.0),
        (t0 + 226.6, "firing", labels, None),
    ]
    other = [(t0 + s, {"starvation", "plan-blocked"}) for s in (61.2, 71.9, 92.0, 107.0, 128.7)]
    cycles = sorted([(t0 + 18.1, {"circuit-open", "starvation"}), *other])
    assert refired(received, cycles, kind_of, ttl_s=120) == []
    # the same resolution with every leader cycle since the last refresh finding it: a re-fire
    found = [(t, {"circuit-open"}) for t, _ in cycles]
    (lapsed,) = refired(received, found, kind_of, ttl_s=120)
    assert "lapsed 120 s after its last refresh" in lapsed
    # a leader resolved it (its cycle at the endsAt) while every leader cycle found the kind:
    # a re-fire; one cycle that did not find it in between clears it
    by_leader = [(t0 + 100.0, "resolved", labels, t0 + 99.5), received[2]]
    steady = [(t0 + s, {"circuit-open"}) for s in (95.0, 100.2, 105.0, 226.0)]
    (flapped,) = refired(by_leader, steady, kind_of, ttl_s=120)
    assert "by a leader" in flapped
    cleared = sorted([*steady, (t0 + 150.0, {"starvation"})])
    assert refired(by_leader, cleared, kind_of, ttl_s=120) == []
    # the old window (from 3 s before the resolution) would have counted the lapse
    assert not any(t0 + 135.0 <= t <= t0 + 226.6 for t, _ in cycles)


def test_a_notifications_end_time_is_read_from_alertmanagers_webhook() -> None:
    from bench.bench_soak import ends_at

    assert ends_at({"endsAt": "2026-12-04T20:28:18.021Z"}) == pytest.approx(1_796_416_098.021)
    assert ends_at({}) is None
