"""Every benchmark through one runner: ``make bench`` runs them at full size, ``--quick`` at a
size that finishes in seconds (``make test`` smoke-runs it, so a benchmark cannot rot).

    .venv/bin/python -m bench.run_all                 # full size: the figures in docs/benchmarks.md
    .venv/bin/python -m bench.run_all --quick         # every bench, tiny, as a smoke test
    .venv/bin/python -m bench.run_all --only fill,plan

Each bench runs as its own process (``python -m bench.<module> <args>``) so one that fails or
leaks cannot spoil the others; the runner prints each one's output, then a summary table, and
exits non-zero when any failed. Benches that need a real Prometheus say so and are run only when
the ``prometheus`` binary is on PATH; benches that replay the openb trace run only when its files
are in the data directory (``$DEFRAG_DATA_DIR``, else ``../shared/data``; ``make data`` fetches
them). Under ``CI=true`` either absence is a failure, never a skip.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from bench import data


@dataclass(frozen=True, slots=True)
class Bench:
    name: str
    module: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    needs_prometheus: bool = False
    needs_data: tuple[str, ...] = ()
    """Reference files (relative to the data directory) the quick and full runs read."""

    @property
    def simulator(self) -> bool:
        """Replays the openb trace (the heavier half of the smoke run)."""
        return self.name in SIMULATOR_BENCHES


SIMULATOR_BENCHES = frozenset(
    {"fill", "timeline", "defrag-sim", "peers", "checkpoint", "packing-limit"}
)
OPENB = tuple(data.trace_files(["default"]))


BENCHES: tuple[Bench, ...] = (
    Bench("scoring", "bench_scoring", (), ("--pods", "20"), needs_data=OPENB),
    Bench("fill", "bench_fill", (), ("--traces", "default", "--policies", "reserve-binpack",
                                     "--seeds", "1", "--jobs", "1"),
          needs_data=(*OPENB, "fgd/allo.csv")),
    Bench("timeline", "bench_timeline", ("--defrag",),
          ("--policies", "reserve-binpack", "--seeds", "1", "--hours", "2", "--warmup", "1",
           "--jobs", "1"), needs_data=OPENB),
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
    Bench("packing-limit", "bench_packing_limit", (),
          ("--traces", "default", "--seeds", "1", "--jobs", "1", "--no-online"),
          needs_data=OPENB),
    Bench("plan", "bench_plan", (), ("--only", "synthetic", "--nodes", "200")),
    Bench("exact-gap", "bench_exact_gap", (), ("--cases", "2")),
    Bench("cycle", "bench_cycle", ("--repeat", "3"),
          ("--nodes", "50", "--pods", "300", "--repeat", "1")),
    Bench("kube", "bench_kube", ("--plan",), ("--nodes", "50", "--pods", "300")),
    Bench("extender", "bench_extender", (), ("--nodes", "50", "--calls", "50")),
    Bench("watch", "bench_watch", (), ("--nodes", "50", "--pods", "300", "--repeat", "1")),
    Bench("extender-load", "bench_extender_load", (),
          ("--calls", "50", "--clients", "2", "--skip-maximal")),
    # Needs the control plane binaries (KUBEBUILDER_ASSETS); says "skipped" and exits 0 without.
    Bench("controlplane", "bench_controlplane", ("drain-to-bind", "--runs", "20"),
          ("drain-to-bind", "--runs", "1")),
    Bench("detect", "bench_detect", ("--runs", "5"),
          ("--gpus", "20", "--hours", "2", "--runs", "1"), needs_prometheus=True),
    Bench("leak-corpus", "bench_leak_corpus", ("--per-cell", "10"),
          ("--per-cell", "1", "--mix", "20", "--noises", "0", "400")),
    # The chaos soak on the real control plane (KUBEBUILDER_ASSETS; "skipped" without).
    Bench("soak", "bench_soak", ("--seed", "1", "--cycles", "1000"),
          ("--seed", "1", "--cycles", "40", "--nodes", "6", "--drain-s", "15")),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    bench: Bench
    status: str
    seconds: float


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
    proc = subprocess.run(argv, check=False)
    took = time.monotonic() - started
    return Outcome(bench, "ok" if proc.returncode == 0 else f"failed ({proc.returncode})", took)


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
    outcomes = [run(b, args.quick) for b in chosen]
    print("\n| bench | command | result | seconds |\n|---|---|---|---|")
    for o in outcomes:
        used = o.bench.quick if args.quick else o.bench.full
        cmd = " ".join((f"bench.{o.bench.module}", *used))
        print(f"| {o.bench.name} | `{cmd}` | {o.status} | {o.seconds:.1f} |")
    return 0 if all(o.status == "ok" or o.status.startswith("skipped") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
