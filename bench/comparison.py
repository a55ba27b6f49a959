"""One ``make bench`` run as a table: each target's figure at HEAD beside the same figure from
the base commit measured in the same run, the gain, the target and whether HEAD meets it, with
the machine's calibration; as Markdown (printed, and for docs/benchmarks.md) and as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.targets import TARGETS, Better, Reading, Target

TIME_UNITS = {"s": 1.0, "ms": 1e-3}


@dataclass(frozen=True, slots=True)
class Side:
    """One bench run at one commit."""

    status: str
    """``ok``, ``failed (…)``, ``skipped …`` or ``absent``."""
    seconds: float = 0.0
    output: str = ""
    reason: str = ""
    """Why it has no figures: the last line it printed when it failed, what was absent."""
    load: float | None = None
    """The 1-minute load average when it ended."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def why(self) -> str:
        return self.reason or self.status


@dataclass(frozen=True, slots=True)
class BenchRun:
    name: str
    command: str
    head: Side
    base: Side | None = None
    """None when the run compares with no base."""


@dataclass(frozen=True, slots=True)
class Run:
    head: str
    """The commit measured (``+changes``: with the working tree's changes)."""
    base: str | None
    quick: bool
    calibration: tuple[float, float]
    """``bench.calibrate`` before and after every bench, in seconds."""
    loads: tuple[float, float]
    benches: tuple[BenchRun, ...] = field(default_factory=tuple)
    started: str = ""

    @property
    def cal_s(self) -> float:
        return sum(self.calibration) / 2


@dataclass(frozen=True, slots=True)
class Row:
    target: Target
    head: Reading | None
    head_missing: str
    base: Reading | None
    base_missing: str
    """Why there is no base figure ("" when there is one, or no base was run)."""
    full: bool

    @property
    def gain(self) -> float | None:
        """How many times better HEAD is than the base: base ÷ HEAD where lower is better (a
        time: the speed-up), HEAD ÷ base where higher is better. None unless both are > 0."""
        if self.head is None or self.base is None:
            return None
        head, base = self.head.value, self.base.value
        if head <= 0 or base <= 0:
            return None
        return base / head if self.target.better is Better.LOWER else head / base

    @property
    def met(self) -> bool | None:
        """Whether HEAD meets the target; None at a quick size or without a figure."""
        if not self.full or self.head is None:
            return None
        return self.target.met(self.head.value)


def _reading(target: Target, side: Side | None, full: bool) -> tuple[Reading | None, str]:
    if side is None:
        return None, ""
    if not side.ok:
        return None, side.why()
    found = target.read(side.output, full=full)
    return (found, "") if found else (None, "not in its output")


def rows(run: Run, targets: Sequence[Target] = TARGETS) -> list[Row]:
    """Every target of the benches run, in the table's order. At a quick size several targets
    can read the same line (they differ only in a size the quick run does not reach): that line
    is shown once, under the target nearest to it."""
    full = not run.quick
    by_name = {b.name: b for b in run.benches}
    out: list[Row] = []
    for target in targets:
        bench = by_name.get(target.bench)
        if bench is None:
            continue
        head, head_missing = _reading(target, bench.head, full)
        base, base_missing = _reading(target, bench.base, full)
        out.append(Row(target, head, head_missing, base, base_missing, full))
    if full:
        return out
    best: dict[tuple[str, str, tuple[tuple[str, str], ...]], Row] = {}
    for row in out:
        if row.head is None:
            continue
        line = (row.target.bench, row.target.key, row.head.about)
        kept = best.get(line)
        if kept is None or row.target.likeness(row.head) > kept.target.likeness(row.head):
            best[line] = row
    chosen = {id(r) for r in best.values()}
    return [r for r in out if r.head is None or id(r) in chosen]


def _value(reading: Reading | None, unit: str, missing: str) -> str:
    if reading is None:
        return f"— ({missing})" if missing else "—"
    return f"{reading.value:g} {unit}"


def _label(row: Row) -> str:
    if row.full or row.head is None or not row.head.about or row.head.about == row.target.where:
        return row.target.label
    about = ", ".join(f"{k} {v}" for k, v in row.head.about)
    return f"{row.target.label} (quick: {about})"


