"""``defrag simulate``: replay a workload under several policies, with and without defrag."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from defrag.cli.app import (
    Output,
    OutputOpt,
    UserError,
    app,
    err_console,
    parse_duration,
    print_data,
    print_line,
    print_table,
    writable_path,
)
from defrag.cli.names import DEFAULT_POLICY, DEFRAGMENTERS

if TYPE_CHECKING:  # heavy (numpy, scipy, clients): imported when a command runs
    from defrag.sim.defragmenters import DaemonOptions
    from defrag.sim.fill import FillRun
    from defrag.sim.runner import Run, Task, Workload
    from defrag.sim.timeline import TimelineRun

DEFAULT_POLICIES = (DEFAULT_POLICY, "least-allocated", "best-fit", "fgd")
FIRST_SEED = 42


class Protocol(StrEnum):
    fill = "fill"
    timeline = "timeline"


def parse_seeds(text: str) -> list[int]:
    """``N`` → N seeds from 42 (the paper's first); ``42,43`` (any comma) → those seeds."""
    text = text.strip()
    try:
        if "," in text:
            seeds = [int(s) for s in text.split(",") if s.strip()]
        else:
            count = int(text)
            if count < 1:
                raise UserError(f"--seeds: a count must be >= 1, got {count}")
            seeds = list(range(FIRST_SEED, FIRST_SEED + count))
    except ValueError:
        raise UserError(
            f"--seeds: expected a count or a comma-separated list, got {text!r}"
        ) from None
    if not seeds:
        raise UserError("--seeds: no seed given")
    return list(dict.fromkeys(seeds))


def load_workload(trace: Path | None, nodes: Path | None, pods: int, scale: float) -> Workload:
    from defrag.sim.runner import Workload
    from defrag.sim.synthetic import synthetic_nodes, synthetic_pods
    from defrag.sim.trace import TraceError, load_nodes, load_pods

    try:
        if trace is not None and nodes is None:
            raise UserError("--trace needs --nodes (the node list the pods run on)")
        for flag, path in (("--trace", trace), ("--nodes", nodes)):
            if path is not None and not path.is_file():
                raise UserError(f"{flag} {path}: no such file")
        node_list = load_nodes(nodes) if nodes is not None else synthetic_nodes(scale)
        if trace is not None:
            return Workload(trace.stem, node_list, load_pods(trace).pods)
        name = "synthetic" if nodes is None else f"synthetic pods on {nodes.stem}"
        return Workload(name, node_list, synthetic_pods(pods, seed=0))
    except TraceError as exc:
        raise UserError(str(exc)) from None
    except ValueError as exc:
        raise UserError(f"synthetic workload: {exc}") from None


@contextmanager
def _progress(
    enabled: bool, total_runs: int, jobs: int
) -> Iterator[tuple[Progress | None, TaskID | None]]:
    if not enabled:
        yield None, None
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )
    with bar:
        overall = bar.add_task(f"runs ({jobs} process{'es' if jobs > 1 else ''})", total=total_runs)
        yield bar, overall


