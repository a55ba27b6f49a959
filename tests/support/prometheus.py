"""A real Prometheus for tests: synthetic DCGM / kube-state-metrics histories, backfilled.

``make_fleet`` draws GPU memory histories of known shapes (linear leak, plateau after warm-up,
sawtooth, single step, flat); ``write_openmetrics`` writes them as OpenMetrics text;
``PrometheusServer`` backfills a fresh data dir with ``promtool tsdb create-blocks-from
openmetrics`` and serves it on 127.0.0.1 (docs/architecture.md). Queries must name an explicit
time: the history ends in the past.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import numpy as np

from tests.support.binaries import free_port, require_binary, stop_process, wait_ready

GPU_MEMORY_MIB = 81920.0  # an 80 GiB GPU
HOUR = 3600.0
# A fixed end keeps the histories reproducible; the server keeps it with a long retention.
END = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)

LEAK_START_MIB = 8000.0
LEAK_RATE_MIB_PER_H = 2000.0


def shape(name: str, hours_since_start: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Used GPU memory (MiB) of one named shape at each time; noise of 40 MiB sd."""
    h = hours_since_start
    if name == "leak":
        base = LEAK_START_MIB + LEAK_RATE_MIB_PER_H * h
    elif name == "plateau":  # model loading for 20 minutes, then flat
        base = np.minimum(h / (20 / 60), 1.0) * 30000.0
    elif name == "sawtooth":  # allocator cache filled over 50 minutes, freed, refilled
        base = 20000.0 + 3000.0 * np.minimum((h % 1.0) / (50 / 60), 1.0)
    elif name == "step":  # one jump, 4 hours before the end of a 12 h history
        base = np.where(h < h[-1] - 4.0, 10000.0, 25000.0)
    elif name == "flat":
        base = np.full_like(h, 5000.0)
    else:
        raise ValueError(name)
    return np.clip(base + rng.normal(0.0, 40.0, len(h)), 0.0, GPU_MEMORY_MIB)


def leak_exhaustion(start: float) -> float:
    """Unix time the noiseless ``leak`` shape reaches the GPU's memory."""
    return start + (GPU_MEMORY_MIB - LEAK_START_MIB) / LEAK_RATE_MIB_PER_H * HOUR


@dataclass(frozen=True, slots=True, eq=False)
class GpuHistory:
    node: str
    gpu: int
    shape: str
    namespace: str
    pods: tuple[str, ...]
    times: np.ndarray
    used: np.ndarray
    util: np.ndarray

    @property
    def uuid(self) -> str:
        return f"GPU-{self.node}-{self.gpu:02d}"

    @property
    def free(self) -> np.ndarray:
        return GPU_MEMORY_MIB - self.used


@dataclass(frozen=True, slots=True)
class Fleet:
    start: float
    end: float
    step_s: float
    gpus: tuple[GpuHistory, ...]
    extra: tuple[str, ...] = field(default=())  # more OpenMetrics families, already formatted


def make_fleet(
    shapes: Sequence[str],
    *,
    hours: float = 12.0,
    step_s: float = 30.0,
    end: datetime = END,
    gpus_per_node: int = 8,
    shared: Iterable[int] = (),
    seed: int = 7,
    util_pct: float = 10.0,
) -> Fleet:
    """One GPU per entry of ``shapes``, on nodes of ``gpus_per_node``; GPUs whose position is in
    ``shared`` are held by two pods."""
    rng = np.random.default_rng(seed)
    stop = end.timestamp()
    begin = stop - hours * HOUR
    times = np.arange(begin, stop + 1e-6, step_s)
    rel_h = (times - begin) / HOUR
    shared_set = set(shared)
    gpus = []
    for i, name in enumerate(shapes):
        node, gpu = f"node-{i // gpus_per_node:03d}", i % gpus_per_node
        pods = (f"{name}-{i}",) if i not in shared_set else (f"{name}-{i}-a", f"{name}-{i}-b")
        util = np.clip(util_pct + rng.normal(0, 2.0, len(times)), 0, 100)
        gpus.append(GpuHistory(node, gpu, name, "ml", pods, times, shape(name, rel_h, rng), util))
    return Fleet(begin, stop, step_s, tuple(gpus))


