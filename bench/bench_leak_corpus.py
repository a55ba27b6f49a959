"""The leak detector on the labelled corpus (bench/leak_corpus.py): recall, false positives,
hours to the first finding and ETA error, per family and noise level; and the false-positive
rate on a 1,000-history random mix of non-leaks.

Each history is evaluated every 30 minutes from 3 h after its start (half the 6 h lookback) to
its end, as the daemon would. A leak is *recalled* when the evaluation at the end of its history
flags it; *hours to first finding* runs from the leak's start to the first evaluation that
flags it; the *ETA error* is |predicted − true exhaustion| / (true exhaustion − end), at the end.
A non-leak is a *false positive* when any evaluation flags it.

    nice -n 15 .venv/bin/python -m bench.bench_leak_corpus [--per-cell 8] [--seed 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from bench.leak_corpus import LEAK_FAMILIES, NOISES, Case, corpus, random_mix
from defrag.detectors.leak.core import LeakParams, assess_leak

HOUR = 3600.0
PARAMS = LeakParams()


@dataclass(frozen=True, slots=True)
class Outcome:
    case: Case
    flagged_at_end: bool
    first_flag: float | None
    eta_error: float | None
    any_flag: bool


def evaluate(case: Case, params: LeakParams = PARAMS, every_s: float = 1800.0) -> Outcome:
    t = case.series.times
    end = float(t[-1])
    first = float(t[0]) + params.min_coverage * params.lookback_s
    evals = np.arange(end, first - 1e-6, -every_s)[::-1]
    first_flag = None
    final = None
    for at in evals:
        verdict = assess_leak(case.series, params, datetime.fromtimestamp(at, UTC))
        if verdict.leaking and first_flag is None:
            first_flag = float(at)
        final = verdict
    eta_error = None
    truth = case.truth
    if final is not None and final.leaking and truth.exhaust_at and final.exhaust_at:
        eta_error = abs(final.exhaust_at - truth.exhaust_at) / (truth.exhaust_at - end)
    flagged = bool(final is not None and final.leaking)
    return Outcome(case, flagged, first_flag, eta_error, first_flag is not None)


def table(outcomes: list[Outcome]) -> list[str]:
    cells: dict[tuple[str, float, float], list[Outcome]] = defaultdict(list)
    for o in outcomes:
        tr = o.case.truth
        cells[(tr.family, tr.noise_mib, tr.rate_mib_per_h)].append(o)
    lines = [
        "| family | σ MiB | rate MiB/h | n | recall | FP | h to first finding (median) "
        "| ETA error (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (family, noise, rate), group in sorted(
        cells.items(), key=lambda kv: (kv[0][0] not in LEAK_FAMILIES, kv[0])
    ):
        leak = group[0].case.truth.leak
        n = len(group)
        if leak:
            recall = sum(o.flagged_at_end for o in group) / n
            firsts = [
                (o.first_flag - o.case.truth.leak_start) / HOUR
                for o in group
                if o.first_flag is not None
            ]
            etas = [o.eta_error for o in group if o.eta_error is not None]
            hf = f"{statistics.median(firsts):.1f}" if firsts else "–"
            eta = f"{100 * statistics.median(etas):.0f}%" if etas else "–"
            lines.append(
                f"| {family} | {noise:g} | {rate:g} | {n} | {recall:.2f} | – | {hf} | {eta} |"
            )
        else:
            fp = sum(o.any_flag for o in group)
            lines.append(f"| {family} | {noise:g} | – | {n} | – | {fp} | – | – |")
    return lines


def pivot(outcomes: list[Outcome]) -> list[str]:
    """The same figures as two compact tables: leaks by (family, rate) × noise, each cell
    ``recall · hours to first finding · ETA error`` (medians), and non-leaks by family × noise,
    each cell ``false positives / histories``."""
    cells: dict[tuple[str, float, float], list[Outcome]] = defaultdict(list)
    for o in outcomes:
        tr = o.case.truth
        cells[(tr.family, tr.rate_mib_per_h, tr.noise_mib)].append(o)
    noises = sorted({k[2] for k in cells})
    head = " | ".join(f"σ {n:g}" for n in noises)
    lines = [f"| leak family | MiB/h | {head} |", "|---|---|" + "---|" * len(noises)]
    rows = sorted(
        {(f, r) for f, r, _ in cells if r > 0}, key=lambda fr: (LEAK_FAMILIES.index(fr[0]), fr[1])
    )
    for family, rate in rows:
        parts = []
        for n in noises:
            group = cells.get((family, rate, n), [])
            if not group:
                parts.append("–")
                continue
            recall = sum(o.flagged_at_end for o in group) / len(group)
            firsts = [
                (o.first_flag - o.case.truth.leak_start) / HOUR
                for o in group
                if o.first_flag is not None
            ]
            etas = [o.eta_error for o in group if o.eta_error is not None]
            hf = f"{statistics.median(firsts):.1f} h" if firsts else "–"
            eta = f"{100 * statistics.median(etas):.0f}%" if etas else "–"
            parts.append(f"{recall:.2f} · {hf} · {eta}")
        lines.append(f"| {family} | {rate:g} | " + " | ".join(parts) + " |")
    lines += ["", f"| non-leak family | {head} |", "|---|" + "---|" * len(noises)]
    families = sorted({f for f, r, _ in cells if r == 0})
    for family in families:
        parts = []
        for n in noises:
            group = cells.get((family, 0.0, n), [])
            parts.append(f"{sum(o.any_flag for o in group)}/{len(group)}" if group else "–")
        lines.append(f"| {family} | " + " | ".join(parts) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-cell", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mix", type=int, default=1000)
    parser.add_argument("--noises", type=float, nargs="*", default=list(NOISES))
    parser.add_argument("--long", action="store_true", help="one row per cell")
    args = parser.parse_args()
    t0 = time.perf_counter()
    cases = corpus(seed=args.seed, per_cell=args.per_cell, noises=args.noises)
    outcomes = [evaluate(c) for c in cases]
    elapsed = time.perf_counter() - t0
    for line in table(outcomes) if args.long else pivot(outcomes):
        print(line)
    target = [
        o
        for o in outcomes
        if o.case.truth.leak
        and o.case.truth.rate_mib_per_h >= 512
        and o.case.truth.noise_mib <= 600
    ]
    etas = [o.eta_error for o in outcomes if o.eta_error is not None]
    non = [o for o in outcomes if not o.case.truth.leak and o.case.truth.noise_mib <= 600]
    print()
    print(
        f"recall, leaks ≥ 512 MiB/h with σ ≤ 600: {np.mean([o.flagged_at_end for o in target]):.3f}"
        f" ({sum(o.flagged_at_end for o in target)}/{len(target)})"
    )
    print(
        f"false positives, non-leak families with σ ≤ 600: {sum(o.any_flag for o in non)}"
        f"/{len(non)}"
    )
    print(f"median ETA error, all flagged leaks: {100 * statistics.median(etas):.1f}%")
    mix = random_mix(args.mix, seed=args.seed + 1)
    t1 = time.perf_counter()
    mix_fp = sum(evaluate(c).any_flag for c in mix)
    print(
        f"random mix of {len(mix)} non-leaks (σ ~ U(0, 800)): {mix_fp} flagged "
        f"({100 * mix_fp / len(mix):.1f}%)"
    )
    print(
        f"corpus: {len(cases)} histories evaluated in {elapsed:.1f} s; mix in "
        f"{time.perf_counter() - t1:.1f} s"
    )


if __name__ == "__main__":
    main()