@app.command()
def simulate(
    trace: Annotated[
        Path | None, typer.Option(help="openb pod list CSV (default: synthetic).")
    ] = None,
    nodes: Annotated[
        Path | None, typer.Option(help="openb node list CSV (default: built-in).")
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", help=f"Repeatable; default: {', '.join(DEFAULT_POLICIES)}."),
    ] = None,
    seeds: Annotated[str, typer.Option(help="N seeds from 42, or a list: 42,43.")] = "1",
    protocol: Annotated[
        Protocol, typer.Option(help="fill (arrival-only) or timeline.")
    ] = Protocol.fill,
    load: Annotated[float, typer.Option(help="timeline: offered GPU load (0.9 = 90%).")] = 0.9,
    duration: Annotated[
        str, typer.Option(help="timeline: measured time (36h).", metavar="DURATION")
    ] = "36h",
    warmup: Annotated[
        str, typer.Option(help="timeline: warm-up time, not measured (12h).", metavar="DURATION")
    ] = "12h",
    run_time_scale: Annotated[
        float, typer.Option(help="timeline: multiply the median run times (2 h / 12 h multi-GPU).")
    ] = 1.0,
    window_every: Annotated[
        str, typer.Option(help="timeline: defrag window period (6h).", metavar="DURATION")
    ] = "6h",
    defrag: Annotated[
        bool, typer.Option("--defrag", help="Also run each policy with the planner in the loop.")
    ] = False,
    defragmenter: Annotated[
        list[str] | None,
        typer.Option(
            "--defragmenter",
            help=f"Timeline, repeatable: {', '.join(DEFRAGMENTERS)} (default: none).",
        ),
    ] = None,
    settings: Annotated[
        Path | None,
        typer.Option(
            "--settings",
            help="The daemon's settings file (the one the Deployment mounts, e.g. "
            "deploy/base/settings.yaml) for the defrag rows (default: the simulator's).",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="A daemon setting for the defrag rows, KEY=VALUE with a dotted key "
            "(planner.make_room_worth=2); repeatable, wins over --settings.",
        ),
    ] = None,
    checkpoint_scale: Annotated[
        float, typer.Option(help="timeline: multiply every checkpoint interval.")
    ] = 1.0,
    overhead_scale: Annotated[
        float, typer.Option(help="timeline: multiply every restart overhead.")
    ] = 1.0,
    free_migrations: Annotated[
        bool, typer.Option("--free-migrations", help="timeline: evictions lose nothing.")
    ] = False,
    output: OutputOpt = Output.table,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG plot here.")] = None,
    jobs: Annotated[int, typer.Option(help="Parallel processes.")] = 1,
    pods: Annotated[int, typer.Option(help="Synthetic workload: pods in the pool.", min=1)] = 2000,
    scale: Annotated[float, typer.Option(help="Synthetic cluster: × 150 nodes.")] = 1.0,
    curves: Annotated[bool, typer.Option(help="JSON: include each run's curve / series.")] = False,
    sweep: Annotated[
        Path | None,
        typer.Option(help="A sweep file: settings points over traces, seeds and rows, on Dask."),
    ] = None,
    dask: Annotated[
        str | None,
        typer.Option(help="--sweep: a distributed scheduler (tcp://host:8786).", metavar="URL"),
    ] = None,
    best: Annotated[
        bool, typer.Option("--best", help="--sweep: write the winning settings file.")
    ] = False,
) -> None:
    """Replay a workload under several policies; a table, a JSON record and a PNG plot."""
    if sweep is not None or dask is not None or best:
        from defrag.cli.sweep import sweep_command

        if sweep is None:
            raise UserError("--dask/--best go with --sweep FILE")
        sweep_command(sweep, dask, best)
        return
    from defrag.scoring.policies import POLICY_NAMES
    from defrag.sim.defragmenters import DEFRAGMENTERS
    from defrag.sim.migration import MigrationCost
    from defrag.sim.plot import plot_fill, plot_timeline
    from defrag.sim.runner import Task, run_tasks
    from defrag.sim.timeline import DurationModel, TimelineConfig

    policies = list(dict.fromkeys(policy or DEFAULT_POLICIES))
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown:
        raise UserError(f"unknown policy {', '.join(unknown)}; known: {', '.join(POLICY_NAMES)}")
    seed_list = parse_seeds(seeds)
    if jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {jobs}")
    if plot is not None:
        writable_path(plot, "--plot", ".png")
    spans = {"duration": duration, "warmup": warmup, "window-every": window_every}
    hours = {k: parse_duration(v, f"--{k}", bare_was="h") / 3600 for k, v in spans.items()}
    names = list(dict.fromkeys(defragmenter or ["none"]))
    if defrag:
        names = list(dict.fromkeys(["none", *names, "defrag"]))
    bad = [d for d in names if d not in DEFRAGMENTERS]
    if bad:
        raise UserError(
            f"--defragmenter: unknown {', '.join(bad)}; known: {', '.join(DEFRAGMENTERS)}"
        )
    config = None
    if protocol is Protocol.timeline:
        if run_time_scale <= 0:
            raise UserError(f"--run-time-scale must be > 0, got {run_time_scale}")
        try:
            cost = MigrationCost(free=free_migrations).scaled(checkpoint_scale, overhead_scale)
        except ValueError as exc:
            raise UserError(f"--checkpoint-scale/--overhead-scale: {exc}") from None
        try:
            config = TimelineConfig(
                load=load,
                hours=hours["duration"],
                warmup_hours=hours["warmup"],
                durations=DurationModel().scaled(run_time_scale),
                window_every_h=hours["window-every"],
                cost=cost,
            )
        except ValueError as exc:
            raise UserError(f"timeline: {exc}") from None
    elif [d for d in names if d not in ("none", "defrag")]:
        raise UserError("--defragmenter: only none and defrag run in the fill protocol")
    daemon = _daemon_options(settings, set_ or [], hours["window-every"], names, protocol)
    workload = load_workload(trace, nodes, pods, scale)
    tasks = [
        Task(protocol.value, p, s, timeline=config, defragmenter=d, daemon=daemon)
        for p in policies
        for d in names
        for s in seed_list
    ]
    show = sys.stderr.isatty()
    with _progress(show, len(tasks), jobs) as (bar, overall):

        def done(task: Task, run: Run) -> None:
            if bar is not None and overall is not None:
                bar.advance(overall)

        def per_run(task: Task):  # type: ignore[no-untyped-def]
            if bar is None:
                return None
            label = f"{task.label} seed {task.seed}"
            tid = bar.add_task(label, total=None)

            def update(done_n: int, total: int) -> None:
                bar.update(tid, completed=done_n, total=total)
                if done_n >= total:
                    bar.remove_task(tid)

            return update

        try:
            runs = run_tasks(workload, tasks, jobs=jobs, on_result=done, progress=per_run)
        except ValueError as exc:
            raise UserError(f"simulation: {exc}") from None
    _emit(runs, protocol, workload.name, output, curves)
    if plot is not None:
        title = f"{workload.name}: {protocol.value}"
        if protocol is Protocol.fill:
            plot_fill(runs, plot, title=title)  # type: ignore[arg-type]
        else:
            plot_timeline(runs, plot, title=title)  # type: ignore[arg-type]
        if output is Output.table:
            print_line(f"plot written to {plot}")


