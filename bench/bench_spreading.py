"""Does the spreading detector tell a spreading scheduler from a packing one? (issue 25, item 5)

Timeline runs (defrag.sim.timeline: Poisson arrivals with the trace's shapes, log-normal run
times, no defragmenter) under a scheduler that is known: ``least-allocated`` (spreads: the
detector must fire), ``most-allocated`` and ``reserve-binpack`` (defrag's score; both pack: it
must not). Every ``--every`` simulated hours from the warm-up on (3 h: the run starts in steady
state, and 3 h of arrivals are more than the rule's 300 placements), the simulator's state becomes a
cluster whose bound pods carry their bind time, and the shipped rule (rules/spreading.yaml) is
run on it, with the scoring profile of the daemon's default settings. Each cell counts the
snapshots that produced the finding, and the evidence's means.

    .venv/bin/python -m bench.bench_spreading                         # every trace, seeds 42-43
    .venv/bin/python -m bench.bench_spreading --first-seed 45 --seeds 1   # the held-out seed
    .venv/bin/python -m bench.bench_spreading --emulated 5000:40000   # the detector's time alone

Prints (``--out``: writes) a markdown table. ``--emulated NODES:PODS`` instead times the shipped
rule three times on the cycle bench's emulated cluster (``bench.bench_kube.cluster_objects``,
evaluated an hour after its pods' creation so that the window is full).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

from bench import data
from bench.bench_packing_limit import load_trace
from defrag.detectors.spreading.core import PACKING, SpreadingParams, detect_spreading
from defrag.detectors.spreading.registration import SPREADING
from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.model.utc import UTC
from defrag.rules import load_rules
from defrag.scoring.profile import ProfileConfig
from defrag.sim.moves import Move
from defrag.sim.state import SimState
from defrag.sim.timeline import TimelineConfig, run_timeline

TRACES = ("default", "cpu050", "gpushare40", "gpuspec10", "multigpu20")
SCHEDULERS = ("least-allocated", "most-allocated", "reserve-binpack", "random")
SPREADS = {"least-allocated"}
PACKS = {"most-allocated", "reserve-binpack"}
"""The schedulers under which the packing finding must be reported (random: neither)."""
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Observation:
    fired: bool
    enough: bool
    informative: int
    spread_share: float
    pack_share: float
    excess_stranded: int
    seconds: float
    packs: bool = False
    """The packing finding was reported (make-room's patience reads it)."""


def shipped_params() -> SpreadingParams:
    """The settings of the shipped rule (rules/spreading.yaml)."""
    for loaded in load_rules().rules:
        if loaded.rule.detector == SPREADING.name:
            params: SpreadingParams = SPREADING.settings_of(loaded.rule)
            return params
    raise SystemExit("bench_spreading: rules/spreading.yaml has no spreading rule")


def snapshot(state: SimState) -> Cluster:
    """The simulator's state as a cluster: running pods bound (bind time = their start),
    waiting pods pending."""
    return state.to_cluster(EPOCH)


class Observer:
    """A hook that moves nothing; at each window after the warm-up it runs the detector."""

    def __init__(self, params: SpreadingParams, warmup_h: float) -> None:
        self.params, self.warmup_h = params, warmup_h
        self.seen: list[Observation] = []

    def on_unschedulable(self, state: SimState, pod: Pod, now: float) -> Sequence[Move]:
        return ()

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        if now < self.warmup_h:
            return ()
        started = time.perf_counter()
        cluster = snapshot(state)
        profile = ProfileConfig().for_cluster(cluster)  # the daemon's default settings
        verdict = detect_spreading(
            cluster, self.params, EPOCH + timedelta(hours=now), profile=profile
        )
        rep = verdict.replay
        self.seen.append(
            Observation(
                fired=any(f.kind == "spreading" for f in verdict.findings),
                enough=verdict.evidence.ok,
                informative=rep.informative,
                spread_share=rep.spread_share,
                pack_share=rep.pack_share,
                excess_stranded=rep.excess_stranded,
                seconds=time.perf_counter() - started,
                packs=any(f.kind == PACKING for f in verdict.findings),
            )
        )
        return ()


def one_run(
    root: Path,
    trace: str,
    scheduler: str,
    seed: int,
    config: TimelineConfig,
    overrides: dict[str, float],
) -> tuple[str, str, int, list[Observation]]:
    nodes, shapes = load_trace(root, trace)
    observer = Observer(replace(shipped_params(), **overrides), config.warmup_hours)
    run_timeline(nodes, shapes, scheduler, seed, config=config, hook=observer)
    return trace, scheduler, seed, observer.seen


def table(results: list[tuple[str, str, int, list[Observation]]]) -> str:
    rows = [
        "| trace | scheduler | should fire | seeds | snapshots | fired | thin evidence | "
        "informative (mean) | spread share (mean) | pack share (mean) | "
        "excess stranded GPUs (mean) | detector s (max) | should say packs | said packs | "
        "pack share (min / max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    cells: dict[tuple[str, str], list[tuple[int, list[Observation]]]] = {}
    for trace, scheduler, seed, seen in results:
        cells.setdefault((trace, scheduler), []).append((seed, seen))
    for (trace, scheduler), runs in cells.items():
        obs = [o for _, seen in runs for o in seen]
        seeds = ",".join(str(s) for s, _ in sorted(runs))
        fired = sum(o.fired for o in obs)
        thin = sum(not o.enough for o in obs)
        rows.append(
            f"| {trace} | {scheduler} | {'yes' if scheduler in SPREADS else 'no'} | {seeds} | "
            f"{len(obs)} | {fired} | {thin} | "
            f"{statistics.fmean(o.informative for o in obs):.0f} | "
            f"{statistics.fmean(o.spread_share for o in obs):.2f} | "
            f"{statistics.fmean(o.pack_share for o in obs):.2f} | "
            f"{statistics.fmean(o.excess_stranded for o in obs):.0f} | "
            f"{max(o.seconds for o in obs):.2f} | {'yes' if scheduler in PACKS else 'no'} | "
            f"{sum(o.packs for o in obs)} | {min(o.pack_share for o in obs):.2f} / "
            f"{max(o.pack_share for o in obs):.2f} |"
        )
    return "\n".join(rows) + "\n"


def time_emulated(nodes: int, pods: int, runs: int = 3) -> list[float]:
    """Seconds of each of ``runs`` evaluations of the shipped rule on the emulated cluster."""
    from bench.bench_kube import cluster_objects
    from defrag.adapters.kube_convert import cluster_from_items

    cluster = cluster_from_items(cluster_objects(nodes, pods), "emulated")
    created = min(p.created_at for p in cluster.pods.values() if p.created_at is not None)
    now, params = created + timedelta(hours=1), shipped_params()
    profile = ProfileConfig().for_cluster(cluster)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        verdict = detect_spreading(cluster, params, now, profile=profile)
        times.append(time.perf_counter() - started)
    print(
        f"{nodes} nodes, {pods} pods: {verdict.replay.placements} placements replayed; "
        f"s min/median/max {min(times):.2f} / {statistics.median(times):.2f} / {max(times):.2f}"
    )
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data.add_data_option(ap)
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--schedulers", default=",".join(SCHEDULERS))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=42, help="42; 45 is the held-out seed")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--hours", type=float, default=6.0, help="hours after the warm-up")
    ap.add_argument(
        "--warmup", type=float, default=3.0,
        help="hours before the first snapshot (the run starts in steady state: prefill)",
    )  # fmt: skip
    ap.add_argument("--every", type=float, default=3.0, help="hours between snapshots")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument(
        "--set", action="append", default=[], metavar="FIELD=NUMBER",
        help="override a setting of the shipped rule (SpreadingParams field), e.g. top_share=0.2",
    )  # fmt: skip
    ap.add_argument("--out", type=Path)
    ap.add_argument("--emulated", metavar="NODES:PODS", help="time the rule alone; no simulator")
    args = ap.parse_args(argv)
    if args.emulated:
        nodes, _, pods = args.emulated.partition(":")
        if not (nodes.isdigit() and pods.isdigit()):
            ap.error(f"--emulated {args.emulated}: write NODES:PODS, e.g. 5000:40000")
        time_emulated(int(nodes), int(pods))
        return 0
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in SpreadingParams.__dataclass_fields__:
            ap.error(f"--set {item}: no setting {key!r}")
        try:
            overrides[key] = float(value) if "." in value else int(value)
        except ValueError:
            ap.error(f"--set {item}: {value!r} is not a number")
    traces = [t for t in args.traces.split(",") if t]
    schedulers = [s for s in args.schedulers.split(",") if s]
    data.require(args.data, data.trace_files(traces))
    config = TimelineConfig(
        load=args.load, hours=args.hours, warmup_hours=args.warmup, window_every_h=args.every
    )
    tasks = [
        (args.data, t, s, seed, config, overrides)
        for t in traces
        for s in schedulers
        for seed in range(args.first_seed, args.first_seed + args.seeds)
    ]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(one_run, *task) for task in tasks]
        results = []
        for future in futures:
            results.append(future.result())
            trace, scheduler, seed, seen = results[-1]
            print(
                f"{trace} {scheduler} seed {seed}: {sum(o.fired for o in seen)}/{len(seen)} "
                f"fired ({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
            )
    out = table(results)
    print(out)
    print(f"({len(tasks)} runs, {time.perf_counter() - started:.0f} s wall)", file=sys.stderr)
    if args.out:
        args.out.write_text(out, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
