"""``defrag demo``: the daemon on a simulated fragmented cluster, told as a story.

Before (the starving job, the findings, the fragmentation) → the plan (each step with its reason
and cost, and what may not move and why) → the cycles (waiting for the window, then moving) →
after (the starving job running, and the figures that moved). ``-o json`` gives every cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from defrag.cli.app import (
    Output,
    OutputOpt,
    UserError,
    app,
    print_data,
    print_line,
    print_table,
    writable_path,
)
from defrag.cli.run import _build, _settings
from defrag.detect.findings import Finding

if TYPE_CHECKING:  # heavy (numpy, scipy, clients): imported when a command runs
    from defrag.daemon.cycle import CycleResult
    from defrag.model.cluster import Cluster
    from defrag.plan.model import Plan
    from defrag.scoring.profile import ProfileConfig

TARGET = "research/train-llm-0"
"""The demo cluster's starving job (see :func:`defrag.adapters.simcluster.fragmented_cluster`)."""

_BLOCKED_WHY = {
    "pdb": "its PodDisruptionBudget allows no disruption now",
    "opt-out": "its owner opted it out of moves",
    "bare-pod": "no controller would recreate it",
}


@app.command()
def demo(
    cycles: Annotated[int, typer.Option(help="Cycles to run (5 simulated minutes apart).")] = 6,
    plot: Annotated[Path, typer.Option(help="Where to write the PNG plot.")] = Path(
        "defrag-demo.png"
    ),
    output: OutputOpt = Output.table,
) -> None:
    """The daemon on a simulated fragmented cluster: findings, a plan, moves in a window."""
    from defrag.daemon.service import configure_logging

    if cycles < 1:
        raise UserError("--cycles must be at least 1")
    writable_path(plot, "--plot", ".png")
    settings = _settings(
        None,
        {
            "cluster.kind": "sim",
            "execution.dry_run": False,
            "daemon.cycle_interval_s": 300,
            "planner.min_pod_age_s": 600,
            "windows.schedule": [{"cron": "0 2 * * *", "length_s": 3600}],
            "windows.max_evictions_per_window": 12,
            "windows.max_evictions_per_node": 8,
            "windows.max_evictions_per_namespace": 12,
            "execution.replacement_timeout_s": 300,
            "execution.poll_interval_s": 10,
            "planner.goal": "auto",
            "sim.speedup": 1.0,
        },
    )
    configure_logging("text", "WARNING")
    wiring = _build(settings, once=False)
    daemon, sim = wiring.daemon, wiring.sim
    sim.clock.speedup = 0.0  # the demo moves simulated time itself, cycle by cycle
    first = sim.snapshot()
    results = []
    start = sim.clock.now()
    for i in range(cycles):
        sim.clock.advance_to(start + timedelta(seconds=i * settings.daemon.cycle_interval_s))
        results.append(daemon.run_once())
    final = sim.snapshot()
    train = final.pods.get(TARGET)
    try:
        write_plot(results, plot)
    except OSError as exc:
        raise UserError(f"--plot {plot}: {exc.strerror or exc}") from None
    moved = figures(results, first, final, settings.profile_config())
    if output is not Output.table:
        print_data(
            {
                "cycles": [r.to_dict() for r in results],
                "figures": moved,
                "plot": str(plot),
                "train_llm_node": train.node if train else None,
            },
            output,
        )
        return
    _tell(results, first, final, moved, plot)


# --- the story ---------------------------------------------------------------------------------