def parse_sets(items: Sequence[str]) -> dict[str, object]:
    """``--set KEY=VALUE`` items as dotted settings keys; each value read as a YAML scalar
    (``2``, ``0.5``, ``true``, ``null``, text)."""
    import yaml

    out: dict[str, object] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set: expected KEY=VALUE, got {item!r}")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        if isinstance(value, dict | list):
            raise UserError(f"--set {key}: give one value, not a mapping or a list")
        out[key.strip()] = value
    return out


def _daemon_options(
    settings: Path | None,
    sets: Sequence[str],
    window_every_h: float,
    names: Sequence[str],
    protocol: Protocol,
) -> DaemonOptions:
    """The defrag rows' settings, checked once here (one ``error:`` line naming the file, the
    key or the rule) before any run starts."""
    from defrag.rules import RulesError
    from defrag.settings import SettingsError
    from defrag.sim.daemon_driver import daemon_setup
    from defrag.sim.defragmenters import DaemonOptions

    overrides = parse_sets(sets)
    options = DaemonOptions(str(settings) if settings else None, overrides, window_every_h)
    if protocol is Protocol.timeline and any(n.startswith("defrag") for n in names):
        try:
            daemon_setup(settings, overrides, window_every_h=window_every_h)
        except (SettingsError, RulesError) as exc:
            raise UserError(str(exc)) from None
        except ValueError as exc:  # the default windows of a period no crontab can say
            raise UserError(f"--window-every: {exc}") from None
    elif settings is not None or sets:
        raise UserError("--settings/--set configure the daemon: give --defrag in the timeline")
    return options


