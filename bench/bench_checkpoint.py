"""Benchmark: the checkpoint handshake before eviction, on vs off, in the timeline protocol.

defrag in the loop on the openb cluster (the peer table's setting: load 0.9, 12 h warm-up, 36 h
measured, default costs). With the handshake on, a share ``--share`` of the ``training`` and
``batch`` pods answer defrag's checkpoint request before their eviction: they lose no work and
pay the checkpoint's stall and their restart (docs/simulator.md, "The checkpoint handshake"; the
"restart GPU·h" column counts both); off, every eviction loses the work since the pod's last
periodic checkpoint, as before. The same arrivals, seeds and cost draws in both:
the runs of one seed differ by the handshake alone. Seeds 42–44 are the peer table's; 45 is
held out (its figure is reported apart).

    .venv/bin/python -m bench.bench_checkpoint --shares 0.5,1.0 --jobs 2
    .venv/bin/python -m bench.bench_checkpoint --policy least-allocated --shares 0.5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench import data
from bench.bench_packing_limit import load_trace
from defrag.sim.migration import MigrationCost
from defrag.sim.runner import Task, Workload, run_tasks
from defrag.sim.timeline import TimelineConfig, TimelineRun

SEEDS = (42, 43, 44)
HELD_OUT = 45


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data.add_data_option(ap)
    ap.add_argument("--trace", default="default")
    ap.add_argument("--policy", default="reserve-binpack", help="the cluster's scheduler")
    ap.add_argument(
        "--shares", default="0.5,1.0", help="shares of training/batch pods that answer (on)"
    )
    ap.add_argument("--seeds", type=int, default=len(SEEDS), help="from 42; 45 is held out")
    ap.add_argument("--no-held-out", action="store_true")
    ap.add_argument(
        "--only-seeds", default="", help="run just these seeds (comma-separated), e.g. 45"
    )
    ap.add_argument("--hours", type=float, default=36.0)
    ap.add_argument("--warmup", type=float, default=12.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    try:
        shares = [float(s) for s in args.shares.split(",") if s]
        if not all(0 < s <= 1 for s in shares):
            raise ValueError
    except ValueError:
        ap.error(f"--shares: expected shares in (0, 1] separated by commas, got {args.shares!r}")
    if not 1 <= args.seeds <= HELD_OUT - 42:
        ap.error(f"--seeds: 1 to {HELD_OUT - 42} (seed {HELD_OUT} is held out)")
    data.require(args.data, data.trace_files([args.trace]))
    nodes, shapes = load_trace(args.data, args.trace)
    workload = Workload(args.trace, nodes, shapes)
    seeds = [*range(42, 42 + args.seeds), *(() if args.no_held_out else (HELD_OUT,))]
    if args.only_seeds:
        try:
            seeds = [int(s) for s in args.only_seeds.split(",") if s]
        except ValueError:
            ap.error(f"--only-seeds: expected seeds separated by commas, got {args.only_seeds!r}")
    tasks = [
        Task(
            "timeline",
            args.policy,
            seed,
            timeline=TimelineConfig(
                hours=args.hours,
                warmup_hours=args.warmup,
                cost=MigrationCost(handshake_share=share),
            ),
            defragmenter="defrag",
        )
        for share in (0.0, *shares)
        for seed in seeds
    ]
    started = time.perf_counter()
    runs = [r for r in run_tasks(workload, tasks, jobs=args.jobs) if isinstance(r, TimelineRun)]
    wall = time.perf_counter() - started
    by = {
        (share, r.seed): r
        for share, r in zip([s for s in (0.0, *shares) for _ in seeds], runs, strict=True)
    }
    text = render(by, [0.0, *shares], seeds, args, wall)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


def render(
    by: dict[tuple[float, int], TimelineRun],
    shares: list[float],
    seeds: list[int],
    args: argparse.Namespace,
    wall: float,
) -> str:
    tuned = [s for s in seeds if s != HELD_OUT] or seeds
    lines = [
        f"defrag, scheduler {args.policy}, trace {args.trace}: lost work per run, GPU·h "
        f"(seeds {', '.join(map(str, tuned))}; held-out {HELD_OUT} apart)",
        "",
        "| handshake | share of training/batch pods | lost work GPU·h (mean; per seed) | restart "
        "GPU·h | lost + restart GPU·h | goodput % | multi p95 h | evictions "
        "| held-out lost work GPU·h |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for share in shares:
        rows = [by[(share, s)] for s in tuned]
        held = by.get((share, HELD_OUT))
        lost = [r.lost_work_gpu_hours for r in rows]
        lines.append(
            f"| {'on' if share else 'off'} | {share:.0%} | {statistics.mean(lost):.1f}; "
            + " / ".join(f"{x:.1f}" for x in lost)
            + f" | {statistics.mean(r.overhead_gpu_hours for r in rows):.1f}"
            f" | {statistics.mean(r.lost_work_gpu_hours + r.overhead_gpu_hours for r in rows):.1f}"
            f" | {statistics.mean(r.goodput_pct for r in rows):.2f}"
            f" | {statistics.mean(_p95(r) for r in rows):.2f}"
            f" | {statistics.mean(r.evictions for r in rows):.0f}"
            f" | {f'{held.lost_work_gpu_hours:.1f}' if held else '—'} |"
        )
    seconds = [r.seconds for r in by.values()]
    lines += [
        "",
        f"({len(by)} runs, {statistics.mean(seconds):.0f} s each on average, max "
        f"{max(seconds):.0f} s; {wall / 60:.1f} min wall on {args.jobs} processes.)",
    ]
    print(f"done in {wall:.0f} s", file=sys.stderr)
    return "\n".join(lines)


def _p95(run: TimelineRun) -> float:
    """The multi-GPU pods' 95th-percentile wait (the timeline's own, as the peer table's)."""
    return next((c.p95_wait_h for c in run.by_gpus if c.name == "multi"), 0.0)


if __name__ == "__main__":
    raise SystemExit(main())
