"""Which settings point wins a sweep, by a stated rule, written as a settings file to deploy.

The rule (docs/simulator.md, "Which point wins"): every (daemon row, settings point) is
reduced to the median over all its runs (traces × policies × seeds) of its goodput and of its
lost GPU·h. The Pareto front is the points no other point beats on both (more goodput and no
more lost work, or less lost work and no less goodput). The bound is the lost GPU·h of the
best peer — the row the settings do not configure, other than ``none``, with the highest median
goodput. The winner is the front's point of highest goodput whose lost work is within the
bound; ties go to less lost work, then the shorter multi-GPU p95 wait, then the file's order.
With no peer in the sweep there is no bound; when no point of the front is within it, the
front's highest goodput wins and the result says the bound was not met."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from defrag.sim.sweep.tasks import SweepPlan, is_daemon


@dataclass(frozen=True, slots=True)
class Candidate:
    """A (row, point) or a row without settings, reduced over its runs (medians)."""

    row: str
    point: int | None
    label: str
    runs: int
    goodput: float
    lost: float
    p95_multi: float | None


@dataclass(frozen=True, slots=True)
class Verdict:
    candidates: tuple[Candidate, ...]
    """The daemon's (row, point)s."""
    others: tuple[Candidate, ...]
    """The rows the settings do not configure (``none``, peers)."""
    front: tuple[Candidate, ...]
    best_peer: Candidate | None
    winner: Candidate | None
    meets_bound: bool

    @property
    def bound(self) -> float | None:
        return self.best_peer.lost if self.best_peer is not None else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def reduce(plan: SweepPlan, rows: Sequence[dict[str, Any]]) -> list[Candidate]:
    """Every (row, point) of the table, medians over its runs, in the plan's order."""
    groups: dict[tuple[str, int | None], list[dict[str, Any]]] = {}
    by_key = {t.key: t for t in plan.tasks}
    for r in rows:
        task = by_key[r["key"]]
        groups.setdefault((task.row, task.point), []).append(r)
    out = []
    for (row, point), runs in groups.items():
        goodput = _median([float(r["goodput_pct"]) for r in runs])
        lost = _median([float(r["lost_gpu_hours"]) for r in runs])
        p95 = _median(
            [float(r["p95_wait_h_multi"]) for r in runs if r["p95_wait_h_multi"] is not None]
        )
        label = plan.points[point].label if point is not None else "—"
        assert goodput is not None and lost is not None
        out.append(Candidate(row, point, label, len(runs), goodput, lost, p95))
    return out


def pareto(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates no other beats on goodput (higher) and lost work (lower) at once."""

    def beats(a: Candidate, b: Candidate) -> bool:
        return (
            a.goodput >= b.goodput
            and a.lost <= b.lost
            and (a.goodput > b.goodput or a.lost < b.lost)
        )

    return [c for c in candidates if not any(beats(o, c) for o in candidates)]


def choose(plan: SweepPlan, rows: Sequence[dict[str, Any]]) -> Verdict:
    """The winner by the module's rule."""
    reduced = reduce(plan, rows)
    daemon = [c for c in reduced if is_daemon(c.row) and c.point is not None]
    others = [c for c in reduced if c.point is None]
    peers = [c for c in others if c.row != "none"]
    best_peer = max(peers, key=lambda c: c.goodput) if peers else None
    front = pareto(daemon)
    order = {id(c): i for i, c in enumerate(daemon)}

    def rank(c: Candidate) -> tuple[float, float, float, int]:
        wait = c.p95_multi if c.p95_multi is not None else float("inf")
        return (-c.goodput, c.lost, wait, order[id(c)])

    within = [c for c in front if best_peer is None or c.lost <= best_peer.lost]
    pool = within or front
    winner = min(pool, key=rank) if pool else None
    return Verdict(tuple(daemon), tuple(others), tuple(front), best_peer, winner, bool(within))


def settings_text(plan: SweepPlan, verdict: Verdict) -> str:
    """The winner as a settings file: the base settings file with the point's settings set
    (without a base file, the point's settings alone, over the daemon's defaults)."""
    winner = verdict.winner
    assert winner is not None and winner.point is not None
    point = plan.points[winner.point]
    data: dict[str, Any] = {}
    if plan.base_settings is not None:
        loaded = yaml.safe_load(plan.base_settings.read_text(encoding="utf-8"))
        data = loaded if isinstance(loaded, dict) else {}
    for key, value in point.overrides.items():
        section, name = key.split(".", 1)
        target = data.setdefault(section, {})
        if not isinstance(target, dict):
            target = data[section] = {}
        target[name] = value
    bound = verdict.bound
    lines = [
        f"# The winning point of the sweep {plan.source.name} (defrag simulate --sweep --best):",
        f"#   {point.label} ({winner.row} row)",
        f"#   median goodput {winner.goodput:.2f} %, lost {winner.lost:.1f} GPU·h over "
        f"{winner.runs} runs",
    ]
    if verdict.best_peer is not None and bound is not None:
        lines.append(
            f"#   best peer {verdict.best_peer.row}: goodput {verdict.best_peer.goodput:.2f} %, "
            f"lost {bound:.1f} GPU·h" + ("" if verdict.meets_bound else " (bound NOT met)")
        )
    if plan.base_settings is None:
        lines.append(
            "#   tuned over the simulator's settings (no base settings file): the keys below go "
            "over your own"
        )
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False) if data else "{}\n"
    return "\n".join(lines) + "\n" + body


def write_best(plan: SweepPlan, verdict: Verdict, path: Path) -> Path:
    path.write_text(settings_text(plan, verdict), encoding="utf-8")
    return path


__all__ = ["Candidate", "Verdict", "choose", "pareto", "reduce", "settings_text", "write_best"]
