"""Numpy views of a cluster's capacity and free resources, one row per node.

Scoring, placement and the fragmentation metrics read these arrays so that one pod is scored
against every node at once. ``NodeArrays`` is mutable on purpose: the simulator and the planner
place and remove pods in place (``allocate`` / ``release``) thousands of times; the frozen
:class:`~defrag.model.cluster.Cluster` copies it on write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import numpy.typing as npt

from defrag.model.resources import GPU_RESOURCE, Node, Pod, Taint
from defrag.model.units import GPU_MILLI

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

CONDITION_TAINT_PREFIX = "node.kubernetes.io/"
"""The taints the node lifecycle controller sets for a node's passing conditions (``not-ready``,
``unreachable``, ``unschedulable``, ``memory-pressure``, ``disk-pressure``, ``pid-pressure``,
``network-unavailable``, ``out-of-service``: kubernetes/api ``core/v1/well_known_taints.go``):
they say what a node is now, not what it could ever take."""

DEMAND_CLASSES = ("cpu-only", "gpu-share", "1-gpu", "2-gpu", "4-gpu", "8+-gpu")
"""GPU-demand classes (gpu-clustering groups pods of one class on the same nodes)."""


def demand_class(pod: Pod) -> int:
    """Index into DEMAND_CLASSES for a pod."""
    if pod.num_gpu == 0:
        return 1 if pod.pool_units else 0
    if pod.gpu_milli < GPU_MILLI:
        return 1
    return {1: 2, 2: 3, 3: 4, 4: 4}.get(pod.num_gpu, 5)


def _side_by_side(names: list[str]) -> tuple[str, ...]:
    """Copies of ``names`` made one after another, so they lie side by side in memory. The
    index answers every request's few hundred to thousand node names, new strings each time,
    by comparing them with its keys: keys made when each Node arrived, scattered over the heap,
    cost a cache miss each, most of such a look-up's time at fleet scale. (Node names are DNS
    names: never a NUL.)"""
    if not names:
        return ()
    return tuple("\0".join(names).split("\0"))


@dataclass(slots=True)
class NodeArrays:
    """Per-node capacity and free resources. Row ``i`` is ``names[i]``; rows are sorted by name."""

    names: tuple[str, ...]
    index: dict[str, int]
    gpu_total: IntArray  # [N] number of GPUs
    gpu_free: IntArray  # [N, G] free milli-GPU per GPU slot; 0 for slots beyond gpu_total
    gpu_exists: BoolArray  # [N, G]
    gpu_domain: IntArray  # [N, G] NVLink domain id per GPU, -1 for missing slots
    domain_size: IntArray  # [N, D] GPUs per domain (0 = no such domain)
    cpu_total: IntArray
    cpu_free: IntArray
    mem_total: IntArray
    mem_free: IntArray
    gpu_mem: IntArray  # [N] memory per GPU, MiB
    model_code: IntArray  # [N] index into models (-1 = no GPU)
    models: tuple[str, ...]
    schedulable: BoolArray  # [N] not cordoned (taints are checked per pod)
    taints: tuple[tuple[Taint, ...], ...]  # per row
    tainted_rows: tuple[int, ...]  # rows with NoSchedule/NoExecute taints
    class_count: IntArray  # [N, len(DEMAND_CLASSES)] bound pods per demand class
    pool_names: tuple[str, ...] = ()  # resources of the GPU pools any node has (Node.pools)
    pool_index: dict[str, int] = field(default_factory=dict)
    pool_total: IntArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    pool_free: IntArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    labels: tuple[Mapping[str, str], ...] = ()  # per row
    selector_cache: dict[tuple[object, ...], BoolArray] = field(default_factory=dict)
    """Per pod constraint key, the rows its nodeSelector and affinity admit (labels never change
    in one NodeArrays, so the mask is computed once per distinct constraint)."""
    whole_count: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """[N] entirely free GPUs per node, kept up to date by ``allocate``/``release`` (every
    filter and score reads it: no pass over ``gpu_free`` per pod)."""
    share_free: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """[N] free milli-GPU summed over each node's GPUs, kept like ``whole_count``."""
    domain_whole: IntArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    """[N, D] entirely free GPUs in each NVLink domain, kept like ``whole_count``."""
    share_max: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """[N] the most free milli-GPU on any one GPU of each node, kept like ``whole_count`` (a
    GPU-sharing pod fits a node's GPUs iff its share is at most this)."""

    def __post_init__(self) -> None:
        if (
            self.whole_count.shape != self.gpu_total.shape
            or self.share_max.shape != self.gpu_total.shape
            or self.domain_whole.shape != self.domain_size.shape
        ):
            self.recount()

    def recount(self) -> None:
        """Recompute the kept per-node counts from ``gpu_free`` (after writing it directly)."""
        whole = self.gpu_free >= GPU_MILLI
        self.whole_count = np.count_nonzero(whole, axis=1).astype(np.int64)
        self.share_free = np.asarray(self.gpu_free.sum(axis=1), dtype=np.int64)
        self.share_max = np.asarray(self.gpu_free.max(axis=1, initial=0), dtype=np.int64)
        self.domain_whole = np.zeros(self.domain_size.shape, dtype=np.int64)
        for dom in range(self.domain_size.shape[1]):
            self.domain_whole[:, dom] = (whole & (self.gpu_domain == dom)).sum(axis=1)

    @classmethod
    def from_nodes(cls, nodes: Sequence[Node]) -> NodeArrays:
        ordered = sorted(nodes, key=lambda n: n.name)
        n = len(ordered)
        g = max((node.num_gpu for node in ordered), default=0) or 1
        d = max((len(node.domains) for node in ordered), default=0) or 1
        models = tuple(sorted({node.gpu_model for node in ordered if node.num_gpu or node.pools}))
        pool_names = tuple(sorted({res for node in ordered for res in node.pools}))
        pool_index = {res: i for i, res in enumerate(pool_names)}
        pool_total = np.zeros((n, len(pool_names)), dtype=np.int64)
        for row, node in enumerate(ordered):
            for res, units in node.pools.items():
                pool_total[row, pool_index[res]] = units
        model_index = {m: i for i, m in enumerate(models)}
        gpu_total = np.array([node.num_gpu for node in ordered], dtype=np.int64)
        slots = np.arange(g)[None, :]
        gpu_exists = slots < gpu_total[:, None]
        gpu_domain = np.full((n, g), -1, dtype=np.int64)
        domain_size = np.zeros((n, d), dtype=np.int64)
        for row, node in enumerate(ordered):
            for dom, group in enumerate(node.domains):
                gpu_domain[row, list(group)] = dom
                domain_size[row, dom] = len(group)
        names = _side_by_side([node.name for node in ordered])
        return cls(
            names=names,
            index={name: i for i, name in enumerate(names)},
            gpu_total=gpu_total,
            gpu_free=np.where(gpu_exists, GPU_MILLI, 0).astype(np.int64),
            gpu_exists=gpu_exists,
            gpu_domain=gpu_domain,
            domain_size=domain_size,
            cpu_total=np.array([node.cpu_milli for node in ordered], dtype=np.int64),
            cpu_free=np.array([node.cpu_milli for node in ordered], dtype=np.int64),
            mem_total=np.array([node.memory_mib for node in ordered], dtype=np.int64),
            mem_free=np.array([node.memory_mib for node in ordered], dtype=np.int64),
            gpu_mem=np.array([node.gpu_memory_mib for node in ordered], dtype=np.int64),
            model_code=np.array(
                [
                    model_index[node.gpu_model] if node.num_gpu or node.pools else -1
                    for node in ordered
                ],
                dtype=np.int64,
            ),
            models=models,
            schedulable=np.array([not node.unschedulable for node in ordered], dtype=bool),
            taints=tuple(node.taints for node in ordered),
            tainted_rows=tuple(
                i
                for i, node in enumerate(ordered)
                if any(t.effect != "PreferNoSchedule" for t in node.taints)
            ),
            class_count=np.zeros((n, len(DEMAND_CLASSES)), dtype=np.int64),
            pool_names=pool_names,
            pool_index=pool_index,
            pool_total=pool_total,
            pool_free=pool_total.copy(),
            labels=tuple(node.labels for node in ordered),
        )

    def __len__(self) -> int:
        return len(self.names)

    def copy(self) -> NodeArrays:
        return NodeArrays(
            names=self.names,
            index=self.index,
            gpu_total=self.gpu_total,
            gpu_free=self.gpu_free.copy(),
            gpu_exists=self.gpu_exists,
            gpu_domain=self.gpu_domain,
            domain_size=self.domain_size,
            cpu_total=self.cpu_total,
            cpu_free=self.cpu_free.copy(),
            mem_total=self.mem_total,
            mem_free=self.mem_free.copy(),
            gpu_mem=self.gpu_mem,
            model_code=self.model_code,
            models=self.models,
            schedulable=self.schedulable.copy(),
            taints=self.taints,
            tainted_rows=self.tainted_rows,
            class_count=self.class_count.copy(),
            pool_names=self.pool_names,
            pool_index=self.pool_index,
            pool_total=self.pool_total,
            pool_free=self.pool_free.copy(),
            labels=self.labels,
            selector_cache=self.selector_cache,
            whole_count=self.whole_count.copy(),
            share_free=self.share_free.copy(),
            domain_whole=self.domain_whole.copy(),
            share_max=self.share_max.copy(),
        )

    def emptied(self) -> NodeArrays:
        """These nodes with nothing on them and nothing passing: every GPU, core, MiB and pool
        unit free, cordons lifted and the node lifecycle's condition taints
        (``node.kubernetes.io/…``) gone. Labels, GPU models, GPU memory, NVLink domains and every
        other taint stay: what a pod could ever get, asked with the scheduler's own filters
        (:func:`defrag.scoring.satisfiable.satisfiable`)."""
        taints = tuple(
            tuple(t for t in row if not t.key.startswith(CONDITION_TAINT_PREFIX))
            for row in self.taints
        )
        return NodeArrays(
            names=self.names,
            index=self.index,
            gpu_total=self.gpu_total,
            gpu_free=np.where(self.gpu_exists, GPU_MILLI, 0).astype(np.int64),
            gpu_exists=self.gpu_exists,
            gpu_domain=self.gpu_domain,
            domain_size=self.domain_size,
            cpu_total=self.cpu_total,
            cpu_free=self.cpu_total.copy(),
            mem_total=self.mem_total,
            mem_free=self.mem_total.copy(),
            gpu_mem=self.gpu_mem,
            model_code=self.model_code,
            models=self.models,
            schedulable=np.ones(len(self), dtype=bool),
            taints=taints,
            tainted_rows=tuple(
                i
                for i, row in enumerate(taints)
                if any(t.effect != "PreferNoSchedule" for t in row)
            ),
            class_count=np.zeros_like(self.class_count),
            pool_names=self.pool_names,
            pool_index=self.pool_index,
            pool_total=self.pool_total,
            pool_free=self.pool_total.copy(),
            labels=self.labels,
            selector_cache=self.selector_cache,
        )

    def row_view(self, row: int) -> NodeArrays:
        """A one-row NodeArrays whose numpy fields are views sharing memory with this one."""
        n = len(self)
        values: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "index":
                values[f.name] = {self.names[row]: 0}
            elif f.name == "tainted_rows":
                values[f.name] = (0,) if row in value else ()
            elif f.name == "selector_cache":
                values[f.name] = {}
            elif isinstance(value, np.ndarray) and value.shape[:1] == (n,):
                values[f.name] = value[row : row + 1]
            elif f.name in _PER_ROW_TUPLES:
                values[f.name] = (value[row],)
            else:
                values[f.name] = value
        return NodeArrays(**values)  # type: ignore[arg-type]

    # --- derived views -------------------------------------------------------------------

    def whole_free(self) -> BoolArray:
        """[N, G] GPUs that are entirely free."""
        return self.gpu_free >= GPU_MILLI

    def free_whole_count(self) -> IntArray:
        """[N] entirely free GPUs per node (a read-only view of the kept count)."""
        return _read_only(self.whole_count)

    def free_share(self) -> IntArray:
        """[N] free milli-GPU summed over each node's GPUs (a read-only view)."""
        return _read_only(self.share_free)

    def domain_free(self) -> IntArray:
        """[N, D] entirely free GPUs in each NVLink domain (a read-only view of the kept count)."""
        return _read_only(self.domain_whole)

    def largest_job(self) -> IntArray:
        """[N] the most whole GPUs one pod could get on each node, NVLink rules included."""
        dom_free = self.domain_free()
        full = (dom_free == self.domain_size) & (self.domain_size > 0)
        spanning = (full * self.domain_size).sum(axis=1)
        return np.asarray(np.maximum(dom_free.max(axis=1, initial=0), spanning), dtype=np.int64)

    def pool_column(self, pod: Pod) -> int | None:
        """The pool column the pod may draw from: its own pool, or for a whole-GPU pod the
        ``nvidia.com/gpu`` pool of nodes whose GPUs are time-sliced or MIG-single."""
        if pod.pool:
            return self.pool_index.get(pod.pool, -1)
        if pod.num_gpu and pod.gpu_milli >= GPU_MILLI:
            return self.pool_index.get(GPU_RESOURCE)
        return None

    def pool_rows(self, pod: Pod) -> tuple[int, BoolArray] | None:
        """(column, rows where the pod draws from that pool) — None when it never does.
        A pool pod draws from its pool on every row; a whole-GPU pod on rows that have an
        ``nvidia.com/gpu`` pool (those have no exclusive GPUs)."""
        if not self.pool_names:
            return (-1, np.ones(len(self), dtype=bool)) if pod.pool else None
        col = self.pool_column(pod)
        if col is None:
            return None
        if pod.pool:
            return col, np.ones(len(self), dtype=bool)
        return col, np.asarray(self.pool_total[:, col] > 0)

    def pool_use(self, pod: Pod, row: int) -> int | None:
        """The pool column the pod holds units of on ``row``; None when it holds GPU slots."""
        if not self.pool_names:
            return None
        col = self.pool_column(pod)
        if col is None or col < 0:
            return None
        if pod.pool or self.pool_total[row, col] > 0:
            return col
        return None

    def pool_free_for(self, pod: Pod) -> IntArray:
        """[N] free units of the pod's pool (0 where there is none)."""
        col = self.pool_column(pod)
        if col is None or col < 0:
            return np.zeros(len(self), dtype=np.int64)
        return np.asarray(self.pool_free[:, col])

    def selector_mask(self, pod: Pod) -> BoolArray:
        """[N] nodes the pod's nodeSelector and required node affinity admit."""
        if not pod.has_node_constraints:
            return np.ones(len(self), dtype=bool)
        key = pod.constraint_key()
        mask = self.selector_cache.get(key)
        if mask is None:
            rows = zip(self.labels, self.names, strict=True)
            mask = np.fromiter(
                (pod.admits_node(labels, name) for labels, name in rows),
                dtype=bool,
                count=len(self),
            )
            self.selector_cache[key] = mask
        return mask

    def model_allowed(self, pod: Pod) -> BoolArray:
        if not pod.gpu_models or pod.num_gpu == 0:
            return np.ones(len(self), dtype=bool)
        codes = [i for i, m in enumerate(self.models) if m in pod.gpu_models]
        return np.isin(self.model_code, codes)

    # --- in-place updates (simulator and planner) ---------------------------------------

    def allocate(self, row: int, pod: Pod, gpus: Sequence[int]) -> None:
        self.cpu_free[row] -= pod.cpu_milli
        self.mem_free[row] -= pod.memory_mib
        self.class_count[row, demand_class(pod)] += 1
        self._shift_gpus(row, pod, gpus, -1)

    def take_gpus(self, row: int, pod: Pod, gpus: Sequence[int]) -> None:
        """Only the GPU part of :meth:`allocate` (its slots, or its pool's units), without the
        kept counts: building a cluster pod by pod, then :meth:`charge` once."""
        col = self.pool_use(pod, row)
        if col is not None:
            self.pool_free[row, col] -= pool_units(pod)
        elif pod.num_gpu:
            self.gpu_free[row, list(gpus)] -= pod.gpu_milli

    def charge(self, bound: Sequence[tuple[int, Pod]]) -> None:
        """The rest of :meth:`allocate` for many pods whose GPUs :meth:`take_gpus` took: CPU,
        memory and demand classes added up per node in one step each; the kept counts
        recomputed once."""
        rows = np.fromiter((r for r, _ in bound), dtype=np.int64, count=len(bound))
        pods = [p for _, p in bound]
        np.subtract.at(self.cpu_free, rows, np.array([p.cpu_milli for p in pods], np.int64))
        np.subtract.at(self.mem_free, rows, np.array([p.memory_mib for p in pods], np.int64))
        classes = np.array([demand_class(p) for p in pods], dtype=np.int64)
        np.add.at(self.class_count, (rows, classes), 1)
        self.recount()

    def release(self, row: int, pod: Pod, gpus: Sequence[int]) -> None:
        self.cpu_free[row] += pod.cpu_milli
        self.mem_free[row] += pod.memory_mib
        self.class_count[row, demand_class(pod)] -= 1
        self._shift_gpus(row, pod, gpus, 1)

    def _shift_gpus(self, row: int, pod: Pod, gpus: Sequence[int], sign: int) -> None:
        """Give back (``sign`` 1) or take (-1) the pod's GPU share on ``gpus`` (each slot once,
        as numpy's indexed update does), or its pool's units; then the row's kept counts."""
        col = self.pool_use(pod, row)
        if col is not None:
            self.pool_free[row, col] += sign * pool_units(pod)
        elif pod.num_gpu:
            # ≤ 8 GPUs: plain Python over the row beats numpy calls.
            free: list[int] = self.gpu_free[row].tolist()
            delta = sign * pod.gpu_milli
            for g in set(gpus):
                free[g] += delta
                self.gpu_free[row, g] = free[g]
            self._count_row(row, free)

    def _count_row(self, row: int, free: list[int]) -> None:
        """The kept counts of ``row`` from its free share per slot, ``free``."""
        domain: list[int] = self.gpu_domain[row].tolist()
        per = [0] * self.domain_whole.shape[1]
        whole = 0
        for f, d in zip(free, domain, strict=True):
            if f >= GPU_MILLI:
                whole += 1
                if 0 <= d < len(per):
                    per[d] += 1
        self.whole_count[row] = whole
        self.share_free[row] = sum(free)
        self.share_max[row] = max(free, default=0)
        if len(per) == 1:
            self.domain_whole[row, 0] = per[0]
        else:
            self.domain_whole[row] = per


_PER_ROW_TUPLES = frozenset({"names", "taints", "labels"})


def _read_only(values: IntArray) -> IntArray:
    view = values.view()
    view.flags.writeable = False
    return view


def pool_units(pod: Pod) -> int:
    """Units a pod takes from a pool: its pool request, or one per GPU it asks for."""
    return pod.pool_units if pod.pool else pod.num_gpu
