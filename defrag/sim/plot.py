"""PNG plots of simulation runs (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from defrag.sim.fill import FillRun
from defrag.sim.timeline import TimelineRun


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fill(runs: Sequence[FillRun], path: str | Path, *, title: str = "") -> Path:
    """GPU allocation against arrived GPU demand, one line per policy (median over seeds),
    like the FGD paper's figure; the diagonal is 'every pod fits'."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in dict.fromkeys(r.label for r in runs):
        mine = [r for r in runs if r.label == policy]
        x = np.array(mine[0].curve.percent)
        y = np.median(np.array([r.curve.allocation for r in mine]), axis=0)
        ax.plot(x, y, label=f"{policy} ({np.interp(100, x, y):.1f}% at 100)")
    top = max((r.curve.percent[-1] for r in runs), default=130)
    ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=1)
    ax.axvline(100, color="grey", linewidth=0.5)
    ax.set_xlim(60, top)
    ax.set_ylim(60, 100)
    ax.set_xlabel("arrived GPU demand (% of cluster GPUs)")
    ax.set_ylabel("GPUs allocated (%)")
    ax.set_title(title or "arrival-only fill")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return _save(fig, plt, path)


def plot_timeline(runs: Sequence[TimelineRun], path: str | Path, *, title: str = "") -> Path:
    """GPU allocation and queue length over time, one line per policy (first seed)."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for policy in dict.fromkeys(r.label for r in runs):
        run = next(r for r in runs if r.label == policy)
        t = np.array(run.series.time_h)
        top.plot(t, run.series.allocation, label=policy, linewidth=1)
        bottom.plot(t, run.series.queue, label=policy, linewidth=1)
    top.set_ylabel("GPUs allocated (%)")
    bottom.set_ylabel("pods waiting")
    bottom.set_xlabel("simulated time (h)")
    top.set_title(title or "timeline")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    top.legend(fontsize=8)
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: str | Path) -> Path:
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
