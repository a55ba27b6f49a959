"""Sweeps on a real ``distributed`` cluster: a scheduler and two workers, each its own process
on loopback, started by distributed's own command lines (``distributed/cli/dask_scheduler.py``
and ``dask_worker.py`` in dask/distributed). The table the cluster makes is the local runner's,
byte for byte; a worker killed mid-sweep loses no run and makes none twice; a sweep interrupted
and run again makes only what is missing (counted by the cache, not timed)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from defrag.sim.sweep.cache import RunCache
from defrag.sim.sweep.engine import DaskEngine, LocalEngine, Outcome, run_sweep
from defrag.sim.sweep.results import table_columns, tidy_rows, to_csv
from defrag.sim.sweep.spec import load_sweep
from defrag.sim.sweep.tasks import SweepPlan, SweepTask, plan_sweep
from tests.support.binaries import free_port, unavailable
from tests.support.dask_loopback import Loopback
from tests.support.dask_loopback import start_loopback as start

ROOT = Path(__file__).resolve().parents[1]

SWEEP = """\
traces:
  - {synthetic: 200, scale: 0.1}
seeds: 2
policies: [least-allocated]
rows: [none, defrag, descheduler-hnu]
timeline: {load: 0.9, duration: 90m, warmup: 30m, window_every: 1h}
grid:
  planner.make_room_worth: [1, 4]
"""
"""Eight runs of a few seconds each: none and the peer once per seed, defrag per point."""


def require_distributed() -> None:
    try:
        import distributed  # noqa: F401
    except ImportError:
        unavailable("distributed is not installed (pip install 'defrag[sweep]')")


def start_loopback(tmp: Path, workers: int = 2, code: Path = ROOT) -> Loopback:
    require_distributed()
    try:
        return start(tmp, workers, code)
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def loopback(tmp_path: Path) -> Iterator[Loopback]:
    cluster = start_loopback(tmp_path)
    yield cluster
    cluster.stop()


def make_plan(tmp: Path) -> SweepPlan:
    path = tmp / "sweep.yaml"
    path.write_text(SWEEP, encoding="utf-8")
    return plan_sweep(load_sweep(path), path)


def table(plan: SweepPlan, outcome: Outcome) -> str:
    return to_csv(table_columns(plan), tidy_rows(plan, outcome))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The local runner's table (the simulator's process pool, one process)."""
    tmp = tmp_path_factory.mktemp("local")
    plan = make_plan(tmp)
    outcome = run_sweep(plan, RunCache(tmp / "cache"), LocalEngine(jobs=1))
    assert outcome.computed == len(plan.tasks) == 8 and not outcome.failures
    return table(plan, outcome)


class Counting:
    """A listener that counts, and can act after the ``n``-th run finished."""

    def __init__(self, after: int | None = None, action: object = None) -> None:
        self.done_keys: list[str] = []
        self.failures: list[str] = []
        self.after, self.action = after, action

    def start(self, total: int, cached: int) -> None:
        self.total, self.cached = total, cached

    def done(self, task: SweepTask, seconds: float) -> None:
        self.done_keys.append(task.key)
        if self.after is not None and len(self.done_keys) == self.after:
            assert callable(self.action)
            self.action()

    def failed(self, task: SweepTask, error: str) -> None:
        self.failures.append(error)


def test_the_cluster_makes_the_local_runners_table(
    loopback: Loopback, reference: str, tmp_path: Path
) -> None:
    plan = make_plan(tmp_path)
    counted = Counting()
    outcome = run_sweep(plan, RunCache(tmp_path / "cache"), DaskEngine(loopback.address), counted)
    assert outcome.workers == 2
    assert sorted(counted.done_keys) == sorted(t.key for t in plan.tasks)
    assert table(plan, outcome) == reference


