"""NVLink topology: the domains of a node's GPUs and the annotation that publishes them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from defrag.adapters.nvml import GpuDevice
from defrag.model.resources import NVLINK_DOMAINS_ANNOTATION

# --- topology --------------------------------------------------------------------------------


def nvlink_domains(devices: Sequence[GpuDevice]) -> tuple[tuple[int, ...], ...]:
    """Connected components of the NVLink graph over GPU indices, sorted by their first GPU.

    Vertices are the GPUs and the non-GPU endpoints their links reach (NVSwitches, or an
    endpoint an old driver cannot name); a link to an IBM NPU (a CPU) joins nothing.
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    gpu_bus = {d.bus_id for d in devices}
    for dev in devices:
        find(dev.bus_id)
        for link in dev.links:
            if link.remote_bus_id in gpu_bus:
                union(dev.bus_id, link.remote_bus_id)
            elif link.remote_kind in ("switch", "unknown"):
                union(dev.bus_id, f"endpoint:{link.remote_bus_id}")
            # "npu", or a "gpu" this process cannot see: no GPU-to-GPU path through it.
    groups: dict[str, list[int]] = {}
    for dev in devices:
        groups.setdefault(find(dev.bus_id), []).append(dev.index)
    return tuple(sorted((tuple(sorted(g)) for g in groups.values()), key=lambda g: g[0]))


def runs(group: Sequence[int]) -> list[tuple[int, int]]:
    """Contiguous runs of sorted indices: (0,1,2,5) → [(0, 2), (5, 5)]."""
    out: list[tuple[int, int]] = []
    for i in sorted(group):
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def format_domains(domains: Sequence[Sequence[int]]) -> tuple[str, tuple[str, ...]]:
    """The annotation text, and a note for each domain that had to be split into runs."""
    parts: list[tuple[int, str]] = []
    notes: list[str] = []
    for group in domains:
        group_runs = runs(group)
        if len(group_runs) > 1:
            notes.append(
                f"NVLink domain {list(group)} is not contiguous; published as "
                f"{len(group_runs)} domains (claims less NVLink than there is)"
            )
        for lo, hi in group_runs:
            parts.append((lo, str(lo) if lo == hi else f"{lo}-{hi}"))
    return ",".join(text for _, text in sorted(parts)), tuple(notes)


@dataclass(frozen=True, slots=True)
class Topology:
    devices: tuple[GpuDevice, ...]
    domains: tuple[tuple[int, ...], ...]
    annotation: str
    """The annotation value ("" when the node has no GPU)."""
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "annotation": {NVLINK_DOMAINS_ANNOTATION: self.annotation or None},
            "domains": [list(d) for d in self.domains],
            "notes": list(self.notes),
            "gpus": [
                {
                    "index": d.index,
                    "uuid": d.uuid,
                    "name": d.name,
                    "bus_id": d.bus_id,
                    "memory_total_mib": d.memory_total_mib,
                    "memory_used_mib": d.memory_used_mib,
                    "nvlinks": len(d.links),
                    "processes": [{"pid": p.pid, "used_mib": p.used_mib} for p in d.processes],
                }
                for d in self.devices
            ],
        }


def read_topology(devices: Sequence[GpuDevice]) -> Topology:
    domains = nvlink_domains(devices)
    annotation, notes = format_domains(domains)
    return Topology(tuple(devices), domains, annotation, notes)


# --- publishing ------------------------------------------------------------------------------
