"""A sweep's plots (PNG): goodput, multi-GPU p95 wait and lost work against each swept setting,
and the Pareto front of goodput against lost work, with the peers beside the points."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from defrag.sim.sweep.best import Verdict
from defrag.sim.sweep.tasks import SweepPlan, is_daemon

PANELS = (
    ("goodput_pct", "goodput %"),
    ("p95_wait_h_multi", "multi-GPU p95 wait, h"),
    ("lost_gpu_hours", "lost GPU·h"),
)


def _shown(value: Any) -> Any:
    """A setting's value as a plot can key it (a list or a mapping as its JSON text)."""
    return json.dumps(value) if isinstance(value, list | dict) else value


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def plot_setting(plan: SweepPlan, rows: Sequence[dict[str, Any]], key: str, path: Path) -> Path:
    """Each panel's median over the runs at each value of ``key`` (bars: min–max over the
    runs), one line per daemon row and per combination of the other swept settings; each
    other row's median as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = [k for k in plan.spec.swept_keys() if k != key]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5.2 * len(PANELS), 4.2))
    daemon = [r for r in rows if is_daemon(r["row"]) and r["point"] and r.get(key) is not None]
    values = list(dict.fromkeys(_shown(r[key]) for r in daemon))
    numeric = _numeric(values)
    if numeric:
        values.sort()
    xs = {v: (v if numeric else i) for i, v in enumerate(values)}
    lines: dict[str, dict[Any, list[dict[str, Any]]]] = {}
    for r in daemon:
        rest = ", ".join(f"{k}={r.get(k)}" for k in others if r.get(k) is not None)
        label = r["row"] + (f" ({rest})" if rest else "")
        lines.setdefault(label, {}).setdefault(_shown(r[key]), []).append(r)
    peers: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if not r["point"]:
            peers.setdefault(r["row"], []).append(r)
    for ax, (metric, title) in zip(axes, PANELS, strict=True):
        for label, by_value in lines.items():
            pts = []
            for v in values:
                got = [float(r[metric]) for r in by_value.get(v, []) if r[metric] is not None]
                if got:
                    pts.append((xs[v], statistics.median(got), min(got), max(got)))
            if not pts:
                continue
            x, med, lo, hi = zip(*pts, strict=True)
            ax.errorbar(
                x, med, yerr=[[m - a for m, a in zip(med, lo, strict=True)],
                              [b - m for m, b in zip(med, hi, strict=True)]],
                marker="o", capsize=3, label=label,
            )  # fmt: skip
        for j, (row, runs) in enumerate(peers.items()):
            got = [float(r[metric]) for r in runs if r[metric] is not None]
            if got:
                ax.axhline(
                    statistics.median(got), linestyle="--", linewidth=1, color=f"C{j + 3}",
                    label=f"{row} (median)",
                )  # fmt: skip
        if not numeric:
            ax.set_xticks(list(xs.values()), [str(v) for v in values], rotation=20)
        ax.set_xlabel(key)
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{plan.source.name}: medians over traces × policies × seeds (bars: min–max)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_pareto(verdict: Verdict, path: Path, title: str) -> Path:
    """Goodput against lost work: every daemon point, the front joined, the peers, the winner
    circled and the peer bound as a dotted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    ax.scatter(
        [c.lost for c in verdict.candidates], [c.goodput for c in verdict.candidates],
        color="C0", alpha=0.6, label="settings points (defrag)",
    )  # fmt: skip
    front = sorted(verdict.front, key=lambda c: c.lost)
    ax.plot([c.lost for c in front], [c.goodput for c in front], color="C0", label="Pareto front")
    for j, c in enumerate(verdict.others):
        ax.scatter([c.lost], [c.goodput], marker="s", color=f"C{j + 2}", label=c.row)
    if verdict.bound is not None:
        ax.axvline(verdict.bound, linestyle=":", color="grey", label="best peer's lost work")
    w = verdict.winner
    if w is not None:
        ax.scatter([w.lost], [w.goodput], s=220, facecolors="none", edgecolors="red",
                   linewidths=2, label=f"winner: {w.label}")  # fmt: skip
    ax.set_xlabel("lost GPU·h (median over runs)")
    ax.set_ylabel("goodput % (median over runs)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(
    plan: SweepPlan, rows: Sequence[dict[str, Any]], verdict: Verdict, directory: Path
) -> list[Path]:
    """``setting-<key>.png`` for each swept setting and ``pareto.png``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = [
        plot_setting(plan, rows, key, directory / f"setting-{key}.png")
        for key in plan.spec.swept_keys()
    ]
    out.append(plot_pareto(verdict, directory / "pareto.png", f"{plan.source.name}: Pareto front"))
    return out


__all__ = ["plot_pareto", "plot_setting", "write_plots"]
