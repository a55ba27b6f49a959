"""A sweep's results for people: one tidy table of every run (CSV and Parquet), and a summary
per settings point — the median and the spread over seeds — with the rows the settings do not
configure (no defragmenter, the peers) beside it."""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from defrag.sim.sweep.engine import Outcome
from defrag.sim.sweep.tasks import SweepPlan, metric_columns

ID_COLUMNS = ("key", "trace", "policy", "row", "point", "seed")
SUMMARY_METRICS = (
    "goodput_pct",
    "p95_wait_h_multi",
    "p95_wait_h_1",
    "lost_gpu_hours",
    "evictions",
    "mean_allocation",
)
"""The figures a summary reduces over seeds (median, min, max)."""
LABELS = {
    "goodput_pct": "goodput %",
    "p95_wait_h_multi": "multi-GPU p95 wait h",
    "p95_wait_h_1": "1-GPU p95 wait h",
    "lost_gpu_hours": "lost GPU·h",
    "evictions": "evictions",
    "mean_allocation": "allocation %",
}


def table_columns(plan: SweepPlan) -> list[str]:
    return [*ID_COLUMNS, *plan.spec.swept_keys(), *metric_columns()]


def tidy_rows(plan: SweepPlan, outcome: Outcome) -> list[dict[str, Any]]:
    """Every finished run, one row each, in the plan's order (whatever order they finished
    in): its inputs, the value of each swept setting (empty for a row the settings do not
    configure, or a point that leaves the setting at its base) and its figures."""
    keys = plan.spec.swept_keys()
    rows = []
    for task in plan.tasks:
        figures = outcome.rows.get(task.key)
        if figures is None:
            continue
        point = plan.points[task.point] if task.point is not None else None
        row: dict[str, Any] = {
            "key": task.key,
            "trace": task.trace,
            "policy": task.policy,
            "row": task.row,
            "point": point.label if point is not None else "",
            "seed": task.seed,
        }
        for k in keys:
            row[k] = point.overrides.get(k) if point is not None else None
        row.update(figures)
        rows.append(row)
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def to_csv(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return out.getvalue()


def write_parquet(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """The table as Parquet; a swept setting whose values are not all numbers is text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data: dict[str, list[Any]] = {c: [row.get(c) for row in rows] for c in columns}
    for c, values in data.items():
        present = [v for v in values if v is not None]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in present)
        if present and not numeric and not all(isinstance(v, str) for v in present):
            data[c] = [None if v is None else str(v) for v in values]
        elif present and numeric and any(isinstance(v, float) for v in present):
            data[c] = [None if v is None else float(v) for v in values]
    pq.write_table(pa.table(data), path)


@dataclass(frozen=True, slots=True)
class Summary:
    """One (trace, policy, row, point)'s runs reduced over seeds."""

    trace: str
    policy: str
    row: str
    point: str
    seeds: int
    stats: dict[str, tuple[float, float, float] | None]
    """metric → (median, min, max); None when no run has it."""


def summarize(rows: Sequence[dict[str, Any]]) -> list[Summary]:
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["trace"], row["policy"], row["row"], row["point"]), []).append(row)
    out = []
    for (trace, policy, row_name, point), runs in groups.items():
        stats: dict[str, tuple[float, float, float] | None] = {}
        for m in SUMMARY_METRICS:
            values = [float(r[m]) for r in runs if r.get(m) is not None]
            stats[m] = (statistics.median(values), min(values), max(values)) if values else None
        out.append(Summary(trace, policy, row_name, point, len(runs), stats))
    return out


def summary_csv(summaries: Sequence[Summary]) -> str:
    columns = ["trace", "policy", "row", "point", "seeds"]
    for m in SUMMARY_METRICS:
        columns += [f"{m}_median", f"{m}_min", f"{m}_max"]
    rows = []
    for s in summaries:
        row: dict[str, Any] = {
            "trace": s.trace, "policy": s.policy, "row": s.row, "point": s.point,
            "seeds": s.seeds,
        }  # fmt: skip
        for m in SUMMARY_METRICS:
            st = s.stats[m]
            for name, v in zip(("median", "min", "max"), st or (None, None, None), strict=True):
                row[f"{m}_{name}"] = v
        rows.append(row)
    return to_csv(columns, rows)


def summary_markdown(summaries: Sequence[Summary]) -> str:
    """Per trace and policy, the rows the settings do not configure first, then every point:
    median (min–max over seeds)."""
    from defrag.sim.report import markdown_table

    header = ("trace", "policy", "row", "settings", "seeds", *(LABELS[m] for m in SUMMARY_METRICS))
    ordered = sorted(summaries, key=lambda s: (s.trace, s.policy, s.point != "", s.row, s.point))
    lines = []
    for s in ordered:
        cells = []
        for m in SUMMARY_METRICS:
            st = s.stats[m]
            cells.append("—" if st is None else f"{st[0]:.2f} ({st[1]:.2f}–{st[2]:.2f})")
        lines.append((s.trace, s.policy, s.row, s.point or "—", str(s.seeds), *cells))
    return markdown_table(header, lines)


def write_results(plan: SweepPlan, outcome: Outcome, directory: Path) -> dict[str, Path]:
    """``runs.csv``, ``runs.parquet``, ``summary.csv``, ``summary.md`` and ``failed.csv`` (the
    runs that failed, when any) under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    columns = table_columns(plan)
    rows = tidy_rows(plan, outcome)
    paths = {
        "table": directory / "runs.csv",
        "parquet": directory / "runs.parquet",
        "summary": directory / "summary.csv",
        "summary_md": directory / "summary.md",
    }
    paths["table"].write_text(to_csv(columns, rows), encoding="utf-8")
    write_parquet(paths["parquet"], columns, rows)
    summaries = summarize(rows)
    paths["summary"].write_text(summary_csv(summaries), encoding="utf-8")
    paths["summary_md"].write_text(summary_markdown(summaries), encoding="utf-8")
    failed = directory / "failed.csv"
    if outcome.failures:
        by_key = {t.key: t for t in plan.tasks}
        lines = [{**_ids(by_key[k]), "error": e} for k, e in outcome.failures.items()]
        failed.write_text(to_csv([*ID_COLUMNS[:-1], "seed", "error"], lines), encoding="utf-8")
        paths["failed"] = failed
    else:
        failed.unlink(missing_ok=True)
    return paths


def _ids(task: Any) -> dict[str, Any]:
    return {
        "key": task.key, "trace": task.trace, "policy": task.policy, "row": task.row,
        "point": "" if task.point is None else task.point, "seed": task.seed,
    }  # fmt: skip


__all__ = [
    "SUMMARY_METRICS",
    "Summary",
    "summarize",
    "table_columns",
    "tidy_rows",
    "to_csv",
    "write_parquet",
    "write_results",
]
