"""The immutable cluster: nodes, pods and the numpy views scoring reads."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from defrag.model.arrays import NodeArrays, pool_units
from defrag.model.resources import Node, Pod
from defrag.model.selectors import Requirement, labels_match


class ModelError(ValueError):
    """An inconsistent cluster: a pod bound to an unknown node, an overcommitted GPU, …"""


@dataclass(frozen=True, slots=True)
class PodDisruptionBudget:
    namespace: str
    name: str
    match_labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    match_expressions: tuple[Requirement, ...] = ()
    disruptions_allowed: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, pod: Pod) -> bool:
        if pod.namespace != self.namespace:
            return False
        if not self.match_labels and not self.match_expressions:
            return True  # an empty selector selects every pod of the namespace
        return labels_match(self.match_labels, pod.labels) and all(
            r.matches(pod.labels) for r in self.match_expressions
        )


@dataclass(frozen=True, slots=True, eq=False)
class Cluster:
    """Nodes, pods (bound and pending) and PDBs. Changes return a new cluster.

    Build with :meth:`build`; ``arrays`` is owned by this object and never mutated.
    """

    nodes: tuple[Node, ...]
    pods: Mapping[str, Pod]
    pdbs: tuple[PodDisruptionBudget, ...]
    arrays: NodeArrays
    priority_classes: Mapping[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    """Objects the source could not model fully, each naming the object and the field: left
    out, or counted conservatively (see docs/kubernetes.md)."""

    @classmethod
    def build(
        cls,
        nodes: Iterable[Node],
        pods: Iterable[Pod] = (),
        pdbs: Iterable[PodDisruptionBudget] = (),
        priority_classes: Mapping[str, int] | None = None,
        on_misfit: Callable[[Pod, ModelError], None] | None = None,
        warnings: Iterable[str] = (),
    ) -> Cluster:
        """Nodes, pods and PDBs as one consistent cluster.

        A bound pod that does not fit its node (unknown node, GPUs overcommitted — say a GPU
        fell off the bus and allocatable dropped under running pods) raises ModelError, unless
        ``on_misfit`` is given: then the pod is left out and reported to it.
        """
        node_list = sorted(nodes, key=lambda n: n.name)
        names = [n.name for n in node_list]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ModelError(f"duplicate node names: {', '.join(dupes)}")
        arrays = NodeArrays.from_nodes(node_list)
        pod_map: dict[str, Pod] = {}
        bound: list[tuple[int, Pod]] = []
        for pod in pods:
            if pod.key in pod_map:
                raise ModelError(f"duplicate pod {pod.key}")
            if pod.node is not None and pod.phase in ("Pending", "Running", "Unknown"):
                try:
                    pod = _assign_gpus(arrays, pod)
                except ModelError as exc:
                    if on_misfit is None:
                        raise
                    on_misfit(pod, exc)
                    continue
                row = arrays.index[pod.node]  # type: ignore[index]
                arrays.take_gpus(row, pod, pod.gpu_indices)  # the next pod's slots depend on it
                bound.append((row, pod))
            pod_map[pod.key] = pod
        arrays.charge(bound)  # CPU, memory and the counts of every pod at once
        return cls(
            nodes=tuple(node_list),
            pods=MappingProxyType(pod_map),
            pdbs=tuple(pdbs),
            arrays=arrays,
            priority_classes=MappingProxyType(dict(priority_classes or {})),
            warnings=tuple(warnings),
        )

    # --- queries ---------------------------------------------------------------------------

    def node(self, name: str) -> Node:
        return self.nodes[self.arrays.index[name]]

    def pods_on(self, node: str) -> Iterator[Pod]:
        return (p for p in self.pods.values() if p.node == node and occupies(p))

    def bound_pods(self) -> Iterator[Pod]:
        return (p for p in self.pods.values() if p.node is not None and occupies(p))

    def pending_pods(self) -> Iterator[Pod]:
        """Unbound pods waiting to be scheduled; a Terminating one waits for nothing."""
        return (
            p
            for p in self.pods.values()
            if p.node is None and p.phase == "Pending" and not p.terminating
        )

    # --- changes -----------------------------------------------------------------------------

    def pods_copy(self) -> dict[str, Pod]:
        """A new dict of the pods, to change and wrap again. The map is a read-only proxy of a
        dict, whose ``copy()`` copies that dict whole in C; ``dict(proxy)`` would walk it key
        by key through the mapping protocol, several times slower at 100,000s of pods."""
        pods = self.pods
        return pods.copy() if isinstance(pods, MappingProxyType) else dict(pods)

    def with_pod_added(self, pod: Pod) -> Cluster:
        """A cluster with ``pod`` added; a bound pod takes its node's resources."""
        if pod.key in self.pods:
            raise ModelError(f"pod {pod.key} is already in the cluster")
        arrays = self.arrays
        if pod.node is not None and occupies(pod):
            arrays = arrays.copy()
            pod = _assign_gpus(arrays, pod)
            arrays.allocate(arrays.index[pod.node], pod, pod.gpu_indices)  # type: ignore[index]
        pods = self.pods_copy()
        pods[pod.key] = pod
        return replace(self, pods=MappingProxyType(pods), arrays=arrays)

    def with_pod_removed(self, key: str) -> Cluster:
        """A cluster without the pod ``key``; a bound pod gives its resources back."""
        pod = self.pods.get(key)
        if pod is None:
            raise ModelError(f"no pod {key} in the cluster")
        arrays = self.arrays
        if pod.node is not None and occupies(pod):
            arrays = arrays.copy()
            arrays.release(arrays.index[pod.node], pod, pod.gpu_indices)
        pods = self.pods_copy()
        del pods[key]
        return replace(self, pods=MappingProxyType(pods), arrays=arrays)

    def with_pod_bound(self, key: str, node: str, gpus: tuple[int, ...]) -> Cluster:
        """Bind a pending pod (or move a bound one) to ``node`` on GPU slots ``gpus``."""
        pod = self.pods[key]
        moved = replace(pod, node=node, gpu_indices=gpus, phase="Running")
        return self.with_pod_removed(key).with_pod_added(moved)

    def same_state(self, other: Cluster) -> bool:
        """Equal nodes, pods and free resources (the arrays compared by value)."""
        a, b = self.arrays, other.arrays
        return (
            self.nodes == other.nodes
            and dict(self.pods) == dict(other.pods)
            and (a.gpu_free == b.gpu_free).all()
            and (a.cpu_free == b.cpu_free).all()
            and (a.mem_free == b.mem_free).all()
        )


