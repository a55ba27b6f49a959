"""The workload mix: the pod shapes a cluster typically sees, with their frequencies.

FGD and the fragmentation report measure free GPU capacity against this mix: capacity that
the typical pod could not use is fragmented.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from defrag.model.carried import Carried
from defrag.model.podchanges import walked
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
        counts = _observed_counts(pods)
        return cls.from_counts(counts) if counts else cls.default()

    @classmethod
    def default(cls) -> WorkloadMix:
        """Whole-GPU jobs of 1, 2, 4 and 8 GPUs, equally likely (when nothing is known)."""
        shapes = tuple(Shape(0, k, GPU_MILLI) for k in (1, 2, 4, 8))
        return cls(shapes, tuple(0.25 for _ in shapes))

    def __len__(self) -> int:
        return len(self.shapes)


def _shape_order(shape: Shape) -> tuple[int, int, int, tuple[str, ...]]:
    return (shape.num_gpu, shape.gpu_milli, shape.cpu_milli, tuple(sorted(shape.gpu_models)))


REBUILD_SHARE = 0.05
"""Past this share of the pods changed since the last count, the shapes are counted anew."""


class _Kept:
    """The last pods counted (a copy: the caller's mapping may change after) and their GPU
    pods' shape counts."""

    def __init__(self, pods: dict[str, Pod], counts: Counter[Shape]) -> None:
        self.pods = pods
        self.counts = counts


_kept: Carried[_Kept] = Carried()


def _counted(pods: Iterable[Pod]) -> Counter[Shape]:
    return Counter(Shape.of(p) for p in pods if p.num_gpu)


def _observed_counts(pods: Iterable[Pod]) -> Counter[Shape]:
    """The GPU pods' shape counts. A cluster's pods come as its mapping's values, and between
    two snapshots a few pods change while every other pod is the same (frozen) object: the last
    count is kept and brought up to date by the pods whose object differs, by key. The counts
    are the same as counted anew: a shape's count is the number of its pods, whatever the order
    they were counted in (and the mix sorts the shapes by count and shape alone)."""
    # a dict's values view holds its dict (``mapping``, read-only): the pods by key
    mapping = getattr(pods, "mapping", None)
    if not isinstance(mapping, Mapping):
        return _counted(pods)

    def step(last: _Kept | None) -> _Kept:
        counts = _updated(last, mapping) if last is not None else None
        if counts is None:
            counts = _counted(mapping.values())
        return _Kept(_copy(mapping), counts)

    with _kept.lock:  # the next step changes the counts in place: copied before it
        return Counter(_kept.step(step).counts)


def _copy(mapping: Mapping[str, Pod]) -> dict[str, Pod]:
    """A copy of ``mapping``: a dict's own (a read-only proxy copies the dict it wraps, in C)
    where it has one, many times faster than a copy read key by key."""
    copy = getattr(mapping, "copy", None)
    made = copy() if copy is not None else None
    return made if isinstance(made, dict) else dict(mapping)


def _updated(last: _Kept, new: Mapping[str, Pod]) -> Counter[Shape] | None:
    """``last``'s counts brought up to ``new`` in place, or None when many pods changed."""
    old = last.pods
    changed = walked(old, new)  # against a copy: the mapping is no cluster's own object
    if len(changed) > max(int(len(new) * REBUILD_SHARE), 1):
        return None
    counts = last.counts
    for key in changed:
        before, after = old.get(key), new.get(key)
        if before is not None and before.num_gpu:
            shape = Shape.of(before)
            counts[shape] -= 1
            if counts[shape] <= 0:
                del counts[shape]
        if after is not None and after.num_gpu:
            counts[Shape.of(after)] += 1
    return counts
