"""End-to-end detection over 1,000 GPUs' series against a local Prometheus.

Target (issue 5): ``detect(rules, metrics, None, now)`` with the shipped leak and idle rules
takes ≤ 2 s for 1,000 GPUs. History: 6 h 15 min of 30 s DCGM samples per GPU (FB used; FB
free and utilisation for the last hour), 1% of the GPUs leaking, the rest plateau / sawtooth /
step / flat, backfilled with ``promtool tsdb create-blocks-from openmetrics`` (set-up, not
timed).

    .venv/bin/python -m bench.bench_detect [--gpus 1000] [--hours 6.25] [--runs 5]
        [--corpus] [--no-prefilter] [--recorded] [--concurrency 4] [--data DIR]

``--corpus`` draws the histories from the labelled corpus instead (bench/leak_corpus.py: 1% linear
leaks of 512 MiB/h – 4 GiB/h, the rest a random mix of every non-leak family, sample noise σ up
to 800 MiB, 6–8 h each); ``--no-prefilter`` fetches every GPU (the worst case).

``--recorded`` also backfills the shipped recording rules
(rules/prometheus/defrag.detection.rules.yaml) with ``promtool tsdb create-blocks-from rules``:
Prometheus itself evaluates them over the raw history (:func:`recording_parts` says which
ranges); then the rules that read the group's own recorded series (the prefilter's verdict and
its witness) at the group's evaluation times over the last 10 minutes, as a running Prometheus
evaluates them after the terms (tests/support/recorded_passes.py; added to a TSDB kept without
them). Each run then detects in turn: the leak rule on the raw series (``recorded: never``), on
the recorded ones (``recorded: auto``: the prefilter read from its recorded verdict), and on the
recorded ones with the verdict's witness hidden ("terms": the prefilter evaluated over the
recorded terms, as before the verdict); the leak findings of the second are checked against the
raw series judged at the recorded evaluation time, and against the third's. ``--no-raw``
leaves the raw series out of the runs (the check against them stays). ``--data DIR`` keeps the
TSDB (and its set-up times) in DIR and reuses it when there.

Each run and mode also detects as a daemon's cycles do, with a memory of the range answers
(:mod:`defrag.detectors.range_memory`): a first detection a ``step`` before the end (read
whole, kept), then a later one at the end, which asks only for the span since; its findings
must be the whole read's. "detect, …" rows are the detections that keep nothing (every
detection before the memory); "detect first / later" rows the two cycles.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from statistics import median

import numpy as np
import yaml

from bench.leak_corpus import corpus, random_mix
from defrag.adapters.prometheus import PrometheusSource
from defrag.detect.findings import Finding
from defrag.detection import detect, run_detection
from defrag.detectors.leak.recorded import VERDICT_LABEL
from defrag.detectors.leak.registration import (
    LEAK,
    LeakRuleFields,
    judged_at,
    leak_range_query,
)
from defrag.detectors.range_memory import RangeMemory
from defrag.ports import Sample
from defrag.rules import load_rules
from defrag.scoring.profile import ScoringProfile
from tests.support.prometheus import (
    END,
    RuleBackfill,
    backfill_openmetrics,
    backfill_rules,
    make_fleet,
    serve_tsdb,
)
from tests.support.recorded_passes import backfill_second_pass, reads_recorded

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("whole", "first", "later")
"""Each run's detections per mode: at the end keeping nothing; a step before it with a fresh
memory; at the end with what that one kept."""
RECORDING = ROOT / "rules" / "prometheus" / "defrag.detection.rules.yaml"
MARKER = "cluster:DCGM_FI_DEV_FB_USED:count"
VERDICT_PASS = "promtool verdict"
"""The set-up row that says the TSDB has the second pass (the verdict and its witness)."""


class WithoutVerdict(PrometheusSource):
    """A source on which the prefilter's recorded verdict is never found (its witness answers
    nothing), so the leak rule evaluates the prefilter over the recorded terms."""

    def instant(self, query: str, at: datetime | None = None) -> list[Sample]:
        if query.startswith("last_over_time(cluster:") and VERDICT_LABEL in query:
            return []
        return super().instant(query, at)


def write_history(path: Path, gpus: int, hours: float) -> tuple[int, int]:
    """Write the fleet as OpenMetrics; returns (GPUs, samples)."""
    rng = np.random.default_rng(1)
    others = ["plateau", "sawtooth", "step", "flat"]
    shapes = ["leak" if i % 100 == 0 else others[int(rng.integers(4))] for i in range(gpus)]
    fleet = make_fleet(shapes, hours=hours, step_s=30.0)
    last_hour = fleet.gpus[0].times >= fleet.end - 3600
    samples = 0
    with path.open("w") as out:
        for metric, values_of, mask in (
            ("DCGM_FI_DEV_FB_USED", lambda g: g.used, None),
            ("DCGM_FI_DEV_FB_FREE", lambda g: g.free, last_hour),
            ("DCGM_FI_DEV_GPU_UTIL", lambda g: g.util, last_hour),
        ):
            out.write(f"# TYPE {metric} gauge\n")
            for g in fleet.gpus:
                labels = (
                    f'gpu="{g.gpu}",UUID="{g.uuid}",Hostname="{g.node}",'
                    f'namespace="{g.namespace}",pod="{g.pods[0]}"'
                )
                times, values = g.times, values_of(g)
                if mask is not None:
                    times, values = times[mask], values[mask]
                out.writelines(
                    f"{metric}{{{labels}}} {v:.1f} {int(t)}\n"
                    for t, v in zip(times, values, strict=True)
                )
                samples += len(times)
        out.write("# EOF\n")
    return gpus, samples


def write_corpus(path: Path, gpus: int) -> tuple[int, int]:
    """The corpus mix as OpenMetrics (FB used over the history, FB free for the last hour)."""
    mix = random_mix(gpus, seed=5)
    leaks = corpus(seed=5, per_cell=1, families=("linear",), noises=(0, 200, 400, 600, 800))
    leaks = [c for c in leaks if c.truth.rate_mib_per_h >= 512]
    cases = [leaks[i // 100 % len(leaks)] if i % 100 == 0 else mix[i] for i in range(gpus)]
    samples = 0
    with path.open("w") as out:
        for metric in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
            out.write(f"# TYPE {metric} gauge\n")
            for i, case in enumerate(cases):
                s = case.series
                labels = (
                    f'gpu="{i % 8}",UUID="GPU-{i:05d}",Hostname="node-{i // 8:04d}",'
                    f'namespace="ml",pod="{case.name}"'
                )
                if s.instance:
                    labels += f',GPU_I_ID="{s.instance}",GPU_I_PROFILE="{s.profile}"'
                times, values = s.times, s.used_mib
                if metric == "DCGM_FI_DEV_FB_FREE":
                    last = times >= times[-1] - 3600
                    times, values = times[last], s.total_mib - values[last]
                out.writelines(
                    f"{metric}{{{labels}}} {v:.1f} {int(t)}\n"
                    for t, v in zip(times, values, strict=True)
                )
                samples += len(times)
        out.write("# EOF\n")
    return gpus, samples


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat`` fields 14–15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def _leaks(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.kind.startswith("leak")]


def _rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` (``/proc/<pid>/status`` VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def recording_parts(lookback_s: float) -> list[RuleBackfill]:
    """The shipped recording group in two parts, backfilled one after the other under one file
    name (so at the same evaluation times): each range point's median and the marker over the
    whole lookback before ``END`` (and 10 minutes more, so the marker is there at its start);
    the lookback's terms over the last 10 minutes only — a detection reads them at the group's
    last evaluation alone, and evaluating them over 6 h of 10,000s of GPUs at every step would
    cost the set-up more than all the runs."""
    doc = yaml.safe_load(RECORDING.read_text())
    group = doc["groups"][0]
    end = END.timestamp()

    def part(keep: Callable[[str], bool]) -> str:
        # the rules reading the group's recorded series: a second pass (add_verdict)
        rules = [r for r in group["rules"] if keep(r["record"]) and not reads_recorded(r)]
        return yaml.safe_dump({"groups": [{**group, "rules": rules}]}, sort_keys=False)

    def lookback_term(name: str) -> bool:
        return name.startswith("gpu:") and not name.endswith(":median5m")

    return [
        RuleBackfill(part(lambda n: not lookback_term(n)), end - lookback_s - 600, end),
        RuleBackfill(part(lookback_term), end - 600, end),
    ]


def build(args: argparse.Namespace, data: Path, tmp: Path, lookback_s: float) -> list[str]:
    """The TSDB in ``data``: the raw history, and with ``--recorded`` the recorded series.
    Returns the set-up rows."""
    history = tmp / "history.om"
    t0 = time.perf_counter()
    if args.corpus:
        gpus, samples = write_corpus(history, args.gpus)
    else:
        gpus, samples = write_history(history, args.gpus, args.hours)
    t_write = time.perf_counter() - t0
    data.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    backfill_openmetrics(history, data)
    history.unlink()
    rows = [
        f"GPUs {gpus}, samples backfilled {samples:,}",
        f"write OpenMetrics {t_write:.1f} s, promtool openmetrics {time.perf_counter() - t0:.1f} s",
    ]
    if args.recorded:
        t0 = time.perf_counter()
        blocks = tmp / "recorded"
        with serve_tsdb(data, tmp) as server:
            backfill_rules(server.url, recording_parts(lookback_s), tmp / RECORDING.name, blocks)
        for block in blocks.iterdir():
            block.rename(data / block.name)
        rows.append(f"promtool rules {time.perf_counter() - t0:.1f} s")
        rows.append(add_verdict(data, tmp))
    (data / "bench-detect.txt").write_text("\n".join(rows) + "\n")
    return rows


def add_verdict(data: Path, tmp: Path) -> str:
    """The second pass into ``data``: the rules that read the recorded terms, at the group's
    evaluations within the last 10 minutes before ``END`` (where the terms are). Its set-up
    row."""
    t0 = time.perf_counter()
    end = END.timestamp()
    written = backfill_second_pass(data, RECORDING.read_text(), MARKER, end - 600, end, tmp)
    return f"{VERDICT_PASS} {time.perf_counter() - t0:.1f} s ({written:,} samples)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=6.25)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--corpus", action="store_true")
    parser.add_argument("--no-prefilter", action="store_true")
    parser.add_argument(
        "--recorded",
        action="store_true",
        help="backfill the recording rules too; each run then detects with and without them",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="prometheus.concurrent_queries")
    parser.add_argument(
        "--no-raw", action="store_true", help="with --recorded: no runs on the raw series"
    )
    parser.add_argument(
        "--data", type=Path, help="keep the TSDB here and reuse it when present (set-up once)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        leak_yaml = (ROOT / "rules" / "leak.yaml").read_text()
        if args.no_prefilter:
            leak_yaml = leak_yaml.replace("prefilter: true", "prefilter: false")
        modes = ["never", "auto", "terms"] if args.recorded else ["never"]
        rules_of = {}
        for mode in modes:
            (tmp / mode).mkdir()
            recorded = "auto" if mode == "terms" else mode
            text = leak_yaml.replace("prefilter:", f"recorded: {recorded}\n    prefilter:", 1)
            (tmp / mode / "leak.yaml").write_text(text)
            names = [tmp / mode / "leak.yaml"]
            rules_of[mode] = load_rules(names + ([] if args.corpus else [ROOT / "rules/idle.yaml"]))
        leak_rule = rules_of["never"].enabled("leak")[0].rule
        assert isinstance(leak_rule, LeakRuleFields)
        leak = LEAK.settings_of(leak_rule)
        data = args.data or tmp / "data"
        if (data / "bench-detect.txt").exists():
            setup = (data / "bench-detect.txt").read_text().splitlines()
            if args.recorded and not any(line.startswith(VERDICT_PASS) for line in setup):
                setup.append(add_verdict(data, tmp))
                (data / "bench-detect.txt").write_text("\n".join(setup) + "\n")
            setup.append("(reused)")
        else:
            setup = build(args, data, tmp, leak.lookback_s)
        t0 = time.perf_counter()
        # Prometheus's own 2 min limit on a query is shorter than a raw prefilter over 30,000
        # GPUs takes on a loaded 2-core machine
        with serve_tsdb(data, tmp, query_timeout="10m") as server:
            t_start = time.perf_counter() - t0
            source = PrometheusSource(
                server.url, retries=0, timeout_s=600, concurrency=args.concurrency
            )
            sources = {
                mode: WithoutVerdict(
                    server.url, retries=0, timeout_s=600, concurrency=args.concurrency
                )
                if mode == "terms"
                else source
                for mode in modes
            }
            profile = ScoringProfile.default()
            judged = {}
            for mode in modes:  # warm the server's caches once each
                detect(rules_of[mode], sources[mode], None, END, profile=profile)
                rule = rules_of[mode].enabled("leak")[0].rule
                assert isinstance(rule, LeakRuleFields)
                judged[mode] = judged_at(rule, sources[mode], END)
            if args.recorded:
                rec, terms = judged["auto"][1], judged["terms"][1]
                if rec is None or terms is None:
                    raise SystemExit("error: the recorded series do not cover the lookback")
                if not rec.verdict_with or terms.verdict_with:
                    raise SystemExit("error: the recorded verdict is not read (or not hidden)")
            if args.recorded and args.no_raw:
                modes.remove("never")
            at = judged[modes[-1]][0]
            lookback = timedelta(seconds=leak.lookback_s)
            fetched = len(source.range(leak_range_query(leak_rule), at - lookback, at, leak.bin_s))
            kinds = [(m, k) for m in modes for k in KINDS]
            times: dict[tuple[str, str], list[float]] = {mk: [] for mk in kinds}
            cpus: dict[tuple[str, str], list[float]] = {mk: [] for mk in kinds}
            server_cpus: dict[tuple[str, str], list[float]] = {mk: [] for mk in kinds}
            findings: dict[tuple[str, str], list[Finding]] = {}
            load = os.getloadavg()
            for _ in range(args.runs):
                for mode in modes:  # alternating, so load drifts reach both alike
                    # a detection that keeps nothing (as every detection did before), then a
                    # daemon's two cycles a step apart: the first reads whole and keeps, the
                    # later asks for the span since
                    memory = RangeMemory()
                    for kind, at_, kept_in in (
                        ("whole", END, None),
                        ("first", END - timedelta(seconds=leak.bin_s), memory),
                        ("later", END, memory),
                    ):
                        t0, c0 = time.perf_counter(), time.process_time()
                        s0 = _cpu_s(server.process.pid)
                        report = run_detection(
                            rules_of[mode],
                            sources[mode],
                            None,
                            at_,
                            profile=profile,
                            memory=kept_in,
                        )
                        times[mode, kind].append(time.perf_counter() - t0)
                        cpus[mode, kind].append(time.process_time() - c0)
                        server_cpus[mode, kind].append(_cpu_s(server.process.pid) - s0)
                        if report.failures:
                            raise SystemExit(f"error: {report.failures[0]}")
                        findings[mode, kind] = list(report.findings)
                    if findings[mode, "later"] != findings[mode, "whole"]:
                        raise SystemExit(f"error: {mode}: the later detection found otherwise")
            rss = _rss_mib(server.process.pid)
            load_after = os.getloadavg()
            # the leak rule's findings from the raw series judged at the recorded series'
            # evaluation time are the recorded run's (the idle rule reads raw series at END)
            same = same_terms = ""
            if args.recorded:
                raw_then = detect(rules_of["never"], source, None, at, profile=profile)
                same = "yes" if _leaks(raw_then) == _leaks(findings["auto", "whole"]) else "NO"
                verdict, terms_found = findings["auto", "whole"], findings["terms", "whole"]
                same_terms = "yes" if verdict == terms_found else "NO"
    gpus = args.gpus
    rows = [(line, "") for line in setup]
    rows += [
        ("start Prometheus on the TSDB (s)", f"{t_start:.1f}"),
        ("Prometheus RSS after the runs (MiB)", f"{rss:.0f}"),
        (f"load average before / after (1 min), concurrency {args.concurrency}", ""),
        ("", f"{load[0]:.1f} / {load_after[0]:.1f}"),
        ("GPU series past the leak prefilter", f"{fetched}"),
    ]
    for mode in modes:
        # the raw rows keep the names bench/run_all.py reads
        label = {
            "auto": "with recorded series, ",
            "terms": "with recorded terms, verdict hidden, ",
        }.get(mode, "")
        whole = (mode, "whole")
        leaks = sum(f.kind == "leak" for f in findings[whole])
        rows += [
            (f"detect, {label}min of {args.runs} (s)", f"{min(times[whole]):.3f}"),
            (f"detect, {label}median of {args.runs} (s)", f"{median(times[whole]):.3f}"),
            (f"detect, {label}max (s)", f"{max(times[whole]):.3f}"),
            (
                f"detect, {label}per 10,000 GPUs, median (s)",
                f"{median(times[whole]) * 1e4 / gpus:.2f}",
            ),
            (f"detect, {label}CPU in this process, min / median / max (s)", _spread(cpus[whole])),
            (
                f"detect, {label}CPU in Prometheus, min / median / max (s)",
                _spread(server_cpus[whole]),
            ),
            (f"detect, {label}leak findings (expected)", f"{leaks} ({(gpus + 99) // 100})"),
            (f"detect, {label}idle finding", f"{sum(f.kind == 'idle' for f in findings[whole])}"),
        ]
        for kind in KINDS[1:]:
            what = f"detect {kind} (a step {'before' if kind == 'first' else 'after'}), {label}"
            mk = (mode, kind)
            rows += [
                (f"{what}wall min / median / max (s)", _spread(times[mk])),
                (f"{what}CPU in this process, min / median / max (s)", _spread(cpus[mk])),
                (f"{what}CPU in Prometheus, min / median / max (s)", _spread(server_cpus[mk])),
            ]
        rows.append((f"detect later, {label}findings = a whole read's", "yes"))
    if args.recorded:
        rows.append(("leak findings: recorded = raw at the recorded evaluation", same))
        rows.append(("findings: recorded verdict = recorded terms", same_terms))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value:>20}" if value else key)


if __name__ == "__main__":
    main()
