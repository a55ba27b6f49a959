"""Timeline protocol on the openb cluster with the default trace's pod shapes: starvation.

    .venv/bin/python -m bench.bench_timeline                  # 4 policies × 3 seeds, load 0.9
    .venv/bin/python -m bench.bench_timeline --policies least-allocated,fgd --seeds 1 --defrag

Prints (and with ``--out`` writes) a markdown table: mean GPU allocation, mean queue, mean
pending time per job size (1-, 2-, 4-, 8-GPU pods) and per QoS class, averaged over seeds.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

from bench import data
from defrag.sim.report import markdown_table, starvation_ratio, summarize_timeline
from defrag.sim.runner import Task, Workload, run_tasks
from defrag.sim.timeline import TimelineConfig, TimelineRun
from defrag.sim.trace import QOS_PRIORITY, load_nodes, load_pods

DATA = data.DEFAULT  # $DEFRAG_DATA_DIR, else ../shared/data
POLICIES = ("reserve-binpack", "least-allocated", "best-fit", "fgd")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trace", default="default")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--hours", type=float, default=36.0)
    ap.add_argument("--warmup", type=float, default=12.0)
    ap.add_argument("--defrag", action="store_true", help="also run each policy with the planner")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    data.require(DATA, data.trace_files([args.trace]))
    nodes = load_nodes(DATA / "openb" / "openb_node_list_gpu_node.csv")
    shapes = load_pods(DATA / "openb" / f"openb_pod_list_{args.trace}.csv").pods
    workload = Workload(args.trace, nodes, shapes)
    config = TimelineConfig(load=args.load, hours=args.hours, warmup_hours=args.warmup)
    policies = [p for p in args.policies.split(",") if p]
    tasks = [
        Task("timeline", p, s, defrag=d, timeline=config)
        for p in policies
        for d in ((False, True) if args.defrag else (False,))
        for s in range(42, 42 + args.seeds)
    ]
    started = time.perf_counter()

    def done(task: Task, run: object) -> None:
        assert isinstance(run, TimelineRun)
        print(
            f"{run.label} seed {run.seed}: {run.arrivals} arrivals, "
            f"alloc {run.mean_allocation:.1f}%, {run.seconds:.0f}s",
            file=sys.stderr,
            flush=True,
        )

    runs = [
        r
        for r in run_tasks(workload, tasks, jobs=args.jobs, on_result=done)
        if isinstance(r, TimelineRun)
    ]
    wall = time.perf_counter() - started
    text = render(runs, args, wall)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


def render(runs: list[TimelineRun], args: argparse.Namespace, wall: float) -> str:
    gpus = ("1", "2", "4", "8")
    prios = sorted(QOS_PRIORITY, key=lambda q: -QOS_PRIORITY[q])
    rows = []
    for s in summarize_timeline(runs):
        rows.append(
            (
                s.policy,
                f"{s.mean_allocation:.1f}",
                f"{s.mean_queue:.0f}",
                *(f"{s.wait_by_gpus.get(g, 0.0):.2f}" for g in gpus),
                starvation_ratio(s),
                *(f"{s.wait_by_priority.get(q, 0.0):.2f}" for q in prios),
                f"{s.migrations:.0f}",
            )
        )
    header = (
        "policy",
        "GPU alloc %",
        "queue",
        *(f"{g}-GPU wait h" for g in gpus),
        "8-GPU / 1-GPU",
        *(f"{q} wait h" for q in prios),
        "migrations",
    )
    secs = sum(r.seconds for r in runs) / max(len(runs), 1)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return (
        f"Timeline protocol, openb GPU nodes, pod shapes of the `{args.trace}` trace, "
        f"offered load {args.load:.0%}, steady-state start, {args.warmup:g} h warm-up + "
        f"{args.hours:g} h measured, {args.seeds} seeds from 42; means over seeds (pods still "
        "waiting at the end count with their wait so far).\n\n"
        f"Command: `.venv/bin/python -m bench.bench_timeline --policies {args.policies} "
        f"--seeds {args.seeds} --load {args.load} --hours {args.hours:g} --warmup {args.warmup:g}"
        f"{' --defrag' if args.defrag else ''}`\n\n"
        + markdown_table(header, rows)
        + f"\n{secs:.0f} s per run on average; wall {wall / 60:.1f} min with {args.jobs} "
        f"processes; peak worker memory {rss:.0f} MiB.\n"
    )


if __name__ == "__main__":
    sys.exit(main())
