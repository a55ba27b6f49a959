"""Speed of one timeline run: the openb GPU nodes, the default trace's shapes, 12 h warm-up +
36 h measured (48 simulated hours), load 0.9, one policy and defragmenter (issue 26, item 4).

    .venv/bin/python -m bench.bench_timeline_speed                          # none, 3 runs
    .venv/bin/python -m bench.bench_timeline_speed --defragmenter defrag --runs 3
    .venv/bin/python -m bench.bench_timeline_speed --profile prof.out --runs 1

Prints min / median / max wall and CPU seconds (the process's own, which the other work on a
shared machine inflates less than the wall time) of ``--runs`` runs (one process, one after the
other), the 1-minute load average before and after, and a digest of each run's whole result
(every reported figure and series but the wall time), so a speed-up can be seen to keep it.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

from bench import data
from defrag.sim.runner import Task, Workload, run_task
from defrag.sim.timeline import TimelineConfig, TimelineRun
from defrag.sim.trace import load_nodes, load_pods


def digest(run: TimelineRun) -> str:
    """A short hash of everything a run reports but its wall time."""
    out = run.to_dict(series=True)
    out.pop("seconds")
    return hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", type=Path, default=data.DEFAULT)
    ap.add_argument("--trace", default="default")
    ap.add_argument("--policy", default="least-allocated")
    ap.add_argument("--defragmenter", default="none")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--hours", type=float, default=36.0)
    ap.add_argument("--warmup", type=float, default=12.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", type=Path, help="write a cProfile of the runs here")
    args = ap.parse_args(argv)
    data.require(args.data, data.trace_files([args.trace]))
    nodes = load_nodes(args.data / data.NODES)
    shapes = load_pods(args.data / data.pods(args.trace)).pods
    workload = Workload(args.trace, nodes, shapes)
    config = TimelineConfig(hours=args.hours, warmup_hours=args.warmup)
    task = Task("timeline", args.policy, args.seed, timeline=config, defragmenter=args.defragmenter)
    load_before = os.getloadavg()[0]
    profiler = cProfile.Profile() if args.profile else None
    walls: list[float] = []
    cpus: list[float] = []
    digests: set[str] = set()
    for _ in range(args.runs):
        started, cpu = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        run = run_task(workload, task)
        if profiler is not None:
            profiler.disable()
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
        assert isinstance(run, TimelineRun)
        digests.add(digest(run))
    load_after = os.getloadavg()[0]
    print(
        f"{task.label} seed {args.seed}, {args.warmup:g} h + {args.hours:g} h: "
        f"wall s min {min(walls):.1f} / median {statistics.median(walls):.1f} / "
        f"max {max(walls):.1f}; CPU s min {min(cpus):.1f} / median {statistics.median(cpus):.1f}"
        f" / max {max(cpus):.1f} over {len(walls)} runs; load average {load_before:.2f} → "
        f"{load_after:.2f}; result digest {', '.join(sorted(digests))}"
    )
    if profiler is not None:
        profiler.dump_stats(args.profile)
        pstats.Stats(str(args.profile)).sort_stats("cumulative").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
