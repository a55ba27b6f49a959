"""The node agent (``defrag agent``, a DaemonSet on GPU nodes).

It reads the node's GPUs through NVML, derives the NVLink domains (connected components of the
NVLink graph: GPUs linked directly or through a common NVSwitch share a domain; a GPU with no
NVLink is a domain of its own), publishes them as the node annotation
``defrag.io/nvlink-domains`` (``"0-3,4-7"``), and serves per-GPU memory and per-process usage
on ``/metrics`` for clusters without the DCGM exporter.

The annotation format (parsed by :mod:`defrag.adapters.kube_convert`) is comma-separated
domains, each one GPU index or an inclusive range ``a-b``. A domain whose GPU indices are not
contiguous cannot be written that way: it is published as its contiguous runs, which claims
less NVLink than there is (never more) — the scheduler then keeps multi-GPU pods inside a run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from defrag.adapters.health import Probes
from defrag.adapters.nvml import GpuDevice, NvmlInventory
from defrag.agent.topology import Topology, nvlink_domains, read_topology
from defrag.model.resources import NVLINK_DOMAINS_ANNOTATION
from defrag.model.status import Status

log = logging.getLogger(__name__)

EXIT_NO_NVML = 3
"""``defrag agent`` exit status when NVML (the NVIDIA driver) is not available."""
MIB = 2**20


class NodeAnnotator(Protocol):
    def annotate_node(self, node: str, annotations: Mapping[str, str | None]) -> None:
        """Set (or, with None, remove) annotations on ``node``."""
        ...


# The live implementation is defrag.adapters.kube.KubeActuator (patch nodes, with retries).


# --- metrics ---------------------------------------------------------------------------------


class GpuCollector:
    """Reads NVML on every scrape: memory per GPU and per process, and each GPU's domain."""

    def __init__(self, node: str, read: Callable[[], tuple[GpuDevice, ...]]) -> None:
        self.node = node
        self.read = read
        self.lock = threading.Lock()
        self.errors = 0

    def describe(self) -> list[Metric]:
        return []  # read on demand; do not scrape NVML at registration

    def collect(self) -> Iterator[Metric]:
        try:
            with self.lock:
                devices = self.read()
        except Exception as exc:  # one bad scrape must not take /metrics down
            self.errors += 1
            log.warning("NVML read failed during scrape: %s", exc)
            devices = ()
        gpu_labels = ["node", "gpu", "uuid", "model"]
        total = GaugeMetricFamily(
            "defrag_gpu_memory_total_bytes", "GPU memory, total (NVML).", labels=gpu_labels
        )
        used = GaugeMetricFamily(
            "defrag_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=gpu_labels
        )
        proc = GaugeMetricFamily(
            "defrag_gpu_process_memory_used_bytes",
            "GPU memory held by one process (NVML compute processes; host PID).",
            labels=["node", "gpu", "uuid", "pid"],
        )
        domain = GaugeMetricFamily(
            "defrag_gpu_nvlink_domain_info",
            "1 for each GPU, labelled with the NVLink domain it belongs to (as published).",
            labels=["node", "gpu", "uuid", "domain"],
        )
        errors = GaugeMetricFamily(
            "defrag_agent_nvml_scrape_errors", "NVML reads that failed during a scrape."
        )
        errors.add_metric([], self.errors)
        domain_of = {i: n for n, group in enumerate(nvlink_domains(devices)) for i in group}
        for d in devices:
            base = [self.node, str(d.index), d.uuid]
            total.add_metric([*base, d.name], d.memory_total_mib * MIB)
            used.add_metric([*base, d.name], d.memory_used_mib * MIB)
            domain.add_metric([*base, str(domain_of.get(d.index, d.index))], 1)
            for p in d.processes:
                if p.used_mib >= 0:
                    proc.add_metric([*base, str(p.pid)], p.used_mib * MIB)
        yield from (total, used, proc, domain, errors)


# --- the agent -------------------------------------------------------------------------------


@dataclass(slots=True)
class Agent:
    """Publishes the node's NVLink domains when they change, every ``interval_s``."""

    node: str
    inventory: NvmlInventory
    annotator: NodeAnnotator | None
    interval_s: float = 300.0
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    published: str | None = None
    last_error: str | None = None
    """Why the last sync failed (None after a good one): /readyz says it."""
    _publish_errors: Counter | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._publish_errors = Counter(
            "defrag_agent_publish_errors",
            "Failed patches of the node annotation.",
            registry=self.registry,
        )
        self.registry.register(GpuCollector(self.node, self._devices))

    def _devices(self) -> tuple[GpuDevice, ...]:
        with self._lock:
            return self.inventory.devices()

    def sync_once(self) -> Topology:
        """Read the topology; patch the annotation when it differs from what was published."""
        topology = read_topology(self._devices())
        for note in topology.notes:
            log.warning("%s", note)
        value = topology.annotation or None
        if self.annotator is not None and value != self.published:
            try:
                self.annotator.annotate_node(self.node, {NVLINK_DOMAINS_ANNOTATION: value})
            except Exception:
                assert self._publish_errors is not None
                self._publish_errors.inc()
                raise
            self.published = value
            log.info("node %s: %s=%r", self.node, NVLINK_DOMAINS_ANNOTATION, value)
        return topology

    def ready(self) -> Status:
        """Readiness: the last sync read the GPUs and published what it read."""
        if self.last_error is not None:
            return Status.fail(f"last sync failed: {self.last_error}")
        return Status.success()

    def probes(self) -> Probes:
        return Probes.of_registry(self.registry, ready=self.ready)

    def run(self, stop: threading.Event) -> None:
        """Sync now and every ``interval_s`` until ``stop``; a failed sync is retried next time."""
        while True:
            try:
                self.sync_once()
                self.last_error = None
            except Exception as exc:
                self.last_error = str(exc)
                log.error("agent sync failed: %s", exc)
            if stop.wait(self.interval_s):
                return
