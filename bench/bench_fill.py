"""The FGD paper's comparison: arrival-only fill of the openb cluster, traces × policies × seeds.

    .venv/bin/python -m bench.bench_fill                      # 5 traces × 9 policies × 10 seeds
    .venv/bin/python -m bench.bench_fill --traces default --seeds 3 --jobs 2

Prints (and with ``--out`` writes) a markdown table per trace: our median allocation at 100%
arrived GPU demand beside the paper's (``../shared/data/fgd/allo.csv``), the difference, and
whether the policies come in the paper's order; then seconds per fill and peak memory.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import cache
from pathlib import Path

from bench import data
from defrag.model.resources import Node, Pod
from defrag.scoring.policies import POLICY_NAMES
from defrag.sim.fill import PAPER_SEEDS, run_fill
from defrag.sim.report import PAPER_POLICY_NAMES, markdown_table, paper_medians
from defrag.sim.trace import load_nodes, load_pods

DATA = data.DEFAULT  # $DEFRAG_DATA_DIR, else ../shared/data (read by the worker processes too)
TRACES = ("default", "gpushare40", "multigpu20", "gpuspec10", "cpu050")
PAPER_ORDER = tuple(PAPER_POLICY_NAMES.values())  # random < dot-product < … < fgd


@cache
def _nodes() -> tuple[Node, ...]:
    return load_nodes(DATA / "openb" / "openb_node_list_gpu_node.csv")


@cache
def _pods(trace: str) -> tuple[Pod, ...]:
    return load_pods(DATA / "openb" / f"openb_pod_list_{trace}.csv").pods


def _one(trace: str, policy: str, seed: int) -> dict[str, float | int | str]:
    run = run_fill(_nodes(), _pods(trace), policy, seed)
    return {
        "trace": trace,
        "policy": policy,
        "seed": seed,
        "allocation": run.allocation_at_100,
        "frag": run.frag_at_100,
        "failed": run.failed_at_100,
        "seconds": run.seconds,
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--policies", default=",".join(POLICY_NAMES))
    ap.add_argument("--seeds", type=int, default=len(PAPER_SEEDS), help="seeds from 42")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    args = ap.parse_args(argv)
    traces = [t for t in args.traces.split(",") if t]
    policies = [p for p in args.policies.split(",") if p]
    seeds = list(range(42, 42 + args.seeds))
    data.require(DATA, [*data.trace_files(traces), "fgd/allo.csv"])
    paper = paper_medians(DATA / "fgd" / "allo.csv")
    jobs = [(t, p, s) for t in traces for p in policies for s in seeds]
    # Slow runs first so the pool stays busy to the end.
    jobs.sort(key=lambda j: (j[1] != "fgd", j))
    started = time.perf_counter()
    results: list[dict[str, float | int | str]] = []
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(_one, *j) for j in jobs]
        for done, future in enumerate(as_completed(futures), 1):
            results.append(future.result())
            r = results[-1]
            print(
                f"[{done}/{len(jobs)}] {r['trace']} {r['policy']} seed {r['seed']}: "
                f"{float(r['allocation']):.2f}% in {float(r['seconds']):.1f}s",
                file=sys.stderr,
                flush=True,
            )
    wall = time.perf_counter() - started
    text = render(results, traces, policies, paper, args, wall)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


def render(
    results: list[dict[str, float | int | str]],
    traces: list[str],
    policies: list[str],
    paper: dict[tuple[str, str], float],
    args: argparse.Namespace,
    wall: float,
) -> str:
    mode = "defrag's policies"
    out = [
        "Arrival-only fill, openb GPU nodes (1,213 nodes, 6,212 GPUs), "
        f"{args.seeds} seeds from 42, {mode}. "
        "Median GPU allocation (%) at 100% arrived GPU demand.\n\n",
        f"Command: `.venv/bin/python -m bench.bench_fill --traces {','.join(traces)} "
        f"--policies {','.join(policies)} --seeds {args.seeds} --jobs {args.jobs}"
        "`\n",
    ]
    for trace in traces:
        med = {
            p: statistics.median(
                float(r["allocation"]) for r in results if r["trace"] == trace and r["policy"] == p
            )
            for p in policies
        }
        rows = []
        for p in policies:
            ref = paper.get((trace, p))
            diff = "" if ref is None else f"{med[p] - ref:+.2f}"
            ok = "" if ref is None else ("yes" if abs(med[p] - ref) <= 1.0 else "**no**")
            rows.append((p, f"{med[p]:.2f}", "" if ref is None else f"{ref:.2f}", diff, ok))
        ours = [p for p in sorted(med, key=med.__getitem__) if p in PAPER_ORDER]
        theirs = [p for p in PAPER_ORDER if p in med]
        order = "same as the paper" if ours == theirs else f"differs: {' < '.join(ours)}"
        out.append(f"\n### {trace}\n\nOrder of the paper's six policies: {order}.\n\n")
        out.append(markdown_table(("policy", "ours", "paper", "Δ pp", "within 1 pp"), rows))
    timing = []
    timed = "default" if "default" in traces else traces[0]
    for p in policies:
        secs = [float(r["seconds"]) for r in results if r["policy"] == p and r["trace"] == timed]
        if secs:
            timing.append((p, f"{statistics.fmean(secs):.1f}", f"{max(secs):.1f}"))
    rss = max(float(r["maxrss_mib"]) for r in results)
    out.append(f"\n### Time per fill ({timed} trace) and memory\n\n")
    out.append(markdown_table(("policy", "mean s", "max s"), timing))
    out.append(
        f"\nPeak memory of a worker process: {rss:.0f} MiB. "
        f"Wall time: {wall / 60:.1f} min with {args.jobs} processes.\n"
    )
    return "".join(out)


if __name__ == "__main__":
    sys.exit(main())