def _per_cal(row: Row, cal_s: float) -> str:
    scale = TIME_UNITS.get(row.target.unit)
    if row.head is None or scale is None or cal_s <= 0:
        return "—"
    return f"{row.head.value * scale / cal_s:.3g}"


def _took(side: Side) -> str:
    """Its wall time, "—" for a bench that never started (absent, or skipped before)."""
    return f"{side.seconds:.1f}" if side.seconds > 0 else "—"


def _short(text: str, width: int = 90) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= width else text[: width - 1] + "…"


def markdown(run: Run, targets: Sequence[Target] = TARGETS) -> list[str]:
    """The run as Markdown: its header, the benches, then every figure beside its target."""
    base = run.base or "none"
    cal = run.calibration
    lines = [
        f"HEAD {run.head} against base {base}{' (quick sizes)' if run.quick else ''}; "
        f"calibration {cal[0]:.3f} s before, {cal[1]:.3f} s after (`python -m bench.calibrate`); "
        f"load average {run.loads[0]:.1f} before, {run.loads[1]:.1f} after"
        + (f"; started {run.started}" if run.started else ""),
        "",
        f"| bench | command | HEAD | base {base} | seconds (HEAD / base) | load at end |",
        "|---|---|---|---|---|---|",
    ]
    for b in run.benches:
        base_status = _short(b.base.status if b.base.ok else f"{b.base.why()}") if b.base else "—"
        seconds = " / ".join(_took(s) for s in (b.head, b.base) if s is not None)
        loads = " / ".join(
            f"{s.load:.1f}" for s in (b.head, b.base) if s is not None and s.load is not None
        )
        lines.append(
            f"| {b.name} | `{b.command}` | {_short(b.head.why() if not b.head.ok else 'ok')} "
            f"| {base_status} | {seconds} | {loads or '—'} |"
        )
    table = rows(run, targets)
    if not table:
        return lines
    lines += [
        "",
        f"| figure | bench | HEAD {run.head} | base {base} | gain | target | met | HEAD ÷ cal. |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in table:
        t = row.target
        gain = f"{row.gain:.2f}×" if row.gain is not None else "—"
        target = f"{t.met_word} {t.limit:g} {t.unit}" + ("" if row.full else " (full size)")
        met = {True: "yes", False: "no", None: "—"}[row.met]
        lines.append(
            f"| {_label(row)} | {t.bench} | {_value(row.head, t.unit, _short(row.head_missing))} "
            f"| {_value(row.base, t.unit, _short(row.base_missing))} | {gain} | {target} "
            f"| {met} | {_per_cal(row, run.cal_s)} |"
        )
    return lines


def _side_json(side: Side | None) -> dict[str, Any] | None:
    if side is None:
        return None
    return {"status": side.status, "seconds": round(side.seconds, 3), "reason": side.reason,
            "load": side.load}  # fmt: skip


def _reading_json(reading: Reading | None) -> dict[str, Any] | None:
    return None if reading is None else {"value": reading.value, "about": dict(reading.about)}


def as_json(run: Run, targets: Sequence[Target] = TARGETS) -> str:
    """The run's figures, every bench's status and the calibration, for tools and the docs."""
    figures = [
        {
            "figure": r.target.label,
            "bench": r.target.bench,
            "unit": r.target.unit,
            "target": r.target.limit,
            "better": r.target.better.value,
            "source": r.target.source,
            "head": _reading_json(r.head),
            "head_missing": r.head_missing,
            "base": _reading_json(r.base),
            "base_missing": r.base_missing,
            "gain": r.gain,
            "met": r.met,
        }
        for r in rows(run, targets)
    ]
    doc = {
        "head": run.head,
        "base": run.base,
        "quick": run.quick,
        "started": run.started,
        "calibration_s": {"before": run.calibration[0], "after": run.calibration[1]},
        "load": {"before": run.loads[0], "after": run.loads[1]},
        "benches": [
            {
                "name": b.name,
                "command": b.command,
                "head": _side_json(b.head),
                "base": _side_json(b.base),
            }
            for b in run.benches
        ],
        "figures": figures,
    }
    return json.dumps(doc, indent=2)
