"""Defragmenters side by side in the timeline protocol, with every eviction priced (issue 17).

Same arrivals, seeds and eviction costs for every row: no defragmenter, defrag (the daemon,
scheduler unchanged), defrag with its extender's score installed, defrag with a
checkpoint-blind cost, descheduler HighNodeUtilization (scheduler switched to MostAllocated),
descheduler LowNodeUtilization (the control), KAI consolidation (KAI binpack); each peer in
its own documented configuration (defrag.sim.peers), and HighNodeUtilization's sensitivity rows
on request (``--defragmenters descheduler-hnu-gpu50,…``).

The checkpoint handshake (defrag.sim.migration): in the defrag rows a share
``--handshake-share`` (default 0.5, the stated model's) of the training and batch pods answer
defrag's checkpoint request before an eviction — no work lost, the checkpoint's stall and the
restart paid; 0 turns it off. The peers never ask: their rows are the same either way.
``--compare-handshake`` adds each defrag row without it, named ``<row> (no handshake)``, on the
same arrivals and draws; the table's "handshake" column says which rows had it.

    .venv/bin/python -m bench.bench_peers                       # 90% load, 3 seeds, 2 policies
    .venv/bin/python -m bench.bench_peers --checkpoint-scale 2  # sensitivity
    .venv/bin/python -m bench.bench_peers --compare-handshake   # defrag rows with and without
    .venv/bin/python -m bench.bench_peers --scale 10 --hours 2 --warmup 1 \\
        --policies least-allocated --defragmenters defrag --seeds 1      # the 10x cluster

Prints (``--out``: writes) a markdown table; ``--plot`` writes the multi-GPU pending-time
CDFs (one panel per policy, one line per defragmenter, seeds pooled); ``--json`` every run.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench import data
from bench.bench_packing_limit import load_trace
from defrag.model.resources import Node
from defrag.sim.defragmenters import DEFRAGMENTERS, EXTENDER_POLICY, DaemonOptions
from defrag.sim.migration import CHECKPOINT_STALL_HOURS, HANDSHAKE_SHARE, MigrationCost
from defrag.sim.report import markdown_table
from defrag.sim.runner import Task, Workload, run_tasks
from defrag.sim.timeline import TimelineConfig, TimelineRun

POLICIES = ("least-allocated", "reserve-binpack")
ROWS = (
    "none",
    "descheduler-hnu",
    "kai-consolidation",
    "descheduler-lnu",
    "defrag",
    "defrag-proposed",
    "defrag-blind",
    "defrag-extender",
)
"""The default rows: each peer in its own documented configuration (docs/benchmarks.md, "Whose
configuration"); the sensitivity rows are :data:`SENSITIVITY`."""
SENSITIVITY = ("descheduler-hnu-readme", "descheduler-hnu-gpu50", "descheduler-hnu-lenient")
"""HighNodeUtilization with each knob changed from its row (``--defragmenters`` picks them)."""
FIXED_SCHEDULER = (
    "descheduler-hnu",
    *SENSITIVITY,
    "kai-consolidation",
    "defrag-blind",
    "defrag-extender",
)
"""Defragmenters that install their own scheduler score: the run does not depend on the
policy the cluster had, so it is made once and shown under each policy."""
NO_HANDSHAKE = " (no handshake)"
"""The suffix of a defrag row run without the checkpoint handshake (``--compare-handshake``)."""


def asks_for_checkpoints(defragmenter: str) -> bool:
    """The rows whose evictions ask for a checkpoint first: the daemon's (``defrag*``)."""
    return defragmenter == "defrag" or defragmenter.startswith("defrag-")


def scaled_nodes(nodes: tuple[Node, ...], factor: int) -> tuple[Node, ...]:
    """``factor`` copies of every node (names suffixed ``-k``): the 10x cluster."""
    if factor == 1:
        return nodes
    return tuple(replace(n, name=f"{n.name}-{k}") for k in range(factor) for n in nodes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data.add_data_option(ap)
    ap.add_argument("--trace", default="default")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--defragmenters", default=",".join(ROWS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=42, help="42; 45 is the held-out seed")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--hours", type=float, default=36.0)
    ap.add_argument("--warmup", type=float, default=12.0)
    ap.add_argument("--checkpoint-scale", type=float, default=1.0)
    ap.add_argument(
        "--handshake-share", type=float, default=HANDSHAKE_SHARE,
        help=f"share of training/batch pods that answer defrag's checkpoint request "
        f"(default {HANDSHAKE_SHARE:g}; 0: no handshake); the peers never ask",
    )  # fmt: skip
    ap.add_argument(
        "--compare-handshake", action="store_true",
        help="also run each defrag row without the handshake, as '<row> (no handshake)'",
    )  # fmt: skip
    ap.add_argument("--window-every", type=float, default=6.0, help="hours between windows")
    ap.add_argument("--scale", type=int, default=1, help="cluster copies (10: ~12,000 nodes)")
    ap.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help="a daemon setting for every defrag row (dotted key, as `defrag simulate --set`), "
        "e.g. windows.max_evictions_per_window=256, planner.make_room_worth=4",
    )  # fmt: skip
    ap.add_argument(
        "--settings", type=Path,
        help="the daemon's settings file for the defrag rows (default: the simulator's)",
    )  # fmt: skip
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot-from", type=Path, help="redraw --plot from a --json file; no runs")
    args = ap.parse_args(argv)
    if args.plot_from:
        if not args.plot:
            ap.error("--plot-from needs --plot")
        replot(args.plot_from, args.plot)
        return 0
    if not 0 <= args.handshake_share <= 1:
        ap.error(f"--handshake-share: expected a share in [0, 1], got {args.handshake_share:g}")
    if args.compare_handshake and not args.handshake_share:
        ap.error("--compare-handshake: the handshake is off (--handshake-share 0)")
    data.require(args.data, data.trace_files([args.trace]))
    nodes, shapes = load_trace(args.data, args.trace)
    nodes = scaled_nodes(nodes, args.scale)
    workload = Workload(args.trace, nodes, shapes)
    cost = MigrationCost().scaled(args.checkpoint_scale)
    # One config for every row: the runner turns the handshake off where no one asks (peers).
    config = TimelineConfig(
        load=args.load, hours=args.hours, warmup_hours=args.warmup,
        cost=replace(cost, handshake_share=args.handshake_share),
        window_every_h=args.window_every,
    )  # fmt: skip
    without = replace(config, cost=replace(cost, handshake_share=0.0))
    policies = [p for p in args.policies.split(",") if p]
    names = [d for d in args.defragmenters.split(",") if d]
    unknown = [d for d in names if d not in DEFRAGMENTERS]
    if unknown:
        ap.error(
            f"--defragmenters: unknown {', '.join(unknown)}; known: {', '.join(DEFRAGMENTERS)}"
        )
    daemon = daemon_options(ap, args.settings, args.sets, args.window_every)
    variants: dict[str, list[tuple[str, TimelineConfig]]] = {d: [(d, config)] for d in names}
    for d in names:  # (the name shown, the config) of each row's runs
        if args.compare_handshake and asks_for_checkpoints(d):
            variants[d].append((d + NO_HANDSHAKE, without))
    shown = [
        (row, Task("timeline", p, s, timeline=c, defragmenter=d, daemon=daemon))
        for i, p in enumerate(policies)
        for d in names
        if not (p == EXTENDER_POLICY and d == "defrag-extender")  # the same run as "defrag"
        if not (i > 0 and d in FIXED_SCHEDULER)  # the same runs as under the first policy
        for row, c in variants[d]
        for s in range(args.first_seed, args.first_seed + args.seeds)
    ]
    tasks = [task for _, task in shown]
    started = time.perf_counter()

    def done(task: Task, run: object) -> None:
        assert isinstance(run, TimelineRun)
        print(
            f"{run.label} seed {run.seed}: alloc {run.mean_allocation:.1f}%, "
            f"goodput {run.goodput_pct:.1f}%, {run.evictions} evictions, {run.seconds:.0f}s",
            file=sys.stderr,
            flush=True,
        )

    runs = [
        r if r.defragmenter == row else replace(r, defragmenter=row)
        for (row, _), r in zip(
            shown, run_tasks(workload, tasks, jobs=args.jobs, on_result=done), strict=True
        )
        if isinstance(r, TimelineRun)
    ]
    args.run_seconds = [r.seconds for r in runs]  # the runs made, not their copies
    runs += [
        replace(r, policy=p)
        for p in policies[1:]
        for r in list(runs)
        if r.policy == policies[0] and r.defragmenter.removesuffix(NO_HANDSHAKE) in FIXED_SCHEDULER
    ]
    wall = time.perf_counter() - started
    text = render(runs, args, wall, len(nodes))
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    if args.json:
        rows = [{**r.to_dict(), "multi_waits": [round(w, 4) for w in r.multi_waits]} for r in runs]
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    if args.plot:
        plot_cdfs(runs, args.plot, policies, list(dict.fromkeys(r.defragmenter for r in runs)))
    return 0


