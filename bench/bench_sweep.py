"""A settings sweep on a loopback ``distributed`` cluster (a scheduler and N workers, each its
own process, started by distributed's command lines) against the simulator's local runner: the
same table, byte for byte; runs per minute with 1 and 2 workers; the per-task overhead.

The sweep: the synthetic workload, small and short so that 200 runs take minutes — rows
``none`` and ``defrag``, ``--seeds`` seeds, and a grid of planner / window settings sized so
that the runs number ``--runs`` (200 by default: 8 seeds × (1 + 24 points)).

    .venv/bin/python -m bench.bench_sweep                 # 200 runs: local, 1 worker, 2 workers
    .venv/bin/python -m bench.bench_sweep --runs 25 --workers 1   # quick

Overhead per task: (wall time − the runs' own time) ÷ runs, with one worker (a worker runs one
task at a time, so the rest is the engine's: submitting, shipping, scheduling, gathering,
caching). Each configuration starts from an empty cache.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.calibrate import calibrate
from defrag.sim.sweep.cache import RunCache
from defrag.sim.sweep.engine import DaskEngine, LocalEngine, Outcome, run_sweep
from defrag.sim.sweep.results import table_columns, tidy_rows, to_csv
from defrag.sim.sweep.spec import load_sweep
from defrag.sim.sweep.tasks import SweepPlan, plan_sweep
from tests.support.dask_loopback import start_loopback

ROOT = Path(__file__).resolve().parents[1]
WORTHS = (0.5, 1, 2, 4)
BUDGETS = (2, 5, 10, 20, 40, 80)


def sweep_text(runs: int) -> str:
    """A sweep of ``runs`` runs: s seeds × (none + points), points from the grid."""
    seeds = 8 if runs >= 40 else 1
    points = runs // seeds - 1
    if points < 1 or seeds * (points + 1) != runs:
        raise SystemExit(f"--runs {runs}: give seeds × (1 + points), e.g. 200 or 25")
    pairs = [(w, b) for b in BUDGETS for w in WORTHS][:points]
    if len(pairs) < points:
        raise SystemExit(f"--runs {runs}: at most {seeds * (len(WORTHS) * len(BUDGETS) + 1)}")
    listed = "\n".join(
        f"  - {{planner.make_room_worth: {w}, windows.max_evictions_per_window: {b}}}"
        for w, b in pairs
    )
    return (
        "traces:\n  - {synthetic: 200, scale: 0.2}\n"
        f"seeds: {seeds}\npolicies: [least-allocated]\nrows: [none, defrag]\n"
        "timeline: {load: 0.9, duration: 2h, warmup: 30m, window_every: 1h}\n"
        f"points:\n{listed}\n"
    )


def timed(plan: SweepPlan, engine: object, cache: Path) -> tuple[Outcome, float]:
    started = time.perf_counter()
    outcome = run_sweep(plan, RunCache(cache), engine)  # type: ignore[arg-type]
    return outcome, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--workers", default="1,2", help="worker counts to measure (1,2)")
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",") if w]
    cal_before = calibrate(3)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        path = tmp / "sweep.yaml"
        path.write_text(sweep_text(args.runs), encoding="utf-8")
        plan = plan_sweep(load_sweep(path), path)
        n = len(plan.tasks)
        local, wall = timed(plan, LocalEngine(jobs=1), tmp / "local")
        reference = to_csv(table_columns(plan), tidy_rows(plan, local))
        own = sum(local.seconds.values())
        rows = [("local runner, 1 process", wall, own)]
        print(f"{rows[-1][0]}: {wall:.1f} s", file=sys.stderr, flush=True)
        same = []
        for w in counts:
            (tmp / f"cluster{w}").mkdir()
            cluster = start_loopback(tmp / f"cluster{w}", w, ROOT)
            try:
                out, wall = timed(plan, DaskEngine(cluster.address), tmp / f"dask{w}")
            finally:
                cluster.stop()
            assert not out.failures, out.failures
            same.append(to_csv(table_columns(plan), tidy_rows(plan, out)) == reference)
            rows.append(
                (
                    f"loopback distributed, {w} worker{'s' * (w > 1)}",
                    wall,
                    sum(out.seconds.values()),
                )
            )
            print(f"{rows[-1][0]}: {wall:.1f} s", file=sys.stderr, flush=True)
    cal_after = calibrate(3)
    print(f"{n} runs ({sum(1 for t in plan.tasks if t.point is not None)} defrag at "
          f"{len(plan.points)} settings points, {sum(1 for t in plan.tasks if t.point is None)} "
          f"without); tables identical to the local runner's: {all(same)}")  # fmt: skip
    print()
    print("| engine | wall s | runs / min | runs' own s | overhead per task s |")
    print("|---|---|---|---|---|")
    for label, wall, own_s in rows:
        workers = 2 if "2 workers" in label else 1
        overhead = (wall * workers - own_s) / n
        print(f"| {label} | {wall:.1f} | {n / wall * 60:.0f} | {own_s:.1f} | {overhead:.3f} |")
    print()
    print(f"calibration {cal_before:.3f} s before, {cal_after:.3f} s after (bench.calibrate)")
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
