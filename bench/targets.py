"""The targets ``make bench`` holds the figures to: one table, each figure read from the output
of the bench that produces it.

A target's ``key`` is a regular expression over that bench's output (stdout and stderr, as it
prints them today): the named group ``value`` is the figure, the other named groups say what the
line is about (a size, a mode), and ``where`` picks the line a full-size run is judged on. A
quick run prints the same lines at smaller sizes, so its figures are read without ``where``
(and judged against no target). ``tests/test_bench_smoke*.py`` run every bench's quick mode
through ``bench.run_all.run``, which fails a bench whose output has no line a key matches, so a
key cannot drift from what its bench prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from itertools import takewhile


class Better(Enum):
    """Which way a figure improves: ``LOWER`` (a time, memory, a cost) or ``HIGHER`` (a rate)."""

    LOWER = "lower"
    HIGHER = "higher"


@dataclass(frozen=True, slots=True)
class Reading:
    """One figure as a bench printed it, and what its line was about (sizes, modes)."""

    value: float
    about: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Target:
    label: str
    """The figure's name in the table."""
    bench: str
    """The name of the bench in ``bench.run_all.BENCHES`` that prints it."""
    key: str
    """Regular expression over the bench's output; group ``value`` is the figure."""
    unit: str
    """``s``/``ms`` (a time), ``MiB``, ``x`` (a ratio) or ``%``."""
    limit: float
    better: Better
    source: str
    """Where the target comes from (an issue, a docs section)."""
    where: tuple[tuple[str, str], ...] = ()
    """The named groups' values on the line a full-size run is judged on."""

    @property
    def met_word(self) -> str:
        return "≤" if self.better is Better.LOWER else "≥"

    def read(self, output: str, *, full: bool = True) -> Reading | None:
        """The figure in ``output``: at a full size the first line matching ``where``; else (a
        quick run's smaller sizes) the line nearest to it (:meth:`likeness`)."""
        wanted = dict(self.where)
        best: tuple[tuple[int, int], Reading] | None = None
        for found in re.finditer(self.key, output):
            groups = {k: v for k, v in found.groupdict().items() if k != "value"}
            reading = Reading(float(found.group("value")), tuple(sorted(groups.items())))
            if full:
                if all(groups.get(k) == v for k, v in wanted.items()):
                    return reading
                continue
            score = self.likeness(reading)
            if best is None or score > best[0]:
                best = (score, reading)
        return best[1] if best else None

    def likeness(self, reading: Reading) -> tuple[int, int]:
        """How near a line is to the one this target is judged on: how many qualifiers are
        equal, then how many characters their values share at the start ("synthetic 200" is
        nearer "synthetic 10000" than "openb 90%")."""
        about = dict(reading.about)
        equal = sum(about.get(k) == v for k, v in self.where)
        shared = sum(_prefix(about.get(k, ""), v) for k, v in self.where)
        return equal, shared

    def figure(self, output: str) -> float | None:
        """The full-size figure in ``output``, or None when the bench did not print it."""
        reading = self.read(output)
        return reading.value if reading else None

    def met(self, value: float) -> bool:
        return value <= self.limit if self.better is Better.LOWER else value >= self.limit


def _prefix(a: str, b: str) -> int:
    return sum(1 for _ in takewhile(lambda pair: pair[0] == pair[1], zip(a, b, strict=False)))


NUMBER = r"(?P<value>-?[\d.]+)"
FLEET_26 = "issue 26 (docs/benchmarks.md, Fast at fleet scale)"
FLEET_40 = "issue 40, item 2 (20,000 nodes)"


def _scoring(nodes: int) -> Target:
    return Target(
        f"schedule() at {nodes:,} nodes ÷ one numpy pass",
        "scoring",
        rf"schedule\(\) at (?P<nodes>\d+) nodes: [\d.]+ ms, {NUMBER}x one pass",
        "x",
        2.0,
        Better.LOWER,
        FLEET_26,
        (("nodes", str(nodes)),),
    )


def _plan(label: str, cluster: str, limit: float) -> Target:
    # bench_plan's table: | cluster | nodes | GPUs | allocated | steps | targets | plan s | ...
    return Target(
        label,
        "plan",
        rf"\| (?P<cluster>[^|\n]+?) \| \d+ \| \d+ \|(?:[^|\n]*\|){{3}}\s*{NUMBER} \|",
        "s",
        limit,
        Better.LOWER,
        FLEET_26,
        (("cluster", cluster),),
    )


