"""In-node GPU choice: which GPU slots a pod takes once its node is chosen.

Whole-GPU pods take the NVLink domain with the fewest free GPUs that still fits (so domains do
not fragment from the inside); GPU-sharing pods take the GPU with the least free share that
still fits (best fit). Ties go to the lowest index.
"""

from __future__ import annotations

from defrag.model.arrays import NodeArrays
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI


class NoGpuFit(ValueError):
    """The chosen node cannot give the pod its GPUs (a filter bug if it ever happens)."""


def best_fit_gpus(pod: Pod, arrays: NodeArrays, row: int) -> tuple[int, ...]:
    if pod.num_gpu == 0:
        return ()
    if pod.gpu_milli < GPU_MILLI:
        total = int(arrays.gpu_total[row])
        free: list[int] = arrays.gpu_free[row, :total].tolist()  # ≤ 8 GPUs: lists beat numpy
        fits = [g for g in range(total) if free[g] >= pod.gpu_milli]
        if len(fits) < pod.num_gpu:
            raise NoGpuFit(f"{pod.key}: node {arrays.names[row]} has no GPU with enough free share")
        order = sorted(fits, key=lambda g: (free[g], g))
        return tuple(sorted(order[: pod.num_gpu]))
    return whole_gpus(pod.num_gpu, arrays, row)


def whole_gpus(k: int, arrays: NodeArrays, row: int) -> tuple[int, ...]:
    """k entirely free GPUs on ``row``, respecting NVLink domains (docs/concepts.md)."""
    total = int(arrays.gpu_total[row])
    free: list[int] = arrays.gpu_free[row, :total].tolist()
    domain: list[int] = arrays.gpu_domain[row, :total].tolist()
    sizes: list[int] = arrays.domain_size[row].tolist()
    if len(sizes) == 1:  # one NVLink domain per node (NVSwitch): the first k free GPUs
        return _first_free(k, free, domain, sizes[0], arrays.names[row])
    n_dom = sum(1 for size in sizes if size > 0)
    free_in: list[list[int]] = [[] for _ in range(n_dom)]
    for g in range(total):
        if free[g] >= GPU_MILLI and 0 <= domain[g] < n_dom:
            free_in[domain[g]].append(g)
    if k <= max(sizes, default=0):
        candidates = [d for d in range(n_dom) if len(free_in[d]) >= k]
        if not candidates:
            raise NoGpuFit(f"node {arrays.names[row]}: no NVLink domain with {k} free GPUs")
        best = min(candidates, key=lambda d: (len(free_in[d]), d))
        return tuple(free_in[best][:k])
    full = [d for d in range(n_dom) if len(free_in[d]) == sizes[d]]
    chosen: list[int] = []
    for d in sorted(full, key=lambda d: (-sizes[d], d)):
        if len(chosen) >= k:
            break
        chosen.extend(free_in[d])
    if len(chosen) < k:
        raise NoGpuFit(f"node {arrays.names[row]}: not enough entirely free NVLink domains")
    return tuple(sorted(chosen[:k]))


def _first_free(
    k: int, free: list[int], domain: list[int], size: int, node: str
) -> tuple[int, ...]:
    """:func:`whole_gpus` where nodes have one NVLink domain of ``size`` GPUs: its k entirely
    free GPUs of lowest index (what the general rule picks when there is one domain)."""
    picks = [
        g for g, (f, d) in enumerate(zip(free, domain, strict=True)) if f >= GPU_MILLI and d == 0
    ]
    if k > size:
        raise NoGpuFit(f"node {node}: not enough entirely free NVLink domains")
    if len(picks) < k:
        raise NoGpuFit(f"node {node}: no NVLink domain with {k} free GPUs")
    return tuple(picks[:k])
