"""A sweep file made into runs: each a pure task keyed by its inputs (the trace's digest, the
daemon settings' digest, the seed, the row, the policy, the timeline knobs and the code's
version), so that a finished run is never made again (:mod:`defrag.sim.sweep.cache`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import defrag
from defrag.adapters.tracedata import data_dir, missing, missing_message
from defrag.rules import RulesError
from defrag.scoring.policies import POLICY_NAMES
from defrag.settings import SettingsError, load_settings
from defrag.sim.daemon_driver import SIM_SETTINGS, daemon_setup, window_schedule
from defrag.sim.defragmenters import DaemonOptions, check_defragmenter
from defrag.sim.migration import MigrationCost
from defrag.sim.runner import Task, Workload, run_task
from defrag.sim.sweep.spec import SweepError, SweepSpec, SyntheticTrace, TraceFiles
from defrag.sim.synthetic import synthetic_nodes, synthetic_pods
from defrag.sim.timeline import DurationModel, TimelineConfig, TimelineRun
from defrag.sim.timeline_results import GPU_ORDER
from defrag.sim.trace import TraceError, load_nodes, load_pods

OPENB_NODES = "openb/openb_node_list_gpu_node.csv"

NOT_SIMULATED = ("cluster", "prometheus", "alerts", "leadership", "http", "logging", "sim")
"""Settings sections no simulated run reads: left out of a point's settings and its digest (a
host name in ``leadership.identity`` must not make two machines' caches differ)."""

METRICS = (
    "scheduler",
    "offered_load_pct",
    "arrivals",
    "mean_allocation",
    "goodput_pct",
    "lost_gpu_hours",
    "lost_work_gpu_hours",
    "overhead_gpu_hours",
    "mean_queue",
    "gpu_wait_hours",
    "migrations",
    "evictions",
    "max_evictions_per_pod",
)
"""A run's figures in the table, as :meth:`TimelineRun.to_dict` rounds them; then per job size
(:data:`~defrag.sim.timeline_results.GPU_ORDER`) its pods and mean / p95 pending time."""
CLASS_FIELDS = ("pods", "mean_wait_h", "p95_wait_h", "still_pending")


def metric_columns() -> list[str]:
    return [*METRICS, *(f"{f}_{c}" for c in GPU_ORDER for f in CLASS_FIELDS)]


def is_daemon(row: str) -> bool:
    """The rows whose runs the settings points configure: the daemon's (``defrag*``)."""
    return row == "defrag" or row.startswith("defrag-")


