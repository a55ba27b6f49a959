"""End-to-end detection over 1,000 GPUs' series against a local Prometheus.

Target (issue 5): ``detect(rules, metrics, None, now)`` with the shipped leak and idle rules
takes ≤ 2 s for 1,000 GPUs. History: 6 h of 30 s DCGM samples per GPU (FB used; FB free and
utilisation for the last hour), 1% of the GPUs leaking, the rest plateau / sawtooth / step /
flat, backfilled with ``promtool tsdb create-blocks-from openmetrics`` (set-up, not timed).

    .venv/bin/python -m bench.bench_detect [--gpus 1000] [--hours 6] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

from defrag.adapters.prometheus import PrometheusSource
from defrag.detection import detect, leak_range_query
from defrag.rules import LeakRule, load_rules
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    rules = load_rules([ROOT / "rules" / "leak.yaml", ROOT / "rules" / "idle.yaml"])
    with tempfile.TemporaryDirectory() as tmp:
        history = Path(tmp) / "history.om"
        t0 = time.perf_counter()
        gpus, samples = write_history(history, args.gpus, args.hours)
        t_write = time.perf_counter() - t0
        t0 = time.perf_counter()
        with prometheus_server(history, Path(tmp)) as server:
            t_start = time.perf_counter() - t0
            source = PrometheusSource(server.url, retries=0, timeout_s=60)
            detect(rules, source, None, END)  # warm the server's caches once
            leak_rule = rules.enabled("leak")[0].rule
            assert isinstance(leak_rule, LeakRule)
            lookback = timedelta(seconds=leak_rule.lookback)
            fetched = len(
                source.range(leak_range_query(leak_rule), END - lookback, END, leak_rule.step)
            )
            times, findings = [], []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                findings = detect(rules, source, None, END)
                times.append(time.perf_counter() - t0)
    leaks = sum(f.kind == "leak" for f in findings)
    rows = [
        ("GPUs", f"{gpus}"),
        ("samples backfilled", f"{samples:,}"),
        ("write OpenMetrics (s)", f"{t_write:.1f}"),
        ("backfill + start Prometheus (s)", f"{t_start:.1f}"),
        (f"detect, median of {args.runs} (s)", f"{statistics.median(times):.3f}"),
        ("detect, max (s)", f"{max(times):.3f}"),
        ("GPU series past the leak prefilter", f"{fetched}"),
        ("leak findings (expected)", f"{leaks} ({(gpus + 99) // 100})"),
        ("idle finding", f"{sum(f.kind == 'idle' for f in findings)}"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value:>12}")


if __name__ == "__main__":
    main()
