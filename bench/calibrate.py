"""The machine's calibration: one fixed reference workload, timed, so that a benchmark figure
from another machine (or from this one under another load) compares as a ratio.

The workload mixes what defrag's hot paths do — interpreted Python over small objects (dicts,
tuples, sorting) and numpy reductions over an ``N × 8`` integer array — in fixed amounts, with a
fixed seed; it does no I/O and uses one thread. ``make bench`` times it before and after the
benchmarks and prints each figure divided by the calibration beside it.

    .venv/bin/python -m bench.calibrate [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def workload() -> int:
    """The fixed work: about 0.4 s on an idle core of the 2-core development machine. Returns a
    checksum (so that nothing is optimised away)."""
    rng = np.random.default_rng(20261202)
    free = rng.integers(0, 1001, size=(20_000, 8), dtype=np.int64)
    check = 0
    for m in (100, 250, 500, 1000):  # numpy: count and sum per node, as filters and FGD do
        for _ in range(15):
            ge = free >= m
            check += int(ge.sum(axis=1).max()) + int(np.where(ge, 0, free).sum(axis=1).max())
    table: dict[str, tuple[int, int]] = {}
    for i in range(60_000):  # Python: keyed objects, as the planner and the converters do
        key = f"ns-{i % 97}/pod-{i}"
        table[key] = (i * 7919 % 1009, i % 8)
    ranked = sorted(table.items(), key=lambda kv: (kv[1][0], kv[0]))
    check += sum(v[0] for _, v in ranked[:1000]) + len(ranked)
    return check


def calibrate(runs: int = 5) -> float:
    """The workload's median wall time over ``runs`` runs (after one warm-up), in seconds."""
    workload()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        workload()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    cal = calibrate(args.runs)
    print(f"calibration: {cal:.3f} s")


if __name__ == "__main__":
    main()
