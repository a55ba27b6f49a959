"""Every benchmark through one runner: ``make bench`` runs them at full size, ``--quick`` at a
size that finishes in seconds (``make test`` smoke-runs it, so a benchmark cannot rot).

    .venv/bin/python -m bench.run_all                 # full size: the figures in docs/benchmarks.md
    .venv/bin/python -m bench.run_all --quick         # every bench, tiny, as a smoke test
    .venv/bin/python -m bench.run_all --only fill,plan

Each bench runs as its own process (``python -m bench.<module> <args>``) so one that fails or
leaks cannot spoil the others; the runner prints each one's output, then a summary table, and
exits non-zero when any failed. The machine is calibrated before and after (``bench.calibrate``:
one fixed reference workload timed in the same run), and a second table puts each target
beside its figure, read from the bench's output, and the figure divided by the calibration, so
that a figure from another machine, or under another load, compares as a ratio.

Benches that need a real Prometheus say so and are run only when
the ``prometheus`` binary is on PATH; benches that replay the openb trace run only when its files
are in the data directory (``$DEFRAG_DATA_DIR``, else ``../shared/data``; ``make data`` fetches
them). Under ``CI=true`` either absence is a failure, never a skip.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from bench import data
from bench.calibrate import calibrate


@dataclass(frozen=True, slots=True)
class Target:
    """One target of a full-size run: the figure is the first group of ``pattern`` in the
    bench's output; met when it is at most ``limit``."""

    label: str
    pattern: str
    limit: float
    unit: str
    """``s``/``ms`` (a time: divided by the calibration too) or ``x``/``%`` (a ratio: as it
    is)."""

    def figure(self, output: str) -> float | None:
        found = re.search(self.pattern, output)
        return float(found.group(1)) if found else None


@dataclass(frozen=True, slots=True)
class Bench:
    name: str
    module: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    needs_prometheus: bool = False
    needs_data: tuple[str, ...] = ()
    """Reference files (relative to the data directory) the quick and full runs read."""
    targets: tuple[Target, ...] = ()
    """Issue 26's targets (full size; a quick run reports no target)."""

    @property
    def simulator(self) -> bool:
        """Replays the openb trace (the heavier half of the smoke run)."""
        return self.name in SIMULATOR_BENCHES


NUMBER = r"([\d.]+)"
SCORING = tuple(
    Target(
        f"schedule() at {n:,} nodes ÷ one numpy pass",
        rf"schedule\(\) at {n} nodes: [\d.]+ ms, {NUMBER}x one pass",
        2.0,
        "x",
    )
    for n in (1000, 10000, 100000)
)
PLAN = (
    Target("plan, openb 90%", rf"\| openb 90% \|(?:[^|]*\|){{5}}\s*{NUMBER}", 2.0, "s"),
    Target("plan, 10,000 nodes", rf"\| synthetic 10000 \|(?:[^|]*\|){{5}}\s*{NUMBER}", 5.0, "s"),
)
CYCLE = (
    Target("cycle, 5,000 nodes / 40,000 pods", rf"best cycle: {NUMBER} s", 3.0, "s"),
    Target("its snapshot", rf"best snapshot: {NUMBER} s", 0.5, "s"),
    Target("peak memory", rf"peak RSS: {NUMBER} MiB", 500.0, "MiB"),
)
EXTENDER = (
    Target("prioritize p99, 5,000 nodes, HTTP", rf"HTTP keep-alive\s+[\d.]+\s+{NUMBER}", 5.0, "ms"),
)
DETECT_1K = (
    Target("detection, 1,000 GPUs, median", rf"detect, median of \d+ \(s\)\s+{NUMBER}", 2.0, "s"),
)
DETECT_10K = (
    Target("detection, 10,000 GPUs, median", rf"detect, median of \d+ \(s\)\s+{NUMBER}", 5.0, "s"),
)
EXTENDER_LOAD = (
    Target("prioritize p99, 4 clients, 1,000 nodes",
           rf"1\. 4 x \d+ prioritize at 1,000 nodes: p50 [\d.]+ ms, p99 {NUMBER} ms", 10.0, "ms"),
)  # fmt: skip
# A large fleet (bench_extender_load --fleet): the node lists kube-scheduler sends at 20,000
# nodes (numFeasibleNodesToFind: 1,000 names), the slower verb's p99; the server's peak RSS.
EXTENDER_FLEET = (
    Target("extender p99, 20,000 nodes, kube-scheduler's lists, 1 client",
           rf"fleet 20000 nodes, kube-scheduler's lists, 1 client\(s\): p99 {NUMBER} ms", 5.0,
           "ms"),
    Target("extender p99, 20,000 nodes, kube-scheduler's lists, 4 clients",
           rf"fleet 20000 nodes, kube-scheduler's lists, 4 client\(s\): p99 {NUMBER} ms", 15.0,
           "ms"),
    Target("extender peak RSS, 20,000 nodes / 200,000 pods",
           rf"fleet 20000 nodes: extender peak RSS {NUMBER} MiB", 1536.0, "MiB"),
)  # fmt: skip
# Pods bound per second with the extender in kube-scheduler's path ÷ without: its cost in %.
SCHED_THROUGHPUT = tuple(
    Target(
        f"extender cost ({mode}), {n:,} nodes, kube-scheduler qps 1000",
        rf"extender cost, {mode}, {n} nodes, qps 1000: (-?[\d.]+) %",
        20.0,
        "%",
    )
    for n in (1000, 5000)
    for mode in ("names", "nodes")
)