def daemon_options(
    ap: argparse.ArgumentParser, settings: Path | None, sets: list[str], window_every_h: float
) -> DaemonOptions:
    """The defrag rows' settings (``--settings``, ``--set KEY=VALUE``), checked before any run:
    a wrong key or value is one error naming it."""
    from defrag.cli.app import UserError
    from defrag.cli.simulate import parse_sets
    from defrag.rules import RulesError
    from defrag.settings import SettingsError
    from defrag.sim.daemon_driver import daemon_setup

    try:
        overrides = parse_sets(sets)
        daemon_setup(settings, overrides, window_every_h=window_every_h)
    except (UserError, SettingsError, RulesError, ValueError) as exc:
        ap.error(str(exc))
    return DaemonOptions(str(settings) if settings else None, overrides, window_every_h)


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def _cls(run: TimelineRun, name: str, field: str) -> float:
    c = run.wait(name)
    return float(getattr(c, field)) if c is not None else 0.0


def handshake_cell(run: TimelineRun) -> str:
    """The share of training/batch pods that answered in ``run`` (its costs say), "off" for a
    defrag row without it, "—" for a row that never asks (no defragmenter, a peer)."""
    share = run.cost.get("checkpoint_handshake_share")
    if isinstance(share, int | float) and share:
        return f"{share:.0%}"
    return "off" if asks_for_checkpoints(run.defragmenter.removesuffix(NO_HANDSHAKE)) else "—"


