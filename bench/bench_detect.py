"""End-to-end detection over 1,000 GPUs' series against a local Prometheus.

Target (issue 5): ``detect(rules, metrics, None, now)`` with the shipped leak and idle rules
takes ≤ 2 s for 1,000 GPUs. History: 6 h of 30 s DCGM samples per GPU (FB used; FB free and
utilisation for the last hour), 1% of the GPUs leaking, the rest plateau / sawtooth / step /
flat, backfilled with ``promtool tsdb create-blocks-from openmetrics`` (set-up, not timed).

    .venv/bin/python -m bench.bench_detect [--gpus 1000] [--hours 6] [--runs 5]
        [--corpus] [--no-prefilter]

``--corpus`` draws the histories from the labelled corpus instead (bench/leak_corpus.py: 1% linear
leaks of 512 MiB/h – 4 GiB/h, the rest a random mix of every non-leak family, sample noise σ up
to 800 MiB, 6–8 h each); ``--no-prefilter`` fetches every GPU (the worst case).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

from bench.leak_corpus import corpus, random_mix
from defrag.adapters.prometheus import PrometheusSource
from defrag.detection import detect
from defrag.detectors.leak.registration import LEAK, LeakRuleFields, leak_range_query
from defrag.rules import load_rules
from defrag.scoring.profile import ScoringProfile
from tests.support.prometheus import END, make_fleet, prometheus_server

ROOT = Path(__file__).resolve().parents[1]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--corpus", action="store_true")
    parser.add_argument("--no-prefilter", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        leak_yaml = (ROOT / "rules" / "leak.yaml").read_text()
        if args.no_prefilter:
            leak_yaml = leak_yaml.replace("prefilter: true", "prefilter: false")
        (Path(tmp) / "leak.yaml").write_text(leak_yaml)
        names = [Path(tmp) / "leak.yaml"] + ([] if args.corpus else [ROOT / "rules" / "idle.yaml"])
        rules = load_rules(names)
        history = Path(tmp) / "history.om"
        t0 = time.perf_counter()
        if args.corpus:
            gpus, samples = write_corpus(history, args.gpus)
        else:
            gpus, samples = write_history(history, args.gpus, args.hours)
        t_write = time.perf_counter() - t0
        t0 = time.perf_counter()
        with prometheus_server(history, Path(tmp)) as server:
            t_start = time.perf_counter() - t0
            source = PrometheusSource(server.url, retries=0, timeout_s=60)
            profile = ScoringProfile.default()
            detect(rules, source, None, END, profile=profile)  # warm the server's caches once
            leak_rule = rules.enabled("leak")[0].rule
            assert isinstance(leak_rule, LeakRuleFields)
            leak = LEAK.settings_of(leak_rule)
            lookback = timedelta(seconds=leak.lookback_s)
            fetched = len(
                source.range(leak_range_query(leak_rule), END - lookback, END, leak.bin_s)
            )
            times, cpus, server_cpus, findings = [], [], [], []
            load = os.getloadavg()
            for _ in range(args.runs):
                t0, c0, s0 = time.perf_counter(), time.process_time(), _cpu_s(server.process.pid)
                findings = detect(rules, source, None, END, profile=profile)
                times.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
                server_cpus.append(_cpu_s(server.process.pid) - s0)
    leaks = sum(f.kind == "leak" for f in findings)
    rows = [
        ("GPUs", f"{gpus}"),
        ("samples backfilled", f"{samples:,}"),
        ("write OpenMetrics (s)", f"{t_write:.1f}"),
        ("backfill + start Prometheus (s)", f"{t_start:.1f}"),
        (f"detect, min of {args.runs} (s)", f"{min(times):.3f}"),
        (f"detect, median of {args.runs} (s)", f"{statistics.median(times):.3f}"),
        ("detect, max (s)", f"{max(times):.3f}"),
        ("CPU in this process, min / median / max (s)", _spread(cpus)),
        ("CPU in Prometheus, min / median / max (s)", _spread(server_cpus)),
        ("load average before / after (1 min)", f"{load[0]:.1f} / {os.getloadavg()[0]:.1f}"),
        ("GPU series past the leak prefilter", f"{fetched}"),
        ("leak findings (expected)", f"{leaks} ({(gpus + 99) // 100})"),
        ("idle finding", f"{sum(f.kind == 'idle' for f in findings)}"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value:>12}")


if __name__ == "__main__":
    main()
