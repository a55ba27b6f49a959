"""Running a sweep's tasks: on Dask (``distributed``: a running scheduler's address, else a
``LocalCluster`` sized to the machine) or in the simulator's local process pool
(:func:`defrag.sim.runner.run_tasks`, the reference the Dask runs are checked against).

Runs stream back as they finish; each is written to the cache at once; a run already cached is
not submitted. On Dask a task whose worker dies is rerun elsewhere by the scheduler, a task that
raises is retried (``retries``) and then reported as failed — never left out."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from defrag.sim.runner import Run, Task, run_tasks
from defrag.sim.sweep.cache import RunCache
from defrag.sim.sweep.tasks import SweepPlan, SweepTask, code_version, execute, metrics
from defrag.sim.timeline import TimelineRun

RETRIES = 2
"""How many more times a task that raised is tried before it is reported as failed."""


class EngineError(RuntimeError):
    """The engine cannot run (a scheduler that cannot be reached): one line naming it."""


class Listener(Protocol):
    def start(self, total: int, cached: int) -> None: ...
    def done(self, task: SweepTask, seconds: float) -> None: ...
    def failed(self, task: SweepTask, error: str) -> None: ...


@dataclass(slots=True)
class Outcome:
    """What a sweep produced: every run's figures by key, the failures (key → the error's
    last line), and how many runs were made now and how many came from the cache."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    computed: int = 0
    cached: int = 0
    workers: int = 0


class Engine(Protocol):
    def run(
        self, plan: SweepPlan, pending: Sequence[SweepTask], outcome: Outcome, cache: RunCache,
        listener: Listener | None,
    ) -> None: ...  # fmt: skip


def run_sweep(
    plan: SweepPlan, cache: RunCache, engine: Engine, listener: Listener | None = None
) -> Outcome:
    """Every run of ``plan``: from the cache, else made by ``engine`` (and cached)."""
    outcome = Outcome()
    pending: list[SweepTask] = []
    seen: set[str] = set()
    for task in plan.tasks:
        if task.key in seen:
            continue
        seen.add(task.key)
        hit = cache.get(task.key)
        if hit is None:
            pending.append(task)
        else:
            outcome.rows[task.key] = hit.row
            outcome.seconds[task.key] = hit.seconds
            outcome.cached += 1
    if listener is not None:
        listener.start(len(seen), outcome.cached)
    if pending:
        engine.run(plan, pending, outcome, cache, listener)
    return outcome


def _record(
    outcome: Outcome, cache: RunCache, task: SweepTask, row: dict[str, Any], seconds: float,
    listener: Listener | None,
) -> None:  # fmt: skip
    cache.put(task.key, row, seconds)
    outcome.rows[task.key] = row
    outcome.seconds[task.key] = seconds
    outcome.computed += 1
    if listener is not None:
        listener.done(task, seconds)


@dataclass(frozen=True, slots=True)
class LocalEngine:
    """The simulator's own process pool, one trace at a time (the reference)."""

    jobs: int = 1

    def run(
        self, plan: SweepPlan, pending: Sequence[SweepTask], outcome: Outcome, cache: RunCache,
        listener: Listener | None,
    ) -> None:  # fmt: skip
        outcome.workers = self.jobs
        for trace in plan.traces:
            mine = [t for t in pending if t.trace == trace.label]
            if not mine:
                continue
            by_task = {id(t.task): t for t in mine}

            def done(task: Task, run: Run, by_task: dict[int, SweepTask] = by_task) -> None:
                assert isinstance(run, TimelineRun)
                _record(outcome, cache, by_task[id(task)], metrics(run), run.seconds, listener)

            run_tasks(trace.workload, [t.task for t in mine], jobs=self.jobs, on_result=done)


def machine_workers() -> int:
    """A local cluster's workers: one single-threaded process per CPU the process may use (the
    simulator is pure Python: threads would share one interpreter lock)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class DaskEngine:
    """Dask ``distributed``: ``address`` a running scheduler (``tcp://host:8786``); None: the
    ``scheduler-address`` of Dask's own configuration (``DASK_SCHEDULER_ADDRESS``) when set,
    else a ``LocalCluster`` of :func:`machine_workers` processes."""

    address: str | None = None
    retries: int = RETRIES
    workers: int | None = None
    """A local cluster's workers (None: :func:`machine_workers`)."""
    connect_timeout_s: float = 10.0

    def run(
        self, plan: SweepPlan, pending: Sequence[SweepTask], outcome: Outcome, cache: RunCache,
        listener: Listener | None,
    ) -> None:  # fmt: skip
        import dask
        from distributed import Client, LocalCluster, as_completed

        address = self.address or dask.config.get("scheduler-address", None)
        cluster = None
        try:
            if address is None:
                cluster = LocalCluster(
                    n_workers=self.workers or machine_workers(),
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                )
                client = Client(cluster)
            else:
                client = Client(address, timeout=self.connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            if cluster is not None:
                cluster.close()
            raise EngineError(f"dask scheduler {address}: cannot connect ({exc})") from None
        try:
            outcome.workers = len(client.nthreads())
            # A run's key names the client's code; a worker running other code would file
            # its figures under keys they do not belong to.
            theirs = set(client.run(code_version).values())
            if theirs - {code_version()}:
                raise EngineError(
                    f"dask scheduler {address or 'local'}: workers run other defrag code "
                    f"({', '.join(sorted(theirs))}) than this client ({code_version()})"
                )
            # A trace's workload goes to every worker once; the runs name it.
            held = {
                t.label: client.scatter(t.workload, broadcast=True, hash=False)
                for t in plan.traces
                if any(p.trace == t.label for p in pending)
            }
            futures = {
                client.submit(
                    execute, held[task.trace], task.task, key=f"defrag-run-{task.key}",
                    pure=False, retries=self.retries,
                ): task
                for task in pending
            }  # fmt: skip
            for future in as_completed(futures):
                task = futures.pop(future)
                if future.status == "finished":
                    row, seconds = future.result()
                    _record(outcome, cache, task, row, seconds, listener)
                else:
                    error = _one_line(future)
                    outcome.failures[task.key] = error
                    if listener is not None:
                        listener.failed(task, error)
                future.release()
        finally:
            client.close()
            if cluster is not None:
                cluster.close()


def _one_line(future: Any) -> str:
    """A failed task's error on one line: its type and message."""
    try:
        exc = future.exception()
    except Exception as err:  # cancelled: the scheduler lost it
        exc = err
    text = " ".join(str(exc).split()) or "no message"
    return f"{type(exc).__name__}: {text}"


__all__ = [
    "RETRIES",
    "DaskEngine",
    "EngineError",
    "Listener",
    "LocalEngine",
    "Outcome",
    "machine_workers",
    "run_sweep",
]
