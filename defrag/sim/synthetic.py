"""A built-in cluster and workload shaped like the Alibaba openb trace, from a few parameters.

No trace data ships with the package: the defaults below are summary statistics of the openb
``default`` trace (Weng et al., ATC'23), rounded, so ``defrag simulate`` runs on a fresh
machine. Change them to describe another cluster.

Cluster (:data:`OPENB_LIKE_NODES`): node types with the openb mix of GPU count and model —
mostly 8-GPU nodes and 2-GPU nodes — scaled to ``scale`` × 150 nodes (771 GPUs at scale 1).

Workload (:class:`WorkloadParams`), per pod: a kind (CPU-only 13%, GPU-sharing 38%, whole GPUs
49%, of which ~1.8% are multi-GPU), then the kind's CPU request, GPU share, QoS class and an
optional GPU-model constraint, each drawn from a small table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from defrag.model.resources import Node, Pod
from defrag.model.units import GPU_MILLI
from defrag.sim.trace import QOS_PRIORITY


@dataclass(frozen=True, slots=True)
class NodeType:
    count: int
    """Nodes of this type at scale 1."""
    gpus: int
    model: str
    cpu_milli: int
    memory_mib: int


OPENB_LIKE_NODES: tuple[NodeType, ...] = (
    NodeType(68, 8, "G2", 96_000, 393_216),
    NodeType(48, 2, "T4", 104_000, 393_216),
    NodeType(16, 2, "P100", 64_000, 262_144),
    NodeType(5, 8, "G3", 128_000, 786_432),
    NodeType(4, 4, "V100M16", 32_000, 262_144),
    NodeType(4, 8, "V100M32", 96_000, 393_216),
    NodeType(2, 4, "T4", 96_000, 393_216),
    NodeType(3, 1, "V100M16", 8_000, 65_536),
)
"""openb's GPU node mix (1,213 nodes: 549 8×G2, 387 2×T4, 131 2×P100, 39 8×G3, …) at 1/8."""


def synthetic_nodes(
    scale: float = 1.0, types: tuple[NodeType, ...] = OPENB_LIKE_NODES
) -> tuple[Node, ...]:
    """The built-in cluster: each type's count × ``scale`` (at least one node per type)."""
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    nodes: list[Node] = []
    for t in types:
        for _ in range(max(1, round(t.count * scale))):
            nodes.append(
                Node(
                    name=f"node-{len(nodes):04d}",
                    cpu_milli=t.cpu_milli,
                    memory_mib=t.memory_mib,
                    num_gpu=t.gpus,
                    gpu_model=t.model if t.gpus else "",
                )
            )
    return tuple(nodes)


K = TypeVar("K", int, str)


def _weights(table: Mapping[K, float]) -> tuple[list[K], npt.NDArray[np.float64]]:
    keys = list(table)
    w = np.array([table[k] for k in keys], dtype=np.float64)
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be >= 0 and not all 0: {dict(table)}")
    return keys, w / w.sum()