SIMULATOR_BENCHES = frozenset(
    {
        "fill",
        "timeline",
        "timeline-speed",
        "defrag-sim",
        "peers",
        "checkpoint",
        "spreading",
        "packing-limit",
    }
)
OPENB = tuple(data.trace_files(["default"]))


BENCHES: tuple[Bench, ...] = (
    Bench("scoring", "bench_scoring", (), ("--pods", "20", "--sizes", "1000"), needs_data=OPENB,
          targets=SCORING),
    Bench("fill", "bench_fill", (), ("--traces", "default", "--policies", "reserve-binpack",
                                     "--seeds", "1", "--jobs", "1"),
          needs_data=(*OPENB, "fgd/allo.csv")),
    Bench("timeline", "bench_timeline", ("--defrag",),
          ("--policies", "reserve-binpack", "--seeds", "1", "--hours", "2", "--warmup", "1",
           "--jobs", "1"), needs_data=OPENB),
    Bench("timeline-speed", "bench_timeline_speed", ("--runs", "3"),
          ("--hours", "1", "--warmup", "0.5", "--runs", "1"), needs_data=OPENB),
    Bench("defrag-sim", "bench_defrag_sim", ("fill", "--seeds", "10"),
          ("timeline", "--seeds", "1", "--policies", "reserve-binpack", "--jobs", "1"),
          needs_data=OPENB),
    Bench("peers", "bench_peers", ("--seeds", "3", "--jobs", "2"),
          ("--policies", "least-allocated",
           "--defragmenters", "none,defrag-extender,kai-consolidation",
           "--seeds", "1", "--hours", "2", "--warmup", "1", "--jobs", "1"), needs_data=OPENB),
    Bench("checkpoint", "bench_checkpoint", ("--jobs", "2"),
          ("--shares", "1.0", "--seeds", "1", "--no-held-out", "--hours", "2", "--warmup", "1",
           "--jobs", "1"), needs_data=OPENB),
    Bench("spreading", "bench_spreading", ("--jobs", "2"),
          ("--traces", "default", "--schedulers", "least-allocated", "--seeds", "1",
           "--hours", "1", "--warmup", "1", "--every", "1"), needs_data=OPENB),
    Bench("packing-limit", "bench_packing_limit", (),
          ("--traces", "default", "--seeds", "1", "--jobs", "1", "--no-online"),
          needs_data=OPENB),
    Bench("plan", "bench_plan", (), ("--only", "synthetic", "--nodes", "200"),
          targets=PLAN),
    Bench("exact-gap", "bench_exact_gap", (), ("--cases", "2")),
    Bench("cycle", "bench_cycle", ("--repeat", "3"),
          ("--nodes", "50", "--pods", "300", "--repeat", "1"),
          targets=CYCLE),
    Bench("kube", "bench_kube", ("--plan",), ("--nodes", "50", "--pods", "300")),
    Bench("extender", "bench_extender", ("--nodes", "5000"), ("--nodes", "50", "--calls", "50"),
          targets=EXTENDER),
    Bench("watch", "bench_watch", (), ("--nodes", "50", "--pods", "300", "--repeat", "1")),
    Bench("extender-load", "bench_extender_load", (),
          ("--calls", "50", "--clients", "2", "--skip-maximal"),
          targets=EXTENDER_LOAD),
    Bench("extender-fleet", "bench_extender_load", ("--fleet", "1000,5000,20000"),
          ("--fleet", "60,120", "--fleet-calls", "20"), targets=EXTENDER_FLEET),
    # Needs the control plane binaries (KUBEBUILDER_ASSETS); says "skipped" and exits 0 without.
    Bench("controlplane", "bench_controlplane", ("drain-to-bind", "--runs", "20"),
          ("drain-to-bind", "--runs", "1")),
    # The real kube-scheduler with and without the extender (KUBEBUILDER_ASSETS; "skipped"
    # without, a failure under CI=true).
    Bench("sched-throughput", "bench_sched_throughput",
          ("--nodes", "1000,5000", "--pods", "2000", "--runs", "3", "--qps", "shipped,1000"),
          ("--nodes", "20", "--pods", "40", "--runs", "1", "--window", "20"),
          targets=SCHED_THROUGHPUT),
    Bench("detect", "bench_detect", ("--runs", "5"),
          ("--gpus", "20", "--hours", "2", "--runs", "1"), needs_prometheus=True,
          targets=DETECT_1K),
    Bench("detect-10k", "bench_detect", ("--gpus", "10000", "--runs", "3"),
          ("--gpus", "20", "--hours", "2", "--runs", "1"), needs_prometheus=True,
          targets=DETECT_10K),
    Bench("leak-corpus", "bench_leak_corpus", ("--per-cell", "10"),
          ("--per-cell", "1", "--mix", "20", "--noises", "0", "400")),
    Bench("starvation-corpus", "bench_starvation_corpus", ("--seeds", "100-119"),
          ("--seeds", "0", "--pending", "10"), needs_prometheus=True),
    # A settings sweep on a loopback distributed cluster against the local runner (the sweep extra).
    Bench("sweep", "bench_sweep", (), ("--runs", "9", "--workers", "1")),
    # Held-out seeds (tuned on 1-3): docs/benchmarks.md, "Leaks on every workload shape".
    Bench("leak-shapes", "bench_leak_shapes",
          ("--seeds", "101,102,103", "--per-family", "10", "--moving-per-family", "6"),
          ("--seeds", "1", "--per-family", "1", "--moving-per-family", "1"),
          needs_prometheus=True),
    # The chaos soak on the real control plane (KUBEBUILDER_ASSETS; "skipped" without).
    Bench("soak", "bench_soak", ("--seed", "1", "--cycles", "1000"),
          ("--seed", "1", "--cycles", "40", "--nodes", "6", "--drain-s", "15")),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    bench: Bench
    status: str
    seconds: float
    output: str = ""


def run(bench: Bench, quick: bool) -> Outcome:
    if bench.needs_prometheus and shutil.which("prometheus") is None:
        if os.environ.get("CI") == "true":
            print(f"== {bench.name}: prometheus is not installed (CI=true: a failure)", flush=True)
            return Outcome(bench, "failed: no prometheus", 0.0)
        print(f"== {bench.name}: skipped, prometheus is not installed", flush=True)
        return Outcome(bench, "skipped (no prometheus)", 0.0)
    absent = data.missing(data.DEFAULT, bench.needs_data)
    if absent:
        message = data.missing_message(data.DEFAULT, absent)
        if os.environ.get("CI") == "true":
            print(f"== {bench.name}: {message} (CI=true: a failure)", flush=True)
            return Outcome(bench, f"failed: {message}", 0.0)
        print(f"== {bench.name}: skipped, {message}", flush=True)
        return Outcome(bench, f"skipped: {message}", 0.0)
    argv = [sys.executable, "-m", f"bench.{bench.module}", *(bench.quick if quick else bench.full)]
    print(f"== {bench.name}: {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    lines: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # shown as it comes, kept for the targets table
            print(line, end="", flush=True)
            lines.append(line)
    took = time.monotonic() - started
    status = "ok" if proc.returncode == 0 else f"failed ({proc.returncode})"
    return Outcome(bench, status, took, "".join(lines))


def targets_table(outcomes: list[Outcome], cal_s: float) -> list[str]:
    """Each target beside its figure, and the figure ÷ the calibration (times only)."""
    rows = [
        f"\ncalibration (bench.calibrate, median of 5, before and after): {cal_s:.3f} s",
        "| bench | figure | value | target | met | value ÷ calibration |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        for t in o.bench.targets:
            value = t.figure(o.output)
            if value is None:
                rows.append(f"| {o.bench.name} | {t.label} | not found | ≤ {t.limit:g} {t.unit} |")
                continue
            seconds = {"s": value, "ms": value / 1e3}.get(t.unit)
            ratio = f"{seconds / cal_s:.2f}" if seconds is not None else "—"
            met = "yes" if value <= t.limit else "no"
            rows.append(
                f"| {o.bench.name} | {t.label} | {value:g} {t.unit} | ≤ {t.limit:g} {t.unit} "
                f"| {met} | {ratio} |"
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of each bench")
    ap.add_argument("--only", default="", help="comma-separated bench names")
    args = ap.parse_args(argv)
    names = {n for n in args.only.split(",") if n}
    known = {b.name for b in BENCHES}
    if names - known:
        ap.error(f"unknown bench(es) {', '.join(sorted(names - known))}; known: {', '.join(known)}")
    chosen = [b for b in BENCHES if not names or b.name in names]
    runs = 1 if args.quick else 5
    before = calibrate(runs)
    print(f"calibration: {before:.3f} s (bench.calibrate, median of {runs})", flush=True)
    outcomes = [run(b, args.quick) for b in chosen]
    after = calibrate(runs)
    print("\n| bench | command | result | seconds |\n|---|---|---|---|")
    for o in outcomes:
        used = o.bench.quick if args.quick else o.bench.full
        cmd = " ".join((f"bench.{o.bench.module}", *used))
        print(f"| {o.bench.name} | `{cmd}` | {o.status} | {o.seconds:.1f} |")
    if not args.quick:
        for row in targets_table(outcomes, (before + after) / 2):
            print(row)
        print(f"(calibration before {before:.3f} s, after {after:.3f} s; load {os.getloadavg()})")
    return 0 if all(o.status == "ok" or o.status.startswith("skipped") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