def _tell(
    results: Sequence[CycleResult],
    first: Cluster,
    final: Cluster,
    moved: list[dict[str, Any]],
    plot: Path,
) -> None:
    target = first.pods[TARGET]
    waited = _age(results[0].started - (target.pending_since or results[0].started))
    gpu_nodes = [n for n in first.nodes if n.num_gpu]
    print_line(
        f"[bold]defrag demo[/]: {len(gpu_nodes)} simulated {gpu_nodes[0].num_gpu}-GPU nodes, "
        f"{results[0].before.get('free_gpus')} GPUs free but scattered; {TARGET} "
        f"({target.num_gpu} GPUs) has waited {waited}. Cycles every 5m; the execution window "
        "opens daily at 02:00 UTC."
    )
    print_line("")
    print_line(f"[bold]Before[/] ({results[0].started:%H:%M})")
    _findings_table(results[0].findings)
    plan = next((r.plan for r in results if r.plan is not None and r.plan.steps), None)
    print_line("")
    if plan is None:
        print_line("[bold]Plan[/]: nothing to move")
    else:
        _plan_tables(plan)
    print_line("")
    print_line("[bold]Cycles[/]")
    for r in results:
        print_line(f"  {r.started:%H:%M}  {_cycle_line(r)}")
    print_line("")
    print_line(f"[bold]After[/] ({results[-1].started:%H:%M})")
    train = final.pods.get(TARGET)
    state = f"running on {train.node}" if train and train.node else "still pending"
    print_line(f"  {TARGET}: {state}")
    table = Table(title="What moved", show_header=True)
    for col in ("figure", "before", "after"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for row in moved:
        table.add_row(row["figure"], _num(row["before"]), _num(row["after"]))
    print_table(table)
    print_line(
        "  The freed node went to the waiting job, as planned: so the largest job that could "
        f"still be placed stays at {results[-1].before.get('largest_placeable_job')} GPUs."
    )
    print_line(f"plot: {plot}")
    print_line("")
    print_line(
        "On a real cluster: `defrag run --once --kubeconfig ~/.kube/config` (dry run: plan and "
        "report only), then add --prometheus URL, DEFRAG_ALERTS__URLS=http://am:9093 and "
        "windows in a settings file, then --no-dry-run. See docs/daemon.md and deploy/."
    )


def _findings_table(findings: Sequence[Finding]) -> None:
    """Every finding that is not a node-level fragmentation line, then those as one count."""
    table = Table(title="Findings", show_header=True)
    for col in ("kind", "subject", "summary"):
        table.add_column(col, overflow="fold")
    nodes = [f for f in findings if f.kind == "fragmentation" and f.subject.startswith("node/")]
    for f in sorted(findings, key=lambda f: (f.kind != "starvation", f.kind, f.subject)):
        if f not in nodes:
            table.add_row(f.kind, f.subject, f.summary)
    if nodes:
        names = ", ".join(f.subject.removeprefix("node/") for f in nodes)
        table.add_row("fragmentation", f"{len(nodes)} nodes", f"free GPUs stranded on {names}")
    print_table(table)


def _plan_tables(plan: Plan) -> None:
    targets = ", ".join(plan.targets) or "fewer stranded GPUs"
    print_line(
        f"[bold]Plan[/] {plan.id} for {targets}: {plan.migrations} migration(s), "
        f"{plan.preemptions} preemption(s), total cost {plan.cost:.1f}"
    )
    steps = Table(title="Steps", show_header=True)
    for col in ("#", "kind", "pod", "from", "to", "GPUs", "cost", "reason"):
        steps.add_column(col, justify="right" if col in ("#", "GPUs", "cost") else "left")
    for i, s in enumerate(plan.steps, start=1):
        steps.add_row(
            str(i), s.kind, s.pod, s.source, s.target or "(waits)",
            f"{s.gpus_held:g}", f"{s.cost:.1f}", s.reason,
        )  # fmt: skip
    print_table(steps, drop=("cost", "#"), whole=("pod", "from", "to"))
    if plan.blocked:
        blocked = Table(title="Not moved (the plan works around them)", show_header=True)
        for col in ("pod", "why", "detail"):
            blocked.add_column(col, overflow="fold")
        for b in plan.blocked:
            why = _BLOCKED_WHY.get(b.constraint, b.constraint)
            blocked.add_row(b.pod, why, "" if b.detail == why else b.detail)
        print_table(blocked, whole=("pod",))


def _cycle_line(r: CycleResult) -> str:
    if r.executed is not None and r.executed.counts:
        counts = ", ".join(f"{n} {what}" for what, n in r.executed.counts.items())
        placed = list(r.verification.get("targets_placed", ())) if r.verification else []
        tail = f"; {', '.join(placed)} scheduled" if placed else ""
        return f"window open: {counts}{tail}"
    steps = len(r.plan.steps) if r.plan else 0
    if not r.window.open and steps:
        return f"{r.window.reason}: {steps} step(s) planned, waiting for the window"
    return "nothing to do" if not steps else f"{steps} step(s) planned, not executed"


def figures(
    results: Sequence[CycleResult], first: Cluster, final: Cluster, profile: ProfileConfig
) -> list[dict[str, Any]]:
    """The figures of the first cycle's start and of the end, as observed (each snapshot
    measured with its own profile, as the cycle measures it)."""
    from defrag.scoring.fragmentation import fragmentation_report

    before = fragmentation_report(first, profile.for_cluster(first).mix)
    after = fragmentation_report(final, profile.for_cluster(final).mix)

    def count(result: CycleResult, kind: str) -> int:
        return sum(1 for f in result.findings if f.kind == kind)

    def pending(cluster: Cluster) -> int:
        return sum(1 for p in cluster.pending_pods() if p.num_gpu >= 8)

    return [
        {"figure": "starving jobs", "before": count(results[0], "starvation"),
         "after": count(results[-1], "starvation")},
        {"figure": "pending 8-GPU pods", "before": pending(first), "after": pending(final)},
        {"figure": "GPU allocation %", "before": round(before.allocation_pct, 1),
         "after": round(after.allocation_pct, 1)},
        {"figure": "free GPUs stranded for 8-GPU jobs", "before": before.stranded.get(8, 0),
         "after": after.stranded.get(8, 0)},
        {"figure": "fragmentation findings", "before": count(results[0], "fragmentation"),
         "after": count(results[-1], "fragmentation")},
    ]  # fmt: skip


def _num(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _age(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


# --- the plot ----------------------------------------------------------------------------------


def write_plot(results: Sequence[CycleResult], path: Path) -> None:
    """Two panels over simulated time: the figures that move (GPUs stranded for 8-GPU jobs,
    starving jobs) and the evictions; the window shaded; the legend outside the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(len(results)))
    labels = [r.started.strftime("%H:%M") for r in results]
    stranded = [dict(r.before.get("stranded", {})).get("8", 0) for r in results]
    starving = [sum(1 for f in r.findings if f.kind == "starvation") for r in results]
    evicted = [len(r.executed.evicted) if r.executed else 0 for r in results]
    open_at = [x for x, r in zip(xs, results, strict=True) if r.window.open]

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    top.plot(xs, stranded, marker="o", color="tab:blue", label="free GPUs stranded for 8-GPU jobs")
    top.set_ylabel("GPUs (at cycle start)")
    top.set_ylim(bottom=0)
    right = top.twinx()
    right.step(xs, starving, where="mid", color="tab:red", label="starving jobs (right axis)")
    right.set_ylim(-0.05, max(2, max(starving) + 1))
    right.set_yticks(range(int(right.get_ylim()[1]) + 1))
    right.set_ylabel("starving jobs")
    for ax in (top, bottom):
        if open_at:
            ax.axvspan(open_at[0] - 0.5, open_at[-1] + 0.5, color="tab:green", alpha=0.08)
    fig.suptitle("defrag demo: 12 fragmented 8-GPU nodes; the window (shaded) opens at 02:00")
    lines = top.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    # Above the axes, between the title and the plot: it covers no line.
    fig.legend(
        lines[0] + more[0],
        lines[1] + more[1],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.94),
        ncol=2,
        frameon=False,
        fontsize="small",
    )
    top.grid(alpha=0.3)
    bottom.bar(xs, evicted, color="tab:orange")
    bottom.set_ylabel("evictions")
    bottom.set_xlabel("simulated time (UTC)")
    bottom.set_xticks(xs, labels)
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.9))
    fig.savefig(path, dpi=100)
    plt.close(fig)