def write_openmetrics(fleet: Fleet, out: TextIO, *, exported: bool = False) -> None:
    """DCGM families (FB used / free, GPU util) with ``pod`` or ``exported_pod`` labels."""
    prefix = "exported_" if exported else ""
    families = (
        ("DCGM_FI_DEV_FB_USED", lambda g: g.used),
        ("DCGM_FI_DEV_FB_FREE", lambda g: g.free),
        ("DCGM_FI_DEV_GPU_UTIL", lambda g: g.util),
    )
    for metric, values_of in families:
        out.write(f"# TYPE {metric} gauge\n")
        for g in fleet.gpus:
            values = values_of(g)
            for pod in g.pods:
                labels = (
                    f'gpu="{g.gpu}",UUID="{g.uuid}",Hostname="{g.node}",'
                    f'modelName="NVIDIA H100 80GB HBM3",{prefix}namespace="{g.namespace}",'
                    f'{prefix}pod="{pod}",{prefix}container="main"'
                )
                if exported:
                    labels += ',namespace="gpu-operator",pod="dcgm-exporter-x"'
                lines = [
                    f"{metric}{{{labels}}} {v:.1f} {int(t)}\n"
                    for t, v in zip(g.times, values, strict=True)
                ]
                out.writelines(lines)
    for block in fleet.extra:
        out.write(block)
    out.write("# EOF\n")


def gauge_family(
    metric: str, series: Sequence[tuple[dict[str, str], np.ndarray, np.ndarray]]
) -> str:
    """An OpenMetrics gauge family from (labels, times, values) triples."""
    parts = [f"# TYPE {metric} gauge\n"]
    for labels, times, values in series:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        parts.extend(
            f"{metric}{{{text}}} {v:g} {int(t)}\n" for t, v in zip(times, values, strict=True)
        )
    return "".join(parts)


@dataclass
class PrometheusServer:
    url: str
    process: subprocess.Popen[bytes]
    data_dir: Path


@dataclass(frozen=True, slots=True)
class RuleBackfill:
    """Recording rules (the text of one rule file) evaluated from ``start`` to ``end`` over the
    raw history and written as blocks (``promtool tsdb create-blocks-from rules``)."""

    text: str
    start: float
    end: float


def backfill_openmetrics(openmetrics: Path, data: Path) -> None:
    """``promtool tsdb create-blocks-from openmetrics`` into ``data``."""
    done = subprocess.run(
        [
            require_binary("promtool"),
            *("tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(data)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {done.stderr or done.stdout}")


def backfill_rules(url: str, rules: Sequence[RuleBackfill], rule_file: Path, blocks: Path) -> None:
    """Each of ``rules`` evaluated by the Prometheus at ``url`` (its query API, so Prometheus's
    own evaluation) and written as blocks into ``blocks`` by ``promtool tsdb create-blocks-from
    rules``, one after the other, each rule text written to the same ``rule_file`` (a group's
    evaluation times are offset by a hash of its name and file: parts share their times)."""
    for part in rules:
        rule_file.write_text(part.text)
        done = subprocess.run(
            [
                require_binary("promtool"),
                *("tsdb", "create-blocks-from", "rules"),
                f"--start={part.start:.0f}",
                f"--end={part.end:.0f}",
                f"--url={url}",
                f"--output-dir={blocks}",
                "--quiet",
                str(rule_file),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"promtool rules backfill failed: {done.stderr or done.stdout}")


@contextmanager
def serve_tsdb(
    data: Path, workdir: Path | None = None, *, query_timeout: str = "2m"
) -> Iterator[PrometheusServer]:
    """A Prometheus serving the TSDB in ``data`` on 127.0.0.1 (no scrapes) until the block ends;
    ``query_timeout``: its own limit on one query (``--query.timeout``, 2m by default)."""
    prometheus = require_binary("prometheus")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        config = Path(tmp) / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = Path(tmp) / "prometheus.log"
        with log.open("ab") as err:
            proc = subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={data}",
                    "--storage.tsdb.retention.time=100y",
                    f"--web.listen-address=127.0.0.1:{port}",
                    f"--query.timeout={query_timeout}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:
            wait_ready("prometheus", url, proc, log, timeout_s=300, interval_s=0.1)
            yield PrometheusServer(url, proc, data)
        finally:
            stop_process(proc)


@contextmanager
def prometheus_server(
    openmetrics: Path,
    workdir: Path | None = None,
    *,
    rules: Sequence[RuleBackfill] = (),
) -> Iterator[PrometheusServer]:
    """Backfill ``openmetrics`` into a fresh TSDB and serve it on 127.0.0.1 until the block ends.

    ``rules``: recording rules backfilled from the served raw history (:func:`backfill_rules`);
    the server is then restarted on the raw and the recorded blocks."""
    require_binary("promtool")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        backfill_openmetrics(openmetrics, data)
        if rules:
            blocks = Path(tmp) / "recorded"
            with serve_tsdb(data, Path(tmp)) as server:
                backfill_rules(server.url, rules, Path(tmp) / "rules.yaml", blocks)
            for block in blocks.iterdir():
                block.rename(data / block.name)
        with serve_tsdb(data, Path(tmp)) as server:
            yield server