def _emit(runs: list[Run], protocol: Protocol, workload: str, output: Output, curves: bool) -> None:
    from defrag.sim.report import (
        FILL_HEADER,
        fill_json,
        fill_rows,
        timeline_json,
    )
    from defrag.sim.timeline import TimelineRun

    if protocol is Protocol.fill:
        fills = [r for r in runs if not isinstance(r, TimelineRun)]
        if output is not Output.table:
            print_data(fill_json(fills, workload=workload, curves=curves), output)
            return
        table = Table(title=f"{workload}: arrival-only fill, allocation at 100% arrived GPU demand")
        _columns(table, FILL_HEADER, fills)
        for row in fill_rows(fills):
            table.add_row(*row)
        _print(table, FILL_DROP)
        return
    lines = [r for r in runs if isinstance(r, TimelineRun)]
    if output is not Output.table:
        print_data(timeline_json(lines, workload=workload, series=curves), output)
        return
    _print(timeline_table(lines, workload), TIMELINE_DROP)
    if lines:
        print_line(f"eviction costs: {cost_caption(lines[0].cost)}")


FILL_DROP = ("range", "s/run", "seeds", "failed", "moves")
"""The fill table's columns a narrow terminal leaves out first (``-o json`` keeps them)."""
TIMELINE_DROP = (
    *("scheduler", "seeds", "lost GPU·h", "queue", "evictions", "2-GPU h", "4-GPU h"),
    *("multi p95 h", "goodput %", "moves"),
)
"""The timeline table's columns a narrow terminal leaves out first; policy, allocation, the
1- and 8-GPU waits, the multi-GPU wait and the 8/1 ratio stay."""


def timeline_table(lines: list[TimelineRun], workload: str) -> Table:
    """The timeline runs for people, every column (:func:`_print` fits it to the terminal)."""
    from defrag.sim.report import timeline_header, timeline_rows

    table = Table(title=f"{workload}: timeline, mean pending time per job size")
    _columns(table, timeline_header(), lines)
    for row in timeline_rows(lines):
        table.add_row(*row)
    return table


def cost_caption(cost: dict[str, object]) -> str:
    """The eviction costs a run used, on one line."""
    if cost.get("free"):
        return "free (no work lost, no restart overhead)"
    parts = []
    for kind, c in cost.items():
        if not isinstance(c, dict):  # checkpoint_handshake_share: said last
            continue
        lo, hi = c["checkpoint_every_h"]
        never = float(c["never_checkpoint"])
        every = "no state" if hi == 0 else f"checkpoint every {lo * 60:g}–{hi * 60:g} min"
        if never:
            every += f" ({never:.0%} never)"
        parts.append(f"{kind}: {every}, restart {float(c['restart_overhead_h']) * 60:.0f} min")
    share = cost.get("checkpoint_handshake_share")
    if isinstance(share, float) and share:
        parts.append(f"checkpoint handshake: {share:.0%} of training and batch pods")
    return "; ".join(parts)


def _columns(
    table: Table, header: tuple[str, ...], runs: list[FillRun] | list[TimelineRun]
) -> None:
    """The policy column never wraps or truncates; the numbers are right-aligned."""
    width = max((len(r.label) for r in runs), default=6)
    for col in header:
        if col == "policy":
            table.add_column(col, no_wrap=True, min_width=width)
        else:
            table.add_column(col, justify="right")


def _print(table: Table, drop: Sequence[str] = ()) -> None:
    """On a terminal rich fits the table to its width, leaving out the ``drop`` columns first
    named while a cell would be cut; into a pipe or file, TSV lines with every column."""
    print_table(table, drop)
