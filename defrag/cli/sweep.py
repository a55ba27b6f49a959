"""``defrag simulate --sweep FILE``: a settings grid over traces, seeds and rows, run on Dask,
reduced to a table, a summary, plots and (``--best``) the winning settings file
(docs/simulator.md, "Sweeps").

Exit status: 0 every run finished; 1 some runs failed after their retries (each named on
stderr and in ``failed.csv``; the finished ones are cached, a rerun makes only the failed);
2 a mistake in the sweep file or the flags, or a scheduler that cannot be reached (one
``error:`` line); 130 interrupted (the finished runs are cached: run it again to resume)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from defrag.cli.app import UserError, err_console, print_line

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from defrag.sim.sweep.tasks import SweepTask

EXIT_FAILED_RUNS = 1
EXIT_INTERRUPTED = 130


class _Bar:
    """The progress of a sweep on a terminal: runs done / failed of all, and the time left."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        self.n_failed = 0

    def __enter__(self) -> _Bar:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("failed {task.fields[failed]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=err_console,
                transient=True,
            )
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)

    def start(self, total: int, cached: int) -> None:
        if self.bar is not None:
            self.task = self.bar.add_task("runs", total=total, completed=cached, failed=0)

    def done(self, task: SweepTask, seconds: float) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.advance(self.task)

    def failed(self, task: SweepTask, error: str) -> None:
        self.n_failed += 1
        err_console.print(
            f"run failed: {task.trace} {task.policy} {task.row} seed {task.seed}"
            f" (key {task.key}): {error}",
            markup=False,
            highlight=False,
        )
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, advance=1, failed=self.n_failed)


def sweep_command(path: Path, dask: str | None, best: bool) -> None:
    """Run the sweep file ``path`` and write its results beside it (or where it says)."""
    from rich.markup import escape

    from defrag.sim.sweep.best import choose, write_best
    from defrag.sim.sweep.cache import RunCache
    from defrag.sim.sweep.engine import DaskEngine, EngineError, run_sweep
    from defrag.sim.sweep.plots import write_plots
    from defrag.sim.sweep.results import tidy_rows, write_results
    from defrag.sim.sweep.spec import SweepError, load_sweep
    from defrag.sim.sweep.tasks import plan_sweep

    absent = [m for m in ("distributed", "pyarrow") if importlib.util.find_spec(m) is None]
    if absent:
        raise UserError(f"--sweep needs {' and '.join(absent)}: pip install 'defrag[sweep]'")
    try:
        spec = load_sweep(path)
        plan = plan_sweep(spec, path)
    except SweepError as exc:
        raise UserError(str(exc)) from None
    out = (
        path.parent / spec.results
        if spec.results is not None
        else path.with_name(f"{path.stem}.results")
    )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{path}: results: cannot make {out}: {exc.strerror}") from None
    cache = RunCache(out / "cache")
    engine = DaskEngine(dask if dask is not None else spec.dask)
    started = time.perf_counter()
    with _Bar(sys.stderr.isatty()) as bar:
        try:
            outcome = run_sweep(plan, cache, engine, bar)
        except EngineError as exc:
            raise UserError(str(exc)) from None
        except KeyboardInterrupt:
            done = len(cache.keys())
            raise UserError(
                f"interrupted: {done} runs are cached under {cache.directory}; run the same "
                "command again to resume",
                exit_code=EXIT_INTERRUPTED,
            ) from None
    wall = time.perf_counter() - started
    paths = write_results(plan, outcome, out)
    rows = tidy_rows(plan, outcome)
    verdict = choose(plan, rows)
    plots = write_plots(plan, rows, verdict, out) if rows else []
    total = len({t.key for t in plan.tasks})
    print_line(
        f"{total} runs: {outcome.computed} made, {outcome.cached} from the cache, "
        f"{len(outcome.failures)} failed; {wall:.0f} s on {outcome.workers or 'no'} workers"
    )
    print_line(f"table: {paths['table']} and {paths['parquet'].name}")
    print_line(f"summary: {paths['summary_md']}")
    for p in plots:
        print_line(f"plot: {p}")
    if best:
        w = verdict.winner
        if w is None:
            raise UserError(f"{path}: --best: no run of a daemon row finished (rows: {spec.rows})")
        settings = write_best(plan, verdict, out / "best-settings.yaml")
        bound = (
            f"lost work within {verdict.best_peer.row}'s {verdict.bound:.1f} GPU·h"
            if verdict.best_peer is not None and verdict.meets_bound
            else "the bound of the best peer is not met by any point: highest goodput on the front"
            if verdict.best_peer is not None
            else "no peer in the sweep: highest goodput on the front"
        )
        print_line(
            f"best: {escape(w.label)} ({w.row}): goodput {w.goodput:.2f} %, "
            f"lost {w.lost:.1f} GPU·h (medians over {w.runs} runs; {bound})"
        )
        print_line(f"settings: {settings}")
    if outcome.failures:
        raise UserError(
            f"{len(outcome.failures)} runs failed after their retries (see {out / 'failed.csv'});"
            " run the same command again to retry them",
            exit_code=EXIT_FAILED_RUNS,
        )
