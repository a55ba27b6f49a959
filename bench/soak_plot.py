"""The memory soak's RSS curve: ``rss.csv`` (``bench/bench_soak.py --memory --out DIR``) drawn per
process, with the least-squares line over the samples after the warm-up.

    .venv/bin/python -m bench.soak_plot DIR/rss.csv --since 2026-12-04T13:48:48 \\
        --out docs/img/soak-rss.png [--json DIR/rss-figures.json]

With ``--heap OUT.png`` also the probes' heap over time (``objects-*.jsonl`` beside ``rss.csv``,
``bench/soak_probe.py``): per process, the anonymous RSS, what pymalloc's arenas span and the
part of them in use, and what glibc holds in use; a line per process says how each moved from
the first probe after the warm-up to the last.

With ``--peaks`` also each new high of a process's allocated blocks after the warm-up
(``peaks-*.jsonl``, ``bench/soak_probe.py``) and the threads that were busy then.

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
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

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
        _framed(axis, "RSS (MiB)", "upper left")
    top.set_title(title, fontsize=10)
    bottom.set_xlabel(X_LABEL)
    _save(fig, out)


X_LABEL = "minutes since the chaos began (dashed: end of the warm-up)"


def _framed(axis: Any, ylabel: str, legend_at: str) -> None:
    """The warm-up's end, the label, the grid and the legend of one panel."""
    axis.axvline(WARMUP_S / 60, color="grey", linestyle="--", linewidth=1)
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=8, loc=legend_at)


def _save(fig: Any, out: Path) -> None:
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


HEAP_SERIES = (
    ("RSS (anonymous)", lambda line: line.get("resident_kb", {}).get("anon")),
    ("pymalloc arenas", lambda line: (line.get("pymalloc_kb") or {}).get("arenas_kb")),
    ("pymalloc in use", lambda line: (line.get("pymalloc_kb") or {}).get("in_use_kb")),
    ("glibc in use", lambda line: (line.get("glibc_kb") or {}).get("in_use") or None),
)


def read_probes(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Each probed process's lines (``objects-<process>.jsonl``), in time order."""
    out = {}
    for path in sorted(folder.glob("objects-*.jsonl")):
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        out[path.stem.removeprefix("objects-")] = sorted(lines, key=lambda x: x["time"])
    return out


def heap_moves(probes: dict[str, list[dict[str, Any]]], since: float) -> dict[str, dict[str, int]]:
    """Per process, each heap series' change in kB from the first probe after the warm-up to
    the last (series a process does not have, e.g. pymalloc's under PYTHONMALLOC=malloc, left
    out)."""
    out: dict[str, dict[str, int]] = {}
    for name, lines in probes.items():
        after = [x for x in lines if x["time"] - since >= WARMUP_S]
        if len(after) < 2:
            continue
        moved = {}
        for label, get in HEAP_SERIES:
            a, b = get(after[0]), get(after[-1])
            if a is not None and b is not None:
                moved[label] = int(b - a)
        out[name] = moved
    return out


def peak_bursts(folder: Path, since: float) -> dict[str, list[dict[str, Any]]]:
    """Per process (``peaks-<process>.jsonl``, ``soak_probe.watch_peaks``), each new high of
    its allocated blocks after the warm-up: the minute, the blocks, and the threads that were
    not where they mostly are (a thread's most frequent stack over the file is its wait) —
    what was running when the high was raised."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("peaks-*.jsonl")):
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        stacks: dict[str, Counter[tuple[str, ...]]] = {}
        for line in lines:
            for thread, stack in line["threads"].items():
                stacks.setdefault(thread, Counter())[tuple(stack)] += 1
        usual = {thread: seen.most_common(1)[0][0] for thread, seen in stacks.items()}
        out[path.stem.removeprefix("peaks-")] = [
            {
                "minute": round((line["time"] - since) / 60, 1),
                "blocks": line["blocks"],
                "busy": {t: s for t, s in line["threads"].items() if tuple(s) != usual[t]},
            }
            for line in lines
            if line["time"] - since >= WARMUP_S
        ]
    return out


def plot_heap(probes: dict[str, list[dict[str, Any]]], since: float, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(probes)
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 3 * len(names)), sharex=True)
    for axis, name in zip([axes] if len(names) == 1 else axes, names, strict=True):
        for label, get in HEAP_SERIES:
            minutes, mib = [], []
            for x in probes[name]:
                kb = get(x)
                if kb is not None:
                    minutes.append((x["time"] - since) / 60)
                    mib.append(kb / 1024)
            if mib:
                axis.plot(minutes, mib, marker=".", label=label)
        _framed(axis, f"{name}\n(MiB)", "lower right")
    fig.suptitle(title, fontsize=10)
    fig.supxlabel(X_LABEL)
    _save(fig, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument(
        "--since", help="ISO time the chaos began (UTC); default: the chaos-started file by CSV"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--title", default="defrag memory soak: RSS per process")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--heap", type=Path, help="also plot the probes' heap to this file")
    parser.add_argument(
        "--peaks",
        action="store_true",
        help="also print each new high of the allocated blocks after the warm-up, and what ran",
    )
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
    if args.heap:
        probes = read_probes(args.csv.parent)
        plot_heap(probes, since, args.heap, args.title.replace("RSS", "heap"))
        for name, moved in heap_moves(probes, since).items():
            said = ", ".join(f"{label} {kb:+,} kB" for label, kb in moved.items())
            print(f"{name} heap after the warm-up: {said}")
    if args.peaks:
        for name, highs in peak_bursts(args.csv.parent, since).items():
            print(f"{name}: {len(highs)} new highs of the allocated blocks after the warm-up")
            for high in highs:
                print(f"  minute {high['minute']}: {high['blocks']:,} blocks")
                for thread, stack in high["busy"].items():
                    print(f"    {thread}: {' < '.join(stack)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