@dataclass(frozen=True, slots=True)
class WorkloadParams:
    """Pod shape distribution (fractions need not sum to 1; they are normalised)."""

    kinds: Mapping[str, float] = field(
        default_factory=lambda: {
            "cpu": 0.13,
            "share": 0.38,
            "1": 0.48,
            "2": 0.002,
            "4": 0.002,
            "8": 0.005,
        }
    )
    """Pod kind: CPU-only, GPU-sharing, or that many whole GPUs."""
    share_milli: Mapping[int, float] = field(
        default_factory=lambda: {
            810: 0.35, 470: 0.24, 320: 0.11, 650: 0.08, 230: 0.05, 460: 0.04,
            590: 0.025, 160: 0.025, 550: 0.025, 220: 0.02, 370: 0.015, 110: 0.01,
        }
    )  # fmt: skip
    """GPU share of a sharing pod (milli-GPU)."""
    cpu_milli: Mapping[str, Mapping[int, float]] = field(
        default_factory=lambda: {
            "cpu": {12_500: 0.35, 32_000: 0.27, 8_000: 0.17, 15_400: 0.11, 16_500: 0.10},
            "share": {3_152: 0.3, 11_300: 0.2, 11_908: 0.2, 4_000: 0.15, 8_000: 0.15},
            "1": {3_152: 0.3, 11_300: 0.2, 11_908: 0.2, 4_000: 0.15, 8_000: 0.15},
            "2": {16_200: 0.6, 6_000: 0.2, 30_200: 0.2},
            "4": {32_200: 0.7, 32_000: 0.1, 60_200: 0.2},
            "8": {88_000: 0.45, 64_200: 0.45, 64_000: 0.1},
        }
    )
    """CPU request (milli-CPU) per kind."""
    memory_mib_per_cpu: int = 4096
    """Memory request per requested CPU core."""
    qos: Mapping[str, Mapping[str, float]] = field(
        default_factory=lambda: {
            "small": {"LS": 0.57, "BE": 0.42, "Burstable": 0.01, "Guaranteed": 0.001},
            "multi": {"LS": 0.6, "Burstable": 0.4},
        }
    )
    """QoS class of single-GPU-or-less pods (``small``) and of multi-GPU pods (``multi``)."""
    model_constraint: float = 0.02
    """Fraction of GPU pods that name allowed GPU models."""
    model_choices: Mapping[str, float] = field(
        default_factory=lambda: {"T4": 0.5, "G2": 0.2, "P100": 0.1, "V100M16|V100M32": 0.2}
    )

    def __post_init__(self) -> None:
        for kind in self.kinds:
            if kind not in ("cpu", "share") and not kind.isdigit():
                raise ValueError(f"unknown pod kind {kind!r}: use cpu, share or a GPU count")
            if kind not in self.cpu_milli:
                raise ValueError(f"no CPU table for pod kind {kind!r}")


def synthetic_pods(
    n: int, seed: int = 0, params: WorkloadParams | None = None, prefix: str = "pod"
) -> tuple[Pod, ...]:
    """``n`` pods drawn from ``params`` with a seeded generator."""
    if n <= 0:
        raise ValueError(f"n must be > 0, got {n}")
    p = params or WorkloadParams()
    rng = np.random.default_rng(seed)
    kinds, kind_w = _weights(p.kinds)
    shares, share_w = _weights(p.share_milli)
    models, model_w = _weights(p.model_choices)
    chosen = rng.choice(len(kinds), size=n, p=kind_w)
    width = len(str(n - 1))
    pods: list[Pod] = []
    for i, k in enumerate(chosen):
        kind = kinds[int(k)]
        cpus, cpu_w = _weights(p.cpu_milli[kind])
        cpu = int(cpus[int(rng.choice(len(cpus), p=cpu_w))])
        if kind == "cpu":
            num_gpu, milli = 0, GPU_MILLI
        elif kind == "share":
            num_gpu, milli = 1, int(shares[int(rng.choice(len(shares), p=share_w))])
        else:
            num_gpu, milli = int(kind), GPU_MILLI
        qos_table = p.qos["multi" if num_gpu > 1 else "small"]
        qos_keys, qos_w = _weights(qos_table)
        qos = str(qos_keys[int(rng.choice(len(qos_keys), p=qos_w))])
        gpu_models: frozenset[str] = frozenset()
        if num_gpu and rng.random() < p.model_constraint:
            spec = str(models[int(rng.choice(len(models), p=model_w))])
            gpu_models = frozenset(spec.split("|"))
        pods.append(
            Pod(
                name=f"{prefix}-{i:0{width}d}",
                namespace="synthetic",
                num_gpu=num_gpu,
                gpu_milli=milli,
                cpu_milli=cpu,
                memory_mib=cpu * p.memory_mib_per_cpu // 1000,
                gpu_models=gpu_models,
                qos=qos,
                priority=QOS_PRIORITY.get(qos, 0),
            )
        )
    return tuple(pods)
