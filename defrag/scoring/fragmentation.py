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
from defrag.model.carried import Carried
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
    _dict: dict[str, Any] | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )
    """:meth:`to_dict`'s answer, made once: a node unchanged between two reports is the same
    (frozen) object in both, and a plan's report lists every node."""

    @property
    def partly_used(self) -> bool:
        return 0 < self.free_share < self.total

    def to_dict(self) -> dict[str, Any]:
        made = self._dict
        if made is None:
            made = {
                "name": self.name,
                "total": self.total,
                "free": self.free,
                "free_share": round(self.free_share, 3),
                "largest_job": self.largest_job,
                "stranded": {str(k): v for k, v in self.stranded.items()},
                "fgd_fragmented": round(self.fgd_fragmented, 3),
            }
            object.__setattr__(self, "_dict", made)
        return {**made, "stranded": dict(made["stranded"])}  # the caller's own


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
    alert evidence, ``defrag report`` and the planner give one number.

    A cycle asks for the same snapshot's report more than once (its own figures, the
    fragmentation rule, the planner's ``before``): the last report of a cluster is kept and
    handed out again for the same cluster (by identity: a cluster is never changed in place),
    an equal mix and equal sizes. Bare arrays (a plan's workspace, which changes in place) are
    measured every time."""
    if not isinstance(target, Cluster):
        return _measure(target, mix, tuple(sizes))
    key = (mix, tuple(sizes))

    def step(kept: _Kept | None) -> _Kept:
        if kept is not None and kept[0] is target and kept[1] == key:
            return kept
        return (target, key, _measure(target.arrays, mix, key[1]))

    return _kept_report.step(step)[2]


_ReportKey = tuple[WorkloadMix, tuple[int, ...]]
_Kept = tuple[Cluster, _ReportKey, FragmentationReport]
_kept_report: Carried[_Kept] = Carried()


def _measure(arrays: NodeArrays, mix: WorkloadMix, sizes: tuple[int, ...]) -> FragmentationReport:
    """:func:`fragmentation_report` of ``arrays``, measured."""
    gpu_rows = arrays.gpu_total > 0
    free_whole = arrays.free_whole_count()
    share = arrays.free_share() / GPU_MILLI
    largest = arrays.largest_job()
    placeable = {k: placeable_per_node(arrays, k) for k in sizes}
    stranded = {k: free_whole - k * placeable[k] for k in sizes}
    frag = fgd_node_fragmentation(arrays, mix) / GPU_MILLI
    idle = float(share[gpu_rows].sum())
    rows = np.flatnonzero(gpu_rows)
    columns = _Columns(
        names=arrays.names,
        sizes=sizes,
        rows=rows,
        total=arrays.gpu_total[rows].astype(np.int64),
        free=free_whole[rows].astype(np.int64),
        share=share[rows],
        largest=largest[rows],
        stranded=np.stack([stranded[k][rows] for k in sizes]).astype(np.int64)
        if sizes
        else np.zeros((0, len(rows)), dtype=np.int64),
        frag=frag[rows],
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
        nodes=_node_rows(columns),
        pools=pool_usage(arrays),
    )


@dataclass(frozen=True, slots=True, eq=False)
class _Columns:
    """Every GPU node's figures as columns (``rows``: their rows in the arrays)."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    rows: IntArray
    total: IntArray
    free: IntArray
    share: FloatArray
    largest: IntArray
    stranded: IntArray
    """[sizes, nodes]"""
    frag: FloatArray

    def unchanged(self, last: _Columns) -> np.ndarray:
        """[nodes] whether each node's figures equal ``last``'s (the same nodes, in order)."""
        same = (
            (self.rows == last.rows)
            & (self.total == last.total)
            & (self.free == last.free)
            & (self.share == last.share)
            & (self.largest == last.largest)
            & (self.frag == last.frag)
        )
        return np.asarray(same & (self.stranded == last.stranded).all(axis=0))


_Rows = tuple[_Columns, tuple[NodeFragmentation, ...]]
_kept_rows: Carried[_Rows] = Carried()


def _node_rows(columns: _Columns) -> tuple[NodeFragmentation, ...]:
    """Every GPU node's :class:`NodeFragmentation`. Between two measures most nodes did not
    change (a cycle's snapshots, a plan's before and after): the last measure's rows are kept,
    and a node whose figures all equal its kept row's gets that (frozen) row again."""
    return _kept_rows.step(lambda kept: (columns, _rows_from(columns, kept)))[1]


def _rows_from(columns: _Columns, kept: _Rows | None) -> tuple[NodeFragmentation, ...]:
    reuse: list[bool] | None = None
    if (
        kept is not None
        and kept[0].names is columns.names
        and kept[0].sizes == columns.sizes
        and len(kept[0].rows) == len(columns.rows)
    ):
        reuse = columns.unchanged(kept[0]).tolist()
    if kept is None or reuse is None or not any(reuse):
        return tuple(_made(columns, range(len(columns.rows))))
    old = kept[1]
    fresh = iter(_made(columns, [i for i, same in enumerate(reuse) if not same]))
    return tuple(old[i] if same else next(fresh) for i, same in enumerate(reuse))


def _made(columns: _Columns, at: Sequence[int]) -> list[NodeFragmentation]:
    """The rows ``at`` (positions among the GPU nodes) made from the columns."""
    if not len(at):
        return []
    pick = np.asarray(at, dtype=np.int64)
    names = columns.names
    sizes = columns.sizes
    strandeds = columns.stranded[:, pick].T.tolist()
    return [
        NodeFragmentation(
            name=names[row],
            total=total,
            free=free,
            free_share=share,
            largest_job=largest,
            stranded=dict(zip(sizes, stranded_k, strict=True)),
            fgd_fragmented=frag,
        )
        for row, total, free, share, largest, stranded_k, frag in zip(
            columns.rows[pick].tolist(),
            columns.total[pick].tolist(),
            columns.free[pick].tolist(),
            columns.share[pick].tolist(),
            columns.largest[pick].tolist(),
            strandeds,
            columns.frag[pick].tolist(),
            strict=True,
        )
    ]


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
