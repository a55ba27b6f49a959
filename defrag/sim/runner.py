"""Running many simulations (policies × seeds × with/without defrag), in parallel processes."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace

from defrag.model.resources import Node, Pod
from defrag.model.workload import WorkloadMix
from defrag.scoring.policies import POLICY_NAMES, UnknownPolicy
from defrag.sim.daemon_driver import DaemonDriver
from defrag.sim.defragmenters import DaemonOptions, check_defragmenter, make_defragmenter
from defrag.sim.fill import FILL_RATIO, FillRun, Progress, run_fill
from defrag.sim.timeline import TimelineConfig, TimelineRun, run_timeline

PROTOCOLS = ("fill", "timeline")
Run = FillRun | TimelineRun


@dataclass(frozen=True, slots=True)
class Workload:
    """A cluster and the pods (fill: the trace to sample; timeline: the shape pool)."""

    name: str
    nodes: tuple[Node, ...]
    pods: tuple[Pod, ...]
    mix: WorkloadMix | None = None
    """The FGD workload mix; ``WorkloadMix.from_pods(pods)`` when None."""


@dataclass(frozen=True, slots=True)
class Task:
    protocol: str
    policy: str
    seed: int
    defrag: bool = False
    timeline: TimelineConfig | None = None
    fill_ratio: float = FILL_RATIO
    daemon: DaemonOptions = field(default_factory=DaemonOptions, hash=False)
    """How the daemon of a ``defrag*`` defragmenter is configured (its settings)."""
    defragmenter: str = "none"
    """Timeline: the defragmenter in the loop (:data:`~defrag.sim.defragmenters.DEFRAGMENTERS`);
    ``defrag=True`` is shorthand for ``defrag``."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; known: {', '.join(PROTOCOLS)}")
        if self.defrag and self.defragmenter == "none":
            object.__setattr__(self, "defragmenter", "defrag")
        # Names are checked when the task is made, before any run starts (or any process).
        if self.policy not in POLICY_NAMES:
            raise UnknownPolicy(self.policy)
        check_defragmenter(self.defragmenter, self.protocol)

    @property
    def label(self) -> str:
        return self.policy if self.defragmenter == "none" else f"{self.policy}+{self.defragmenter}"


def run_task(workload: Workload, task: Task, progress: Progress | None = None) -> Run:
    """One task's run. Only the daemon asks a pod to checkpoint before evicting it: a run
    without it in the loop has the checkpoint handshake off, whatever its costs say
    (``defrag.sim.migration``)."""
    mix = workload.mix if workload.mix is not None else WorkloadMix.from_pods(workload.pods)
    hook, scheduler = make_defragmenter(task.defragmenter, task.policy, task.protocol, task.daemon)
    config = task.timeline
    if config is not None and config.cost.handshake_share and not isinstance(hook, DaemonDriver):
        config = replace(config, cost=replace(config.cost, handshake_share=0.0))
    if task.protocol == "fill":
        return run_fill(
            workload.nodes,
            workload.pods,
            task.policy,
            task.seed,
            mix=mix,
            hook=hook,
            ratio=task.fill_ratio,
            progress=progress,
        )
    return run_timeline(
        workload.nodes,
        workload.pods,
        task.policy,
        task.seed,
        config=config,
        mix=mix,
        hook=hook,
        progress=progress,
        defragmenter=task.defragmenter,
        scheduler=scheduler,
    )


_WORKLOAD: Workload | None = None


def _init_worker(workload: Workload) -> None:
    global _WORKLOAD
    _WORKLOAD = workload


def _run_in_worker(task: Task) -> Run:
    assert _WORKLOAD is not None, "worker not initialised"
    return run_task(_WORKLOAD, task)


def run_tasks(
    workload: Workload,
    tasks: Sequence[Task],
    *,
    jobs: int = 1,
    on_result: Callable[[Task, Run], None] | None = None,
    progress: Callable[[Task], Progress] | None = None,
) -> list[Run]:
    """Every task's run, in task order. ``jobs`` > 1 runs tasks in that many processes
    (``progress`` then only sees finished runs, through ``on_result``)."""
    jobs = max(1, min(jobs, len(tasks), os.cpu_count() or 1))
    results: dict[int, Run] = {}
    if jobs == 1:
        for i, task in enumerate(tasks):
            results[i] = run_task(workload, task, progress(task) if progress else None)
            if on_result is not None:
                on_result(task, results[i])
    else:
        with ProcessPoolExecutor(jobs, initializer=_init_worker, initargs=(workload,)) as pool:
            futures = {pool.submit(_run_in_worker, task): i for i, task in enumerate(tasks)}
            for future in as_completed(futures):
                i = futures[future]
                results[i] = future.result()
                if on_result is not None:
                    on_result(tasks[i], results[i])
    return [results[i] for i in range(len(tasks))]
