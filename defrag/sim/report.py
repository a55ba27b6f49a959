"""Summaries of simulation runs: per-policy medians, table rows, JSON, markdown, paper numbers."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from defrag.sim.fill import FillRun
from defrag.sim.timeline import TimelineRun

PAPER_POLICY_NAMES = {
    "01-Random": "random",
    "02-DotProd": "dot-product",
    "03-GpuClustering": "gpu-clustering",
    "04-GpuPacking": "gpu-packing",
    "05-BestFit": "best-fit",
    "06-FGD": "fgd",
}
"""The FGD paper's policy labels (``fgd/allo.csv``) → our policy names."""


def _ordered(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


@dataclass(frozen=True, slots=True)
class FillSummary:
    policy: str
    seeds: int
    allocation_at_100_median: float
    allocation_at_100_min: float
    allocation_at_100_max: float
    frag_at_100_median: float
    failed_pods_median: float
    migrations_median: float
    seconds_mean: float

    def to_dict(self) -> dict[str, object]:
        return {
            "seeds": self.seeds,
            "allocation_at_100_median": round(self.allocation_at_100_median, 3),
            "allocation_at_100_min": round(self.allocation_at_100_min, 3),
            "allocation_at_100_max": round(self.allocation_at_100_max, 3),
            "frag_at_100_median": round(self.frag_at_100_median, 3),
            "failed_pods_median": self.failed_pods_median,
            "migrations_median": self.migrations_median,
            "seconds_mean": round(self.seconds_mean, 2),
        }


def summarize_fill(runs: Sequence[FillRun]) -> list[FillSummary]:
    """One summary per policy, in the order the policies first appear."""
    out = []
    for policy in _ordered(r.label for r in runs):
        mine = [r for r in runs if r.label == policy]
        alloc = [r.allocation_at_100 for r in mine]
        out.append(
            FillSummary(
                policy=policy,
                seeds=len(mine),
                allocation_at_100_median=statistics.median(alloc),
                allocation_at_100_min=min(alloc),
                allocation_at_100_max=max(alloc),
                frag_at_100_median=statistics.median(r.frag_at_100 for r in mine),
                failed_pods_median=statistics.median(r.failed_pods for r in mine),
                migrations_median=statistics.median(r.migrations for r in mine),
                seconds_mean=statistics.fmean(r.seconds for r in mine),
            )
        )
    return out


def fill_json(runs: Sequence[FillRun], *, workload: str, curves: bool = False) -> dict[str, object]:
    return {
        "protocol": "fill",
        "workload": workload,
        "runs": [r.to_dict(curve=curves) for r in runs],
        "summary": {s.policy: s.to_dict() for s in summarize_fill(runs)},
    }


FILL_HEADER = ("policy", "seeds", "alloc@100 %", "range", "frag %", "failed", "moves", "s/run")
"""Allocation and FGD fragmentation (% of all GPUs) at 100% arrived (median over seeds), the
range over seeds, pods that fit nowhere (whole fill), migrations, seconds per run."""


def fill_rows(runs: Sequence[FillRun]) -> list[tuple[str, ...]]:
    return [
        (
            s.policy,
            str(s.seeds),
            f"{s.allocation_at_100_median:.2f}",
            f"{s.allocation_at_100_min:.2f}–{s.allocation_at_100_max:.2f}",
            f"{s.frag_at_100_median:.2f}",
            f"{s.failed_pods_median:g}",
            f"{s.migrations_median:g}",
            f"{s.seconds_mean:.1f}",
        )
        for s in summarize_fill(runs)
    ]


# --- timeline ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimelineSummary:
    policy: str
    seeds: int
    mean_allocation: float
    mean_queue: float
    wait_by_gpus: dict[str, float]
    """Mean pending time (h) per GPU class, averaged over seeds."""
    wait_by_priority: dict[str, float]
    migrations: float
    p95_by_gpus: dict[str, float] = field(default_factory=dict)
    """95th percentile pending time (h) per GPU class, mean over seeds."""
    goodput: float = 0.0
    lost_gpu_hours: float = 0.0
    evictions: float = 0.0
    max_evictions: int = 0
    gpu_wait_hours: float = 0.0
    offered_load: tuple[float, ...] = ()
    scheduler: str = ""
    defragmenter: str = "none"

    def to_dict(self) -> dict[str, object]:
        return {
            "seeds": self.seeds,
            "defragmenter": self.defragmenter,
            "scheduler": self.scheduler,
            "offered_load_pct": [round(x, 2) for x in self.offered_load],
            "mean_allocation": round(self.mean_allocation, 3),
            "goodput_pct": round(self.goodput, 3),
            "lost_gpu_hours": round(self.lost_gpu_hours, 2),
            "mean_queue": round(self.mean_queue, 2),
            "gpu_wait_hours": round(self.gpu_wait_hours, 1),
            "mean_wait_h_by_gpus": {k: round(v, 4) for k, v in self.wait_by_gpus.items()},
            "p95_wait_h_by_gpus": {k: round(v, 4) for k, v in self.p95_by_gpus.items()},
            "mean_wait_h_by_priority": {k: round(v, 4) for k, v in self.wait_by_priority.items()},
            "migrations_mean": self.migrations,
            "evictions_mean": self.evictions,
            "max_evictions_per_pod": self.max_evictions,
        }


def summarize_timeline(runs: Sequence[TimelineRun]) -> list[TimelineSummary]:
    out = []
    for policy in _ordered(r.label for r in runs):
        mine = [r for r in runs if r.label == policy]
        gpus = _ordered(c.name for r in mine for c in r.by_gpus)
        prios = _ordered(c.name for r in mine for c in r.by_priority)
        out.append(
            TimelineSummary(
                policy=policy,
                seeds=len(mine),
                mean_allocation=statistics.fmean(r.mean_allocation for r in mine),
                mean_queue=statistics.fmean(r.mean_queue for r in mine),
                wait_by_gpus={g: _mean_wait(mine, g, "gpus") for g in gpus},
                wait_by_priority={p: _mean_wait(mine, p, "priority") for p in prios},
                migrations=statistics.fmean(r.migrations for r in mine),
                p95_by_gpus={g: _mean_p95(mine, g) for g in gpus},
                goodput=statistics.fmean(r.goodput_pct for r in mine),
                lost_gpu_hours=statistics.fmean(r.lost_gpu_hours for r in mine),
                evictions=statistics.fmean(r.evictions for r in mine),
                max_evictions=max(r.max_evictions for r in mine),
                gpu_wait_hours=statistics.fmean(r.gpu_wait_hours for r in mine),
                offered_load=tuple(r.offered_load_pct for r in mine),
                scheduler=mine[0].scheduler or mine[0].policy,
                defragmenter=mine[0].defragmenter,
            )
        )
    return out


def _mean_p95(runs: Sequence[TimelineRun], name: str) -> float:
    vals = [c.p95_wait_h for r in runs for c in r.by_gpus if c.name == name]
    return statistics.fmean(vals) if vals else 0.0


def _mean_wait(runs: Sequence[TimelineRun], name: str, kind: str) -> float:
    """Pod-weighted mean pending time of class ``name`` over ``runs``."""
    pods = total = 0.0
    for r in runs:
        for c in r.by_gpus if kind == "gpus" else r.by_priority:
            if c.name == name:
                pods += c.pods
                total += c.mean_wait_h * c.pods
    return total / pods if pods else 0.0


def timeline_json(
    runs: Sequence[TimelineRun], *, workload: str, series: bool = False
) -> dict[str, object]:
    return {
        "protocol": "timeline",
        "workload": workload,
        "runs": [r.to_dict(series=series) for r in runs],
        "summary": {s.policy: s.to_dict() for s in summarize_timeline(runs)},
    }


TIMELINE_CLASSES = ("1", "2", "4", "8")


def timeline_header(classes: Sequence[str] = TIMELINE_CLASSES) -> tuple[str, ...]:
    """Scheduler, GPU allocation and goodput %, GPU-hours lost to evictions, queue length,
    mean wait (h) per job size, multi-GPU mean and p95 wait, the 8-GPU / 1-GPU wait ratio,
    migrations and evictions."""
    return (
        "policy", "scheduler", "seeds", "alloc %", "goodput %", "lost GPU·h", "queue",
        *(f"{c}-GPU h" for c in classes), "multi h", "multi p95 h", "8/1", "moves", "evictions",
    )  # fmt: skip


def timeline_rows(
    runs: Sequence[TimelineRun], classes: Sequence[str] = TIMELINE_CLASSES
) -> list[tuple[str, ...]]:
    rows = []
    for s in summarize_timeline(runs):
        rows.append(_row(s, classes))
    return rows


def starvation_ratio(s: TimelineSummary) -> str:
    """Mean wait of 8-GPU pods over that of 1-GPU pods, as text."""
    one, eight = s.wait_by_gpus.get("1", 0.0), s.wait_by_gpus.get("8")
    if eight is None or eight == 0:
        return "–"
    return "∞" if one == 0 else f"{eight / one:.0f}×"


def _row(s: TimelineSummary, classes: Sequence[str]) -> tuple[str, ...]:
    def h(d: dict[str, float], c: str) -> str:
        return f"{d[c]:.2f}" if c in d else "–"

    return (
        s.policy,
        s.scheduler,
        str(s.seeds),
        f"{s.mean_allocation:.1f}",
        f"{s.goodput:.1f}",
        f"{s.lost_gpu_hours:.0f}",
        f"{s.mean_queue:.0f}",
        *(h(s.wait_by_gpus, c) for c in classes),
        h(s.wait_by_gpus, "multi"),
        h(s.p95_by_gpus, "multi"),
        starvation_ratio(s),
        f"{s.migrations:g}",
        f"{s.evictions:g}",
    )


# --- rendering and the paper's numbers -----------------------------------------------------------


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def paper_medians(allo_csv: str | Path, percent: int = 100) -> dict[tuple[str, str], float]:
    """Median allocation at ``percent``% arrived per (trace, policy) from the paper's
    ``allo.csv``; trace names lose their ``openb_pod_list_`` prefix, policies use our names."""
    path = Path(allo_csv)
    values: dict[tuple[str, str], list[float]] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                trace = row["workload"].removeprefix("openb_pod_list_")
                policy = PAPER_POLICY_NAMES.get(row["sc_policy"], row["sc_policy"])
                values.setdefault((trace, policy), []).append(float(row[str(percent)]))
            except (KeyError, ValueError) as exc:
                raise ValueError(
                    f"{path}:{line}: cannot read the paper's allocation: {exc}"
                ) from None
    return {key: statistics.median(v) for key, v in values.items()}