def render(runs: list[TimelineRun], args: argparse.Namespace, wall: float, n_nodes: int) -> str:
    rows = []
    for policy in dict.fromkeys(r.policy for r in runs):
        for name in dict.fromkeys(r.defragmenter for r in runs):
            mine = [r for r in runs if r.policy == policy and r.defragmenter == name]
            if not mine:
                continue
            rows.append(
                (
                    policy,
                    name,
                    mine[0].scheduler,
                    handshake_cell(mine[0]),
                    f"{_mean([_cls(r, 'multi', 'mean_wait_h') for r in mine]):.2f}",
                    f"{_mean([_cls(r, 'multi', 'p95_wait_h') for r in mine]):.2f}",
                    f"{_mean([_cls(r, '4', 'p95_wait_h') for r in mine]):.2f}",
                    f"{_mean([_cls(r, '1', 'mean_wait_h') for r in mine]):.2f}",
                    f"{_mean([_cls(r, '1', 'p95_wait_h') for r in mine]):.2f}",
                    f"{_mean([_cls(r, 'share', 'p95_wait_h') for r in mine]):.2f}",
                    f"{_mean([_cls(r, 'BE', 'mean_wait_h') for r in mine]):.2f}",
                    f"{_mean([r.gpu_wait_hours for r in mine]):,.0f}",
                    f"{_mean([r.mean_allocation for r in mine]):.1f}",
                    f"{_mean([r.goodput_pct for r in mine]):.1f}",
                    f"{_mean([r.lost_gpu_hours for r in mine]):.0f}",
                    f"{_mean([float(r.migrations) for r in mine]):.0f}",
                    f"{_mean([float(r.evictions) for r in mine]):.0f}",
                    str(max(r.max_evictions for r in mine)),
                )
            )
    header = (
        "policy",
        "defragmenter",
        "scheduler",
        "handshake",
        "multi-GPU wait h",
        "multi p95 h",
        "4-GPU p95 h",
        "1-GPU wait h",
        "1-GPU p95 h",
        "share p95 h",
        "BE wait h",
        "GPU-weighted wait GPU·h",
        "alloc %",
        "goodput %",
        "lost GPU·h",
        "migrations",
        "evictions",
        "max/pod",
    )
    loads = sorted({(r.seed, round(r.offered_load_pct, 1)) for r in runs})
    first = getattr(args, "first_seed", 42)
    secs = list(getattr(args, "run_seconds", [r.seconds for r in runs]))
    sim_h = args.hours + args.warmup
    rss = max(
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    )
    cmd = " ".join(sys.argv[1:]) if sys.argv[0].endswith("bench_peers.py") else ""
    return (
        f"Timeline, openb GPU nodes ×{args.scale} ({n_nodes:,} nodes), `{args.trace}` pod shapes, "
        f"offered load {args.load:.0%} (realised per seed: "
        + ", ".join(f"{s}: {x}%" for s, x in loads)
        + f"), {args.warmup:g} h warm-up + {args.hours:g} h measured, seeds {first}–"
        f"{first + args.seeds - 1}, checkpoint intervals ×{args.checkpoint_scale:g}, "
        + handshake_caption(getattr(args, "handshake_share", 0.0))
        + f", windows every {args.window_every:g} h"
        + (f", settings {args.settings}" if getattr(args, "settings", None) else "")
        + (f", --set {' '.join(args.sets)}" if getattr(args, "sets", []) else "")
        + "; means over seeds "
        "(p95: mean of the per-seed p95).\n\n"
        f"Command: `.venv/bin/python -m bench.bench_peers {cmd}`\n\n"
        + markdown_table(header, rows)
        + f"\n{_mean(secs):.0f} s per run on average (max {max(secs, default=0):.0f} s; "
        f"{_mean(secs) / sim_h:.2f} s per simulated hour); wall {wall / 60:.1f} min with "
        f"{args.jobs} processes; peak process memory {rss / 1024:.0f} MiB.\n"
    )


