"""The workload mix: the pod shapes a cluster typically sees, with their frequencies.

FGD and the fragmentation report measure free GPU capacity against this mix: capacity that
the typical pod could not use is fragmented.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI


@dataclass(frozen=True, slots=True)
class Shape:
    cpu_milli: int
    num_gpu: int
    gpu_milli: int
    gpu_models: frozenset[str] = frozenset()

    @classmethod
    def of(cls, pod: Pod) -> Shape:
        return cls(pod.cpu_milli, pod.num_gpu, pod.gpu_milli if pod.num_gpu else 0, pod.gpu_models)


@dataclass(frozen=True, slots=True)
class WorkloadMix:
    """Shapes and their frequencies (summing to 1)."""

    shapes: tuple[Shape, ...]
    weights: tuple[float, ...]

    @classmethod
    def from_pods(cls, pods: Iterable[Pod], coverage: float = 0.95) -> WorkloadMix:
        """The most frequent shapes that together cover ``coverage`` of the pods."""
        counts = Counter(Shape.of(p) for p in pods)
        return cls.from_counts(counts, coverage)

    @classmethod
    def from_counts(cls, counts: Counter[Shape], coverage: float = 0.95) -> WorkloadMix:
        total = sum(counts.values())
        if total == 0:
            return cls.default()
        chosen: list[tuple[Shape, int]] = []
        covered = 0
        # most_common is stable for ties in insertion order; sort for determinism.
        for shape, n in sorted(counts.items(), key=lambda kv: (-kv[1], _shape_order(kv[0]))):
            chosen.append((shape, n))
            covered += n
            if covered >= coverage * total:
                break
        norm = sum(n for _, n in chosen)
        return cls(tuple(s for s, _ in chosen), tuple(n / norm for _, n in chosen))

    @classmethod
    def observed(cls, pods: Iterable[Pod]) -> WorkloadMix:
        """The mix of the GPU pods a cluster holds (bound and pending), or :meth:`default` when
        it holds none — the one mix every part of defrag scores a cluster against, so that
        ``report``, ``/metrics``, alerts, the planner and the extender give one FGD figure."""
        gpu_pods = [p for p in pods if p.num_gpu]
        return cls.from_pods(gpu_pods) if gpu_pods else cls.default()

    @classmethod
    def default(cls) -> WorkloadMix:
        """Whole-GPU jobs of 1, 2, 4 and 8 GPUs, equally likely (when nothing is known)."""
        shapes = tuple(Shape(0, k, GPU_MILLI) for k in (1, 2, 4, 8))
        return cls(shapes, tuple(0.25 for _ in shapes))

    def __len__(self) -> int:
        return len(self.shapes)


def _shape_order(shape: Shape) -> tuple[int, int, int, tuple[str, ...]]:
    return (shape.num_gpu, shape.gpu_milli, shape.cpu_milli, tuple(sorted(shape.gpu_models)))
