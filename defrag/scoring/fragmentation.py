"""Fragmentation, measured (docs/concepts.md): per node and per cluster, for the job sizes
that matter.

- free GPUs (entirely free) and free share (partial GPUs included), whole free nodes;
- the largest placeable job (NVLink rules included);
- placeable[k]: how many k-GPU jobs fit right now, as a real packing count per node — within a
  domain ⌊free/k⌋ per domain; for k larger than a domain, ⌊full domains / ⌈k/size⌉⌋;
- stranded[k]: entirely free GPUs that no k-GPU job can use (free − k × placeable[k]);
- the FGD measure: free GPU capacity the workload mix could not use, as GPUs and as % of idle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from defrag.model.arrays import FloatArray, IntArray, NodeArrays
from defrag.model.cluster import Cluster
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix
from defrag.scoring.fgd_model import FragModel

DEFAULT_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class NodeFragmentation:
    name: str
    total: int
    free: int
    free_share: float
    largest_job: int
    stranded: Mapping[int, int] = field(default_factory=dict, hash=False)
    fgd_fragmented: float = 0.0

    @property
    def partly_used(self) -> bool:
        return 0 < self.free_share < self.total

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "total": self.total,
            "free": self.free,
            "free_share": round(self.free_share, 3),
            "largest_job": self.largest_job,
            "stranded": {str(k): v for k, v in self.stranded.items()},
            "fgd_fragmented": round(self.fgd_fragmented, 3),
        }


@dataclass(frozen=True, slots=True)
class PoolUsage:
    """One GPU pool resource (a MIG profile, time-sliced replicas) across the cluster: its units
    never count as whole GPUs; ``largest_request`` is the most units one pod can get now."""

    resource: str
    total: int
    free: int
    nodes: int
    largest_request: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "free": self.free,
            "nodes": self.nodes,
            "largest_request": self.largest_request,
        }


@dataclass(frozen=True, slots=True)
class FragmentationReport:
    total_gpus: int
    free_gpus: int
    free_gpu_share: float
    whole_free_nodes: int
    gpu_nodes: int
    largest_placeable_job: int
    placeable: Mapping[int, int] = field(hash=False)
    stranded: Mapping[int, int] = field(hash=False)
    fgd_fragmented_gpus: float
    fgd_frag_pct_of_idle: float
    nodes: tuple[NodeFragmentation, ...]
    pools: tuple[PoolUsage, ...] = ()

    @property
    def allocation_pct(self) -> float:
        return 100.0 * (1 - self.free_gpu_share / self.total_gpus) if self.total_gpus else 0.0

    def to_dict(self, with_nodes: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "total_gpus": self.total_gpus,
            "free_gpus": self.free_gpus,
            "free_gpu_share": round(self.free_gpu_share, 3),
            "allocation_pct": round(self.allocation_pct, 3),
            "whole_free_nodes": self.whole_free_nodes,
            "gpu_nodes": self.gpu_nodes,
            "largest_placeable_job": self.largest_placeable_job,
            "placeable": {str(k): v for k, v in self.placeable.items()},
            "stranded": {str(k): v for k, v in self.stranded.items()},
            "fgd_fragmented_gpus": round(self.fgd_fragmented_gpus, 3),
            "fgd_frag_pct_of_idle": round(self.fgd_frag_pct_of_idle, 3),
        }
        out["pools"] = {p.resource: p.to_dict() for p in self.pools}
        if with_nodes:
            out["nodes"] = [n.to_dict() for n in self.nodes]
        return out


def placeable_per_node(arrays: NodeArrays, k: int) -> IntArray:
    """[N] disjoint k-GPU jobs each node could take right now (NVLink rules included)."""
    dom_free = arrays.domain_free()
    size = arrays.domain_size
    max_dom = size.max(axis=1)
    within = (dom_free // k).sum(axis=1)
    full = ((dom_free == size) & (size > 0)).sum(axis=1)
    per_job = np.maximum(-(-k // np.maximum(max_dom, 1)), 1)
    spanning = full // per_job
    return np.asarray(np.where(k <= max_dom, within, spanning), dtype=np.int64)


def fgd_node_fragmentation(arrays: NodeArrays, mix: WorkloadMix) -> FloatArray:
    """FGD fragmentation of every node against ``mix``, in milli-GPU."""
    fm = FragModel.build(mix, arrays.models)
    return fm.node_frag(arrays.gpu_free, arrays.cpu_free, arrays.model_code)


def fragmentation_report(
    target: Cluster | NodeArrays,
    mix: WorkloadMix,
    sizes: Sequence[int] = DEFAULT_SIZES,
) -> FragmentationReport:
    """The fragmentation of ``target``; its FGD figure is measured against ``mix`` — the
    snapshot's :class:`~defrag.scoring.profile.ScoringProfile` ``mix``, so that ``/metrics``,
    alert evidence, ``defrag report`` and the planner give one number."""
    arrays = target.arrays if isinstance(target, Cluster) else target
    gpu_rows = arrays.gpu_total > 0
    free_whole = arrays.free_whole_count()
    share = arrays.free_share() / GPU_MILLI
    largest = arrays.largest_job()
    placeable = {k: placeable_per_node(arrays, k) for k in sizes}
    stranded = {k: free_whole - k * placeable[k] for k in sizes}
    frag = fgd_node_fragmentation(arrays, mix) / GPU_MILLI
    idle = float(share[gpu_rows].sum())
    nodes = tuple(
        NodeFragmentation(
            name=arrays.names[i],
            total=int(arrays.gpu_total[i]),
            free=int(free_whole[i]),
            free_share=float(share[i]),
            largest_job=int(largest[i]),
            stranded={k: int(stranded[k][i]) for k in sizes},
            fgd_fragmented=float(frag[i]),
        )
        for i in np.flatnonzero(gpu_rows)
    )
    fragmented = float(frag[gpu_rows].sum())
    return FragmentationReport(
        total_gpus=int(arrays.gpu_total.sum()),
        free_gpus=int(free_whole.sum()),
        free_gpu_share=float(share.sum()),
        whole_free_nodes=int(((free_whole == arrays.gpu_total) & gpu_rows).sum()),
        gpu_nodes=int(gpu_rows.sum()),
        largest_placeable_job=int(largest.max(initial=0)),
        placeable={k: int(v.sum()) for k, v in placeable.items()},
        stranded={k: int(v.sum()) for k, v in stranded.items()},
        fgd_fragmented_gpus=fragmented,
        fgd_frag_pct_of_idle=100.0 * fragmented / idle if idle > 0 else 0.0,
        nodes=nodes,
        pools=pool_usage(arrays),
    )


def pool_usage(arrays: NodeArrays) -> tuple[PoolUsage, ...]:
    """Every GPU pool resource's units, free units and the largest request one node can take
    (schedulable nodes only)."""
    out = []
    for col, res in enumerate(arrays.pool_names):
        total = arrays.pool_total[:, col]
        free = np.where(arrays.schedulable, arrays.pool_free[:, col], 0)
        out.append(
            PoolUsage(
                resource=res,
                total=int(total.sum()),
                free=int(arrays.pool_free[:, col].sum()),
                nodes=int((total > 0).sum()),
                largest_request=int(free.max(initial=0)),
            )
        )
    return tuple(out)
