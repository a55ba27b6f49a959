"""Where a defragmenter's lost GPU-hours go (issue 25): every eviction of a timeline run,
classified by why it was made and by the victim's kind, with what it cost and whether it paid.

Each move the hook returns is one of

* ``room``: made for a starved pod (``Move.for_pod``). It is *used* when that pod next starts
  on the freed node, *elsewhere* when it starts on another node (the room was not needed),
  *unused* when the pod is still pending at the end of the run;
* ``repack``: a window's drain (no pod it was made for).

Its price is the victim's GPUs × (work since its last checkpoint + its kind's restart
overhead), inside the measured period, as the timeline bills it (defrag.sim.timeline).

    .venv/bin/python -m bench.bench_lost_work --defragmenter defrag-extender --seeds 1
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import data
from bench.bench_packing_limit import load_trace
from bench.bench_peers import daemon_options
from defrag.model.resources import Pod
from defrag.sim.defragmenters import make_defragmenter
from defrag.sim.hooks import DefragHook, Move
from defrag.sim.migration import MigrationCost, kind_of
from defrag.sim.report import markdown_table
from defrag.sim.state import SimState
from defrag.sim.timeline import TimelineConfig, run_timeline


@dataclass
class _Room:
    pod: str
    row: int
    kind: str
    price: float


@dataclass
class Recorder:
    """Wraps a hook: prices each move it returns and follows each room's pod."""

    hook: DefragHook
    warm: float
    end: float
    price: dict[tuple[str, str, str], float] = field(default_factory=lambda: defaultdict(float))
    count: dict[tuple[str, str, str], int] = field(default_factory=lambda: defaultdict(int))
    open_rooms: list[_Room] = field(default_factory=list)
    rooms_for: set[str] = field(default_factory=set)
    """The pods rooms were made for (a room of several evictions counts once)."""

    def on_unschedulable(self, state: SimState, pod: Pod, now: float) -> Sequence[Move]:
        return self._record(state, now, self.hook.on_unschedulable(state, pod, now))

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        self._settle(state)
        return self._record(state, now, self.hook.on_window(state, now))

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]:
        self._settle(state)
        tick = getattr(self.hook, "on_tick", None)
        return self._record(state, now, tick(state, now) if tick is not None else ())

    def _record(self, state: SimState, now: float, moves: Sequence[Move]) -> Sequence[Move]:
        for m in moves:
            job = state.jobs[m.pod_id]
            lost = job.progress_h(now) - job.checkpointed_h(now)
            price = job.gpus * (lost + job.overhead_h) if self.warm <= now < self.end else 0.0
            kind = kind_of(job.pod)
            if m.for_pod is None:
                self._add(("repack", kind, "-"), price)
            else:
                self.open_rooms.append(_Room(m.for_pod, m.source_row, kind, price))
                self.rooms_for.add(m.for_pod)
        return moves

    def _add(self, key: tuple[str, str, str], price: float) -> None:
        self.price[key] += price
        self.count[key] += 1

    def _settle(self, state: SimState) -> None:
        """Rooms whose pod has started: used (on the freed node) or elsewhere."""
        left = []
        for room in self.open_rooms:
            placed = state.placed.get(room.pod)
            if placed is None:
                left.append(room)
                continue
            outcome = "used" if placed.row == room.row else "elsewhere"
            self._add(("room", room.kind, outcome), room.price)
        self.open_rooms = left

    def finish(self) -> None:
        for room in self.open_rooms:
            self._add(("room", room.kind, "unused"), room.price)
        self.open_rooms = []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    data.add_data_option(ap)
    ap.add_argument("--trace", default="default")
    ap.add_argument("--policy", default="least-allocated")
    ap.add_argument("--defragmenter", default="defrag-extender")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=42)
    ap.add_argument("--hours", type=float, default=36.0)
    ap.add_argument("--warmup", type=float, default=12.0)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a daemon setting, as bench_peers takes it")  # fmt: skip
    ap.add_argument("--settings", type=Path, help="the daemon's settings file")
    args = ap.parse_args(argv)
    opts = daemon_options(ap, args.settings, args.sets, 6.0)
    data.require(args.data, data.trace_files([args.trace]))
    nodes, shapes = load_trace(args.data, args.trace)
    config = TimelineConfig(load=0.9, hours=args.hours, warmup_hours=args.warmup,
                            cost=MigrationCost(), window_every_h=6.0)  # fmt: skip
    total_price: dict[tuple[str, str, str], float] = defaultdict(float)
    total_count: dict[tuple[str, str, str], int] = defaultdict(int)
    billed, rooms = 0.0, 0
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        hook, scheduler = make_defragmenter(args.defragmenter, args.policy, "timeline", opts)
        assert hook is not None, "no hook: nothing is evicted"
        rec = Recorder(hook, args.warmup, args.warmup + args.hours)
        run = run_timeline(nodes, shapes, args.policy, seed, config=config, hook=rec,
                           defragmenter=args.defragmenter, scheduler=scheduler)  # fmt: skip
        rec.finish()
        rooms += len(rec.rooms_for)
        billed += run.lost_work_gpu_hours + run.overhead_gpu_hours
        for k, v in rec.price.items():
            total_price[k] += v
        for k, n in rec.count.items():
            total_count[k] += n
    n = args.seeds
    rows = [
        (why, kind, outcome, f"{total_count[k] / n:.1f}", f"{total_price[k] / n:.2f}")
        for k in sorted(total_count)
        if total_count[k]
        for why, kind, outcome in [k]
    ]
    print(f"{args.defragmenter} under {args.policy}, `{args.trace}` shapes, seeds "
          f"{args.first_seed}–{args.first_seed + n - 1} (means per run); billed by the "
          f"timeline: {billed / n:.2f} GPU·h lost (work + restarts); rooms made for "
          f"{rooms / n:.1f} pods\n")  # fmt: skip
    print(markdown_table(("move", "victim kind", "outcome", "evictions", "GPU·h"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
