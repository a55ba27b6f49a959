"""defrag's own CPU in a daemon's later detection, and where it goes.

    python -m bench.profile_detect_later DATA [--profile OUT] [--runs 3] [--sequential]

``DATA`` is a TSDB made by ``bench_detect --recorded --data DATA`` (the recorded series, and the
prefilter's verdict). Per run: a detection five minutes before the TSDB's end, kept in a
:class:`~defrag.detectors.range_memory.RangeMemory` as a daemon's cycle keeps it, then the later
one at the end, timed in CPU and wall time; the last run's later detection is profiled with
cProfile (its stats written to ``OUT``, the top by own time printed). ``--sequential`` asks the
queries one after another, so the profile sees them on the main thread. The profiler's own cost
overstates functions called tens of thousands of times; the unprofiled runs are the figure.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from defrag.adapters import prometheus
from defrag.detection import run_detection
from defrag.detectors.range_memory import RangeMemory
from defrag.ports import Query, Sample, ask
from defrag.rules import load_rules
from defrag.scoring.profile import ScoringProfile
from tests.support.prometheus import END, serve_tsdb

ROOT = Path(__file__).resolve().parent.parent


def _one_by_one(self: prometheus.PrometheusSource, queries: Sequence[Query]) -> list[list[Sample]]:
    return [ask(self, q) for q in queries]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sequential", action="store_true")
    args = parser.parse_args(argv)
    if not (args.data / "bench-detect.txt").exists():
        print(f"error: {args.data}: no TSDB of bench_detect --recorded --data there")
        return 2
    if args.sequential:
        prometheus.PrometheusSource.ask_all = _one_by_one  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        leak = (ROOT / "rules/leak.yaml").read_text()
        (tmp / "leak.yaml").write_text(
            leak.replace("prefilter:", "recorded: auto\n    prefilter:", 1)
        )
        rules = load_rules([tmp / "leak.yaml", ROOT / "rules/idle.yaml"])
        with serve_tsdb(args.data, tmp, query_timeout="10m") as server:
            source = prometheus.PrometheusSource(server.url, retries=0, timeout_s=600)
            profile = ScoringProfile.default()
            run_detection(rules, source, None, END, profile=profile)  # the server's caches
            profiler = cProfile.Profile(time.process_time)
            for run in range(args.runs):
                memory = RangeMemory()
                before = END - timedelta(minutes=5)
                run_detection(rules, source, None, before, profile=profile, memory=memory)
                last = run == args.runs - 1 and args.profile is not None
                c0, t0 = time.process_time(), time.perf_counter()
                if last:
                    profiler.enable()
                report = run_detection(rules, source, None, END, profile=profile, memory=memory)
                if last:
                    profiler.disable()
                print(
                    f"later detection: {time.process_time() - c0:.3f} CPU-s, "
                    f"{time.perf_counter() - t0:.3f} s wall, {len(report.findings)} findings"
                    + (" (profiled)" if last else ""),
                    flush=True,
                )
            if args.profile is not None:
                profiler.dump_stats(args.profile)
                pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