def occupies(pod: Pod) -> bool:
    """Whether a bound pod holds its node's resources (finished pods do not)."""
    return pod.phase not in ("Succeeded", "Failed")


def _assign_gpus(arrays: NodeArrays, pod: Pod) -> Pod:
    """Check a bound pod against its node; give it GPU slots when the source did not say which."""
    if pod.node not in arrays.index:
        raise ModelError(f"pod {pod.key} is bound to unknown node {pod.node!r}")
    row = arrays.index[pod.node]
    col = arrays.pool_use(pod, row)
    if col is not None or pod.pool:
        if col is None or col < 0 or arrays.pool_free[row, col] < pool_units(pod):
            raise ModelError(
                f"pod {pod.key} holds {pool_units(pod)} {pod.pool or 'GPU'} unit(s) on node "
                f"{pod.node}, more than it has free"
            )
        return pod if not pod.gpu_indices else replace(pod, gpu_indices=())
    if pod.num_gpu == 0:
        return pod if not pod.gpu_indices else replace(pod, gpu_indices=())
    free: list[int] = arrays.gpu_free[row].tolist()  # ≤ 8 GPUs: a list beats numpy scalars
    total = int(arrays.gpu_total[row])
    if pod.gpu_indices:
        if len(pod.gpu_indices) != pod.num_gpu or any(i < 0 or i >= total for i in pod.gpu_indices):
            raise ModelError(
                f"pod {pod.key}: GPU indices {list(pod.gpu_indices)} do not fit "
                f"{pod.num_gpu} GPU(s) on node {pod.node} with {total} GPU(s)"
            )
        if any(free[i] < pod.gpu_milli for i in pod.gpu_indices):
            raise ModelError(
                f"pod {pod.key}: GPU(s) {list(pod.gpu_indices)} on {pod.node} overcommitted"
            )
        return pod
    # Unknown GPU slots (the API does not say): best fit on the fullest GPUs that still fit.
    order = sorted(
        (i for i in range(total) if free[i] >= pod.gpu_milli), key=lambda i: (free[i], i)
    )
    if len(order) < pod.num_gpu:
        raise ModelError(
            f"pod {pod.key} asks {pod.num_gpu} GPU(s) of {pod.gpu_milli} milli on node {pod.node}, "
            "more than it has free"
        )
    return replace(pod, gpu_indices=tuple(sorted(order[: pod.num_gpu])))
