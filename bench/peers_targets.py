"""Issue 36's targets read from ``bench_peers --json`` files: per scheduler, the rows side by
side for each trace and seed, then how many runs meet each target.

    python -m bench.peers_targets RUNS.json [MORE.json ...]

Each file is one ``bench_peers`` invocation (named ``…-<trace>.json`` when several traces are
read; the trace is the part after the last ``-``). A cell is multi-GPU p95 h / 4-GPU p95 h /
1-GPU p95 h / share p95 h / goodput % / lost GPU·h / evictions / most evictions of one pod.
KAI and the descheduler install their own scheduler: their one run is shown under every
scheduler. The targets, per scheduler over its runs: defrag's goodput the highest of all rows
(``none`` and the peers), and never more than 0.1 point below; its multi-GPU p95 at most 0.7 ×
``none``'s and at most 1.05 × the best peer's; the 4-GPU and share classes' p95 within 0.25 h
of ``none``'s; no pod evicted more than twice.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bench_peers import FIXED_SCHEDULER

ROWS = ("none", "defrag", "kai-consolidation", "descheduler-hnu")
PEERS = ("kai-consolidation", "descheduler-hnu")
SLACK = 1e-9


def p95(run: dict[str, Any], shape: str) -> float:
    return float(run["pending_by_gpus"][shape]["p95_wait_h"])


def cell(run: dict[str, Any]) -> str:
    return (
        f"{p95(run, 'multi'):.2f} / {p95(run, '4'):.2f} / {p95(run, '1'):.2f} / "
        f"{p95(run, 'share'):.2f} / {run['goodput_pct']:.1f} / {run['lost_gpu_hours']:.0f} / "
        f"{run['evictions']:,} / {run['max_evictions_per_pod']}"
    )


@dataclass(frozen=True, slots=True)
class Tally:
    runs: int
    goodput_highest: int
    goodput_within: int
    below_by: tuple[tuple[str, float], ...]
    p95_vs_none: int
    p95_vs_peer: int
    four_gpu: int
    share: int
    evicted_at_most_twice: int
    lost: tuple[int, ...]


def runs_by_case(files: list[Path]) -> dict[tuple[str, int], dict[tuple[str, str], Any]]:
    """(trace, seed) → (policy, row) → the run."""
    out: dict[tuple[str, int], dict[tuple[str, str], Any]] = {}
    for path in files:
        trace = path.stem.rsplit("-", 1)[-1]
        for run in json.loads(path.read_text()):
            out.setdefault((trace, run["seed"]), {})[(run["policy"], run["defragmenter"])] = run
    return out


def row(case: dict[tuple[str, str], Any], policy: str, name: str) -> Any:
    if name in FIXED_SCHEDULER:
        return next(run for (_p, d), run in case.items() if d == name)
    return case[(policy, name)]


def tally(cases: dict[tuple[str, int], dict[tuple[str, str], Any]], policy: str) -> Tally:
    highest = within = vs_none = vs_peer = four = share = twice = 0
    below: list[tuple[str, float]] = []
    lost: list[int] = []
    for (trace, seed), case in sorted(cases.items()):
        none, ours = row(case, policy, "none"), row(case, policy, "defrag")
        peers = [row(case, policy, p) for p in PEERS]
        top = max(r["goodput_pct"] for r in (none, *peers))
        highest += ours["goodput_pct"] >= top
        if ours["goodput_pct"] >= top - 0.1:
            within += 1
        else:
            below.append((f"{trace} {seed}", round(top - ours["goodput_pct"], 2)))
        vs_none += p95(ours, "multi") <= 0.7 * p95(none, "multi") + SLACK
        vs_peer += p95(ours, "multi") <= 1.05 * min(p95(p, "multi") for p in peers) + SLACK
        four += p95(ours, "4") <= p95(none, "4") + 0.25 + SLACK
        share += p95(ours, "share") <= p95(none, "share") + 0.25 + SLACK
        twice += ours["max_evictions_per_pod"] <= 2
        lost.append(round(ours["lost_gpu_hours"]))
    return Tally(
        len(cases), highest, within, tuple(below), vs_none, vs_peer, four, share, twice, tuple(lost)
    )


def policies_of(cases: dict[tuple[str, int], dict[tuple[str, str], Any]]) -> list[str]:
    seen = {p for case in cases.values() for (p, d) in case if d not in FIXED_SCHEDULER}
    return sorted(seen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    args = parser.parse_args(argv)
    cases: dict[tuple[str, int], dict[tuple[str, str], Any]] = {}
    for path in args.runs:
        try:
            for key, case in runs_by_case([path]).items():
                cases.setdefault(key, {}).update(case)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {path}: not bench_peers --json runs ({exc})", file=sys.stderr)
            return 2
    policies = policies_of(cases)
    print("| scheduler | trace, seed | none | defrag | KAI | descheduler HNU |")
    print("|---|---|---|---|---|---|")
    for policy in policies:
        for (trace, seed), case in sorted(cases.items()):
            cells = " | ".join(cell(row(case, policy, name)) for name in ROWS)
            print(f"| {policy} | {trace}, {seed} | {cells} |")
    print()
    for policy in policies:
        t = tally(cases, policy)
        n = t.runs
        below = ", ".join(f"{case} by {gap}" for case, gap in t.below_by) or "none"
        print(
            f"{policy}: goodput the highest {t.goodput_highest}/{n}, within 0.1 point "
            f"{t.goodput_within}/{n} (below: {below}); multi-GPU p95 ≤ 0.7 × none "
            f"{t.p95_vs_none}/{n}, ≤ 1.05 × the best peer {t.p95_vs_peer}/{n}; 4-GPU p95 "
            f"within 0.25 h {t.four_gpu}/{n}, share {t.share}/{n}; at most two evictions of a "
            f"pod {t.evicted_at_most_twice}/{n}; lost GPU·h {', '.join(map(str, t.lost))}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