def _detect(gpus: int, bench: str, limit: float, source: str = FLEET_26) -> Target:
    # bench_detect's two-column table: the "GPUs" row, then "detect, median of N (s)".
    return Target(
        f"detection, {gpus:,} GPUs, median",
        bench,
        rf"GPUs\s+(?P<gpus>\d+)\b[^\n]*\n[\s\S]*?detect, median of \d+ \(s\)\s+{NUMBER}",
        "s",
        limit,
        Better.LOWER,
        source,
        (("gpus", str(gpus)),),
    )


def _extender_fleet(clients: int, limit: float) -> Target:
    return Target(
        f"extender p99, 20,000 nodes, kube-scheduler's lists, {clients} client"
        + ("s" if clients > 1 else ""),
        "extender-fleet",
        rf"fleet (?P<nodes>\d+) nodes, kube-scheduler's lists, (?P<clients>\d+) client\(s\): "
        rf"p99 {NUMBER} ms",
        "ms",
        limit,
        Better.LOWER,
        FLEET_40,
        (("nodes", "20000"), ("clients", str(clients))),
    )


def _extender_cost(mode: str, nodes: int) -> Target:
    # Pods bound per second with the extender in kube-scheduler's path ÷ without: its cost.
    return Target(
        f"extender cost ({mode}), {nodes:,} nodes, kube-scheduler qps 1000",
        "sched-throughput",
        rf"extender cost, (?P<mode>\w+), (?P<nodes>\d+) nodes, qps (?P<qps>\w+): {NUMBER} %",
        "%",
        20.0,
        Better.LOWER,
        "issue 40, item 1",
        (("mode", mode), ("nodes", str(nodes)), ("qps", "1000")),
    )


TARGETS: tuple[Target, ...] = (
    *(_scoring(n) for n in (1000, 10000, 100000)),
    _plan("plan, openb at 90%", "openb 90%", 2.0),
    _plan("plan, 10,000 nodes", "synthetic 10000", 5.0),
    Target(
        "first list, 5,000 nodes / 40,000 pods",
        "cycle",
        rf"first cycle \(lists the cluster\): [\d.]+ s \([^)]*\), its list {NUMBER} s",
        "s",
        5.0,
        Better.LOWER,
        "issue 40 (Why: the first list ≤ 5 s)",
    ),
    Target(
        "cycle after changes, 5,000 nodes / 40,000 pods, median",
        "cycle",
        rf"every later cycle \([^)]*\): [\d.]+ / {NUMBER} / [\d.]+ s",
        "s",
        3.0,
        Better.LOWER,
        FLEET_26,
    ),
    Target(
        "its snapshot from the changes, median",
        "cycle",
        rf"their snapshots \(built from the changes\): [\d.]+ / {NUMBER} / [\d.]+ s",
        "s",
        0.5,
        Better.LOWER,
        FLEET_26,
    ),
    Target(
        "cycle's peak RSS",
        "cycle",
        rf"peak RSS: {NUMBER} MiB",
        "MiB",
        500.0,
        Better.LOWER,
        FLEET_26,
    ),
    Target(
        "prioritize p99 over HTTP, 5,000 nodes",
        "extender",
        rf"prioritize, nodenames mode, (?P<nodes>\d+) nodes[\s\S]*?"
        rf"HTTP keep-alive\s+[\d.]+\s+{NUMBER}",
        "ms",
        5.0,
        Better.LOWER,
        FLEET_26,
        (("nodes", "5000"),),
    ),
    Target(
        "prioritize p99, 4 clients, 1,000 nodes",
        "extender-load",
        rf"1\. (?P<clients>\d+) x \d+ prioritize at 1,000 nodes: p50 [\d.]+ ms, p99 {NUMBER} ms",
        "ms",
        10.0,
        Better.LOWER,
        FLEET_26,
        (("clients", "4"),),
    ),
    *(_extender_cost(mode, n) for n in (1000, 5000) for mode in ("names", "nodes")),
    # A large fleet (bench_extender_load --fleet): the node lists kube-scheduler sends at 20,000
    # nodes (numFeasibleNodesToFind: 1,000 names), the slower verb's p99; the server's peak RSS.
    *(_extender_fleet(clients, limit) for clients, limit in ((1, 5.0), (4, 15.0))),
    Target(
        "extender peak RSS, 20,000 nodes / 200,000 pods",
        "extender-fleet",
        rf"fleet (?P<nodes>\d+) nodes: extender peak RSS {NUMBER} MiB",
        "MiB",
        1536.0,
        Better.LOWER,
        FLEET_40,
        (("nodes", "20000"),),
    ),
    _detect(1000, "detect", 2.0),
    _detect(10000, "detect-10k", 5.0),
)


def of_bench(name: str, targets: tuple[Target, ...] = TARGETS) -> tuple[Target, ...]:
    return tuple(t for t in targets if t.bench == name)