def test_a_worker_killed_mid_sweep_loses_no_run(
    loopback: Loopback, reference: str, tmp_path: Path
) -> None:
    plan = make_plan(tmp_path)
    victim = loopback.workers[1]
    counted = Counting(after=1, action=lambda: os.kill(victim.pid, signal.SIGKILL))
    cache = RunCache(tmp_path / "cache")
    outcome = run_sweep(plan, cache, DaskEngine(loopback.address), counted)
    assert victim.wait(timeout=10) == -signal.SIGKILL  # it died while the sweep ran
    keys = [t.key for t in plan.tasks]
    assert not outcome.failures and not counted.failures
    assert sorted(counted.done_keys) == sorted(keys)  # each run reported once
    assert cache.keys() == set(keys) and len(list(cache.directory.glob("*/*.json"))) == 8
    assert table(plan, outcome) == reference


class Interrupt(KeyboardInterrupt):
    pass


def _interrupt() -> None:
    raise Interrupt


def test_an_interrupted_sweep_resumes_without_making_a_run_twice(
    loopback: Loopback, reference: str, tmp_path: Path
) -> None:
    plan = make_plan(tmp_path)
    cache = RunCache(tmp_path / "cache")
    engine = DaskEngine(loopback.address)
    with pytest.raises(Interrupt):
        run_sweep(plan, cache, engine, Counting(after=3, action=_interrupt))
    assert len(cache.keys()) == 3  # what finished before the stop is kept
    first = cache.keys()
    again = Counting()
    outcome = run_sweep(plan, cache, engine, again)
    assert (again.cached, outcome.cached, outcome.computed) == (3, 3, 5)
    assert not first & set(again.done_keys)  # none of the cached runs was made again
    assert table(plan, outcome) == reference
    third = run_sweep(plan, cache, engine, Counting())
    assert (third.computed, third.cached) == (0, 8)
    assert table(plan, third) == reference


def test_an_unreachable_scheduler_is_one_error(tmp_path: Path) -> None:
    require_distributed()
    from defrag.sim.sweep.engine import EngineError

    plan = make_plan(tmp_path)
    address = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(EngineError, match=f"dask scheduler {address}: cannot connect"):
        run_sweep(plan, RunCache(tmp_path / "c"), DaskEngine(address, connect_timeout_s=2))


def test_a_run_that_raises_is_retried_then_reported_not_dropped(
    loopback: Loopback, tmp_path: Path
) -> None:
    from dataclasses import replace

    from defrag.sim.runner import Workload
    from defrag.sim.sweep.tasks import TraceInput

    plan = make_plan(tmp_path)
    good = plan.traces[0]
    broken = TraceInput(good.label, good.digest, Workload(good.label, (), good.workload.pods))
    cache = RunCache(tmp_path / "cache")
    counted = Counting()
    outcome = run_sweep(
        replace(plan, traces=(broken,)), cache, DaskEngine(loopback.address, retries=1), counted
    )
    keys = {t.key for t in plan.tasks}
    assert set(outcome.failures) == keys and len(counted.failures) == len(keys)
    assert all(e == "ValueError: the cluster has no GPU" for e in outcome.failures.values())
    assert not outcome.rows and not cache.keys()  # nothing failed is cached: a rerun retries
    again = run_sweep(plan, cache, DaskEngine(loopback.address))
    assert again.computed == len(keys) and not again.failures


def test_workers_running_other_code_are_refused(tmp_path: Path) -> None:
    import shutil

    from defrag.sim.sweep.engine import EngineError

    other = tmp_path / "other"
    shutil.copytree(ROOT / "defrag", other / "defrag", ignore=shutil.ignore_patterns("__pycache__"))
    with (other / "defrag" / "sim" / "sweep" / "tasks.py").open("a") as handle:
        handle.write("# another revision\n")
    cluster = start_loopback(tmp_path, workers=1, code=other)
    try:
        plan = make_plan(tmp_path)
        with pytest.raises(EngineError, match="workers run other defrag code"):
            run_sweep(plan, RunCache(tmp_path / "c"), DaskEngine(cluster.address))
    finally:
        cluster.stop()