def handshake_caption(share: float) -> str:
    """The checkpoint handshake the defrag rows ran with, for the table's caption."""
    if not share:
        return "no checkpoint handshake"
    stalls = "/".join(f"{h * 60:g}" for h in CHECKPOINT_STALL_HOURS.values())
    kinds = "/".join(CHECKPOINT_STALL_HOURS)
    return (
        f"checkpoint handshake in the defrag rows ({share:.0%} of {kinds} pods answer: no work "
        f"lost, a {stalls}-min stall + the restart; the peers never ask)"
    )


def replot(source: Path, path: Path) -> None:
    """The CDF figure from the JSON rows of an earlier run."""
    rows = json.loads(source.read_text(encoding="utf-8"))
    waits: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        waits.setdefault((row["policy"], row["defragmenter"]), []).extend(row["multi_waits"])
    policies = list(dict.fromkeys(p for p, _ in waits))
    names = list(dict.fromkeys(d for _, d in waits))
    _draw(waits, path, policies, names)


def plot_cdfs(runs: list[TimelineRun], path: Path, policies: list[str], names: list[str]) -> None:
    waits: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        waits.setdefault((r.policy, r.defragmenter), []).extend(r.multi_waits)
    _draw(waits, path, policies, names)


def _draw(
    pooled: dict[tuple[str, str], list[float]], path: Path, policies: list[str], names: list[str]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = max([max(w) for w in pooled.values() if w] + [1.0]) * 1.3
    fig, axes = plt.subplots(1, len(policies), figsize=(6.5 * len(policies), 4.5), squeeze=False)
    for ax, policy in zip(axes[0], policies, strict=True):
        for name in names:
            waits = np.sort(np.asarray(pooled.get((policy, name), []), dtype=float))
            if len(waits) == 0:
                continue
            y = np.arange(1, len(waits) + 1) / len(waits)
            ax.step(np.concatenate([[0.0], waits]), np.concatenate([[0.0], y]), where="post",
                    label=name)  # fmt: skip
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_xlim(-0.01, top)  # a pod that never waited shows as the line at 0
        ax.set_ylim(0, 1.01)
        ax.set_xlabel("pending time of multi-GPU pods, h (linear below 0.1 h, log above)")
        ax.set_ylabel("fraction of pods")
        ax.set_title(f"cluster scheduler: {policy}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
