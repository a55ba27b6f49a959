"""The memory soak's RSS curve: ``rss.csv`` (``bench/bench_soak.py --memory --out DIR``) drawn per
process, with the least-squares line over the samples after the warm-up.

    .venv/bin/python -m bench.soak_plot DIR/rss.csv --since 2026-12-04T13:48:48 \\
        --out docs/img/soak-rss.png [--json DIR/rss-figures.json]

``--since`` is when the chaos began (by default the ``chaos-started`` file the soak writes beside
``rss.csv``; the log says ``running to …``); the warm-up is the first ``WARMUP_S`` after it.
The figures printed (and written with ``--json``) are ``bench_soak.long_rss_figures`` over the
same samples.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import datetime
from pathlib import Path

from bench.bench_soak import CHAOS_STARTED, WARMUP_S, long_rss_figures

DAEMONS = ("daemon-defrag", "daemon-defrag-2", "extender")


def read(path: Path) -> list[tuple[float, str, int, int]]:
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            t = datetime.fromisoformat(row["time_utc"]).timestamp()
            rows.append((t, row["process"], int(row["pid"]), int(row["rss_kb"])))
    return rows


def plot(rows: list[tuple[float, str, int, int]], since: float, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = long_rss_figures(rows, since)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7.5), sharex=True)
    for name in sorted({n for _, n, _, _ in rows}):
        pts = [(t, kb) for t, n, _, kb in rows if n == name]
        minutes = [(t - since) / 60 for t, _ in pts]
        mb = [kb / 1024 for _, kb in pts]
        axis = top if name in DAEMONS else bottom
        slope = figures[name]["slope_kb_per_min_after_warmup"]
        label = f"{name} ({slope:+.1f} kB/min after {WARMUP_S / 60:.0f} min)"
        axis.plot(minutes, mb, marker=".", linewidth=1, label=label)
    for axis in (top, bottom):
        axis.axvline(WARMUP_S / 60, color="grey", linestyle="--", linewidth=1)
        axis.set_ylabel("RSS (MiB)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="upper left")
    top.set_title(title, fontsize=10)
    bottom.set_xlabel("minutes since the chaos began (dashed: end of the warm-up)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument(
        "--since", help="ISO time the chaos began (UTC); default: the chaos-started file by CSV"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--title", default="defrag memory soak: RSS per process")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    text = args.since
    if text is None:
        started = args.csv.parent / CHAOS_STARTED
        try:
            text = started.read_text().strip()
        except OSError as exc:
            print(f"error: {started}: {exc.strerror}; give --since", file=sys.stderr)
            return 2
    since = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    rows = read(args.csv)
    plot(rows, since, args.out, args.title)
    figures = long_rss_figures(rows, since)
    for name, fig in figures.items():
        print(name, json.dumps(fig))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