@lru_cache(maxsize=1)
def code_version() -> str:
    """The package's version and a digest of its Python sources: a change to the code makes
    every key new (a run made by other code is not this code's run)."""
    root = Path(defrag.__file__).parent
    digest = hashlib.sha256(defrag.__version__.encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return f"{defrag.__version__}+{digest.hexdigest()[:12]}"


def _sha(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class TraceInput:
    """One trace of the sweep, loaded: its label, digest and workload."""

    label: str
    digest: str
    workload: Workload


@dataclass(frozen=True, slots=True)
class Point:
    """One settings point: the overrides the file gives and the daemon settings they make."""

    index: int
    overrides: Mapping[str, Any]
    settings: Mapping[str, Any] = field(hash=False)
    """The resolved settings sections a run is given (no settings file needed on a worker)."""
    digest: str

    @property
    def label(self) -> str:
        if not self.overrides:
            return "base"
        return ", ".join(f"{k}={json.dumps(v)}" for k, v in self.overrides.items())


@dataclass(frozen=True, slots=True)
class SweepTask:
    """One run of the sweep. ``point`` is None for a row the settings do not configure (no
    defragmenter, a peer): it runs once and stands beside every point."""

    key: str
    trace: str
    policy: str
    row: str
    seed: int
    point: int | None
    task: Task = field(hash=False)


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """Every run of a sweep, in the table's order (trace, policy, row, point, seed)."""

    spec: SweepSpec
    source: Path
    traces: tuple[TraceInput, ...]
    points: tuple[Point, ...]
    tasks: tuple[SweepTask, ...]
    base_settings: Path | None

    def workload(self, trace: str) -> TraceInput:
        return next(t for t in self.traces if t.label == trace)


def plan_sweep(spec: SweepSpec, source: Path) -> SweepPlan:
    """The runs of ``spec`` (read from ``source``: relative paths are beside it), every input
    checked before any run: :class:`SweepError` naming the file and the field."""
    where = source.parent
    bad = [p for p in spec.policies if p not in POLICY_NAMES]
    if bad:
        raise SweepError(
            f"{source}: policies: unknown {', '.join(bad)}; known: {', '.join(POLICY_NAMES)}"
        )
    for i, row in enumerate(spec.rows):
        try:
            check_defragmenter(row, "timeline")
        except ValueError as exc:
            raise SweepError(f"{source}: rows.{i}: {exc}") from None
    base = where / spec.settings if spec.settings is not None else None
    if base is not None and not base.is_file():
        raise SweepError(f"{source}: settings: no settings file {base}")
    points = tuple(_point(i, p, base, spec, source) for i, p in enumerate(spec.settings_points()))
    traces = tuple(_trace(i, t, where, source) for i, t in enumerate(spec.traces))
    labels = [t.label for t in traces]
    if len(set(labels)) != len(labels):
        raise SweepError(f"{source}: traces: two traces have one name ({', '.join(labels)})")
    config = _timeline(spec)
    knobs = spec.timeline.model_dump(mode="json")
    version = code_version()
    tasks: list[SweepTask] = []
    for trace in traces:
        for policy in spec.policies:
            for row in spec.rows:
                for point in points if is_daemon(row) else (None,):
                    for seed in spec.seeds:
                        inputs = {
                            "trace": trace.digest,
                            "policy": policy,
                            "row": row,
                            "seed": seed,
                            "timeline": knobs,
                            "settings": point.digest if point is not None else "",
                            "code": version,
                        }
                        daemon = DaemonOptions(
                            None,
                            dict(point.settings) if point is not None else {},
                            spec.timeline.window_every,
                        )
                        task = Task(
                            "timeline", policy, seed, timeline=config, defragmenter=row,
                            daemon=daemon,
                        )  # fmt: skip
                        tasks.append(
                            SweepTask(
                                _sha(inputs)[:24],
                                trace.label,
                                policy,
                                row,
                                seed,
                                point.index if point is not None else None,
                                task,
                            )
                        )
    return SweepPlan(spec, source, traces, points, tuple(tasks), base)


def _timeline(spec: SweepSpec) -> TimelineConfig:
    t = spec.timeline
    cost = MigrationCost().scaled(t.checkpoint_scale, t.overhead_scale)
    return TimelineConfig(
        load=t.load,
        hours=t.duration,
        warmup_hours=t.warmup,
        durations=DurationModel().scaled(t.run_time_scale),
        window_every_h=t.window_every,
        cost=MigrationCost(kinds=cost.kinds, free=cost.free, handshake_share=t.handshake_share),
    )


def _point(
    index: int, overrides: dict[str, Any], base: Path | None, spec: SweepSpec, source: Path
) -> Point:
    """The daemon settings of one point, as ``defrag simulate --settings BASE --set …`` makes
    them (the base file, else the simulator's settings and windows), resolved here so that a
    worker needs no file; checked (settings and rules) before any run."""
    label = ", ".join(f"{k}={json.dumps(v)}" for k, v in overrides.items()) or "base"
    flags: dict[str, Any] = {}
    if base is None:
        try:
            schedule = window_schedule(spec.timeline.window_every)
        except ValueError as exc:
            raise SweepError(f"{source}: timeline.window_every: {exc}") from None
        flags = {**SIM_SETTINGS, "windows.schedule": schedule}
    try:
        settings = load_settings(base, {**flags, **overrides}).model_dump(mode="json")
    except SettingsError as exc:
        raise SweepError(f"{source}: settings point {index} ({label}): {exc}") from None
    for section in NOT_SIMULATED:
        settings.pop(section, None)
    if "scoring.policy" not in overrides:  # the run's policy is the scheduler's score
        settings["scoring"].pop("policy", None)
    try:
        daemon_setup(None, settings, window_every_h=spec.timeline.window_every)
    except (SettingsError, RulesError) as exc:
        raise SweepError(f"{source}: settings point {index} ({label}): {exc}") from None
    return Point(index, dict(overrides), settings, _sha(settings))


def _trace(index: int, trace: Any, where: Path, source: Path) -> TraceInput:
    field_name = f"traces.{index}"
    try:
        if isinstance(trace, SyntheticTrace):
            nodes = synthetic_nodes(trace.scale)
            pods = synthetic_pods(trace.synthetic, seed=0)
            default = trace == SyntheticTrace()
            label = "synthetic" if default else f"synthetic-{trace.synthetic}x{trace.scale:g}"
            digest = _sha({"synthetic": trace.synthetic, "scale": trace.scale})
            return TraceInput(label, digest, Workload(label, nodes, pods))
        if isinstance(trace, TraceFiles):
            pods_path, nodes_path = where / trace.pods, where / trace.nodes
            label = trace.name or pods_path.stem
        else:
            name = str(trace).removeprefix("openb:")
            data = data_dir()
            files = [OPENB_NODES, f"openb/openb_pod_list_{name}.csv"]
            absent = missing(data, files)
            if absent:
                raise SweepError(f"{source}: {field_name}: {missing_message(data, absent)}")
            nodes_path, pods_path = (data / f for f in files)
            label = name
        files_digest = hashlib.sha256()
        for path in (pods_path, nodes_path):
            files_digest.update(path.read_bytes())
        workload = Workload(label, load_nodes(nodes_path), load_pods(pods_path).pods)
        return TraceInput(label, files_digest.hexdigest(), workload)
    except OSError as exc:
        raise SweepError(f"{source}: {field_name}: {exc.filename}: {exc.strerror}") from None
    except TraceError as exc:
        raise SweepError(f"{source}: {field_name}: {exc}") from None


def execute(workload: Workload, task: Task) -> tuple[dict[str, Any], float]:
    """One run: its table figures and its wall seconds (kept out of the figures, which depend
    on the inputs alone)."""
    run = run_task(workload, task)
    assert isinstance(run, TimelineRun)
    return metrics(run), run.seconds


def metrics(run: TimelineRun) -> dict[str, Any]:
    """A run's figures, one column each (:func:`metric_columns`); a job size with no pod in
    the measured period is empty (None)."""
    d = run.to_dict()
    out: dict[str, Any] = {m: d[m] for m in METRICS}
    by_gpus = d["pending_by_gpus"]
    assert isinstance(by_gpus, dict)
    for cls in GPU_ORDER:
        stats = by_gpus.get(cls) or {}
        for f in CLASS_FIELDS:
            out[f"{f}_{cls}"] = stats.get(f)
    return out


__all__ = [
    "METRICS",
    "Point",
    "SweepPlan",
    "SweepTask",
    "TraceInput",
    "code_version",
    "execute",
    "is_daemon",
    "metric_columns",
    "metrics",
    "plan_sweep",
]
