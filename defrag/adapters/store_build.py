"""The cluster made from the watched store's conversions, redoing only what changed since the
last build.

:class:`StoreBuild` is what :meth:`KubeWatchSource.build
<defrag.adapters.kube_watch.KubeWatchSource.build>` runs. Every object in the store carries its
conversion (a :class:`~defrag.adapters.kube_watch.Piece`, made once per change; the same object
until the next change). A build compares each piece with the one the last build used, by
identity: a pod whose piece is the same keeps its resolved form (priority from its class, share
sized against its GPUs), and a node none of whose pods changed keeps its row of free resources
and its pods' GPU slots (:func:`defrag.model.rebuild.rebuilt`). The nodes a change touched —
the node changed, or a pod bound to it came, went or changed — are assigned their pods' slots
again.

What the lenient :meth:`ClusterParts.build <defrag.adapters.kube_convert.ClusterParts.build>`
decides over the whole cluster is checked first, and when any of it moved the build is a full
one: the PriorityClasses' values and the default, the largest GPU memory (a pending pod's share
is sized against it), the nodes left out as unreadable and those holding a pod that could not be
read. After a build that had to assume every pod's slots (conflicting ``defrag.io/gpu-indices``),
the next build is a full one too. The result is the cluster a full build of the same store
makes — the same nodes, pods (in the same order), slots, free resources, warnings and left-out
pods (tests/test_store_build.py checks it on random event sequences).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from defrag.adapters.kube_convert import (
    UNREADABLE_TAINT,
    PriorityClass,
    build_lenient,
    dropped_warning,
    priority_values,
    resolve_pod,
    skipped_warning,
)
from defrag.model.cluster import Cluster, PodDisruptionBudget
from defrag.model.rebuild import rebuilt
from defrag.model.resources import Node, Pod

if TYPE_CHECKING:
    from defrag.adapters.kube_watch import Piece

NODE = "Node"

Pieces = Mapping[str, "Piece"]
"""One kind's conversions by store key (``namespace/name``)."""


@dataclass(frozen=True, slots=True)
class Built:
    """A build's cluster, and the pods it left out (bound to a node not listed)."""

    cluster: Cluster
    dropped: tuple[str, ...]
    full: bool
    """Whether every node was built (else only those a change touched)."""


@dataclass(frozen=True, slots=True)
class _Context:
    """What the whole cluster decides for each pod: a change to any of it rebuilds in full."""

    values: Mapping[str, int]
    default: int
    largest: int
    skipped: frozenset[str]
    hidden: frozenset[str]


@dataclass(slots=True)
class _Last:
    cluster: Cluster
    context: _Context
    assumed: bool
    pieces: dict[tuple[str, str], Piece]
    """(kind, store key) → the piece this build used."""
    inputs: dict[tuple[str, str], tuple[tuple[str, Pod], ...]]
    """(kind, store key) of a pod → its pods (with ``Pod.key``) resolved, before slots."""
    nodes: dict[str, Node]
    """Node name → the node as built (with the unreadable-pod taint where it applies)."""


@dataclass(slots=True)
class StoreBuild:
    """Builds clusters from a store's pieces, reusing the last build (not thread-safe: the
    caller serialises builds)."""

    full_builds: int = 0
    partial_builds: int = 0
    _last: _Last | None = field(default=None, repr=False)

    def build(self, kinds: Sequence[tuple[str, Pieces]]) -> Built:
        """The cluster of ``kinds`` (each kind's pieces, in listing order)."""
        last = self._last
        ordered = [(kind, sorted(pieces.items())) for kind, pieces in kinds]
        nodes: list[Node] = []
        pdbs: list[PodDisruptionBudget] = []
        classes: list[PriorityClass] = []
        warned: list[str] = []
        skipped: set[str] = set()
        hidden: set[str] = set()
        with_pods: list[tuple[str, str, Piece]] = []
        for kind, items in ordered:
            for key, piece in items:
                if piece.warnings:
                    warned += [str(w) for w in piece.warnings]
                if piece.nodes:
                    nodes += piece.nodes
                if piece.pods:
                    with_pods.append((kind, key, piece))
                if piece.pdbs:
                    pdbs += piece.pdbs
                if piece.priority_classes:
                    classes += piece.priority_classes
                if piece.skipped_nodes:
                    skipped.update(piece.skipped_nodes)
                if piece.hidden_usage:
                    hidden.update(piece.hidden_usage)
        values, default = priority_values(classes)
        gpu_memory = {n.name: n.gpu_memory_mib for n in nodes}
        context = _Context(
            values,
            default,
            max(gpu_memory.values(), default=0),
            frozenset(skipped),
            frozenset(hidden),
        )
        reuse = last is not None and not last.assumed and last.context == context
        pieces = {(kind, key): piece for kind, items in ordered for key, piece in items}
        dirty: set[str] = set()
        changed_nodes: set[str] = set()
        if reuse and last is not None:
            for kind, key in last.pieces.keys() - pieces.keys():  # gone
                dirty.update(_nodes_of(last, kind, key))
            for kind, key in pieces.keys() - last.pieces.keys():  # new (a node's pods: below)
                if kind == NODE:
                    changed_nodes.add(key)
            for node in nodes:
                if not _same_piece(last, pieces, node):
                    changed_nodes.add(node.name)
            for name in last.nodes.keys() - gpu_memory.keys():
                changed_nodes.add(name)
            dirty |= changed_nodes

        inputs: dict[tuple[str, str], tuple[tuple[str, Pod], ...]] = {}
        resolved: list[tuple[str, Pod]] = []
        for kind, key, piece in with_pods:
            kept = None
            if reuse and last is not None and last.pieces.get((kind, key)) is piece:
                kept = last.inputs.get((kind, key))
                if kept is not None and any(p.node in changed_nodes for _k, p in kept):
                    kept = None
            if kept is None:
                memory = dict(piece.share_memory)
                kept = tuple(
                    (
                        pod.key,
                        resolve_pod(
                            pod,
                            explicit,
                            memory.get(pod.key),
                            values,
                            default,
                            gpu_memory,
                            context.largest,
                        ),
                    )
                    for pod, explicit in piece.pods
                )
                if reuse and last is not None:
                    dirty.update(_nodes_of(last, kind, key))
                    dirty.update(p.node for _k, p in kept if p.node is not None)
            inputs[kind, key] = kept
            resolved += kept

        warnings = warned
        if skipped:
            warnings += [skipped_warning(p) for _k, p in resolved if p.node in skipped]
            resolved = [(k, p) for k, p in resolved if p.node not in skipped]
        built_nodes = self._nodes(nodes, hidden, pieces, last if reuse else None)
        names = gpu_memory.keys()
        dropped = [k for k, p in resolved if p.node is not None and p.node not in names]
        if dropped:
            resolved = [(k, p) for k, p in resolved if p.node is None or p.node in names]
            warnings += [dropped_warning(k) for k in dropped]

        cluster = None
        assumed = False
        if reuse and last is not None:
            cluster = rebuilt(last.cluster, built_nodes, resolved, dirty, pdbs, values, warnings)
        partial = cluster is not None
        if cluster is None:
            cluster, assumed = build_lenient(
                built_nodes, [p for _k, p in resolved], pdbs, values, warnings, dropped
            )
            self.full_builds += 1
        else:
            self.partial_builds += 1
        self._last = _Last(
            cluster,
            context,
            assumed,
            pieces,
            inputs,
            {n.name: n for n in built_nodes},
        )
        return Built(cluster, tuple(dropped), full=not partial)

    @staticmethod
    def _nodes(
        nodes: list[Node],
        hidden: set[str],
        pieces: Mapping[tuple[str, str], Piece],
        last: _Last | None,
    ) -> list[Node]:
        """The nodes sorted by name, tainted where a pod could not be read; a node whose piece
        the last build used is the node it built."""
        out = []
        for node in sorted(nodes, key=lambda n: n.name):
            if node.name in hidden:
                before = last.nodes.get(node.name) if last is not None else None
                if before is not None and last is not None and _same_piece(last, pieces, node):
                    node = before
                else:
                    node = replace(node, taints=(*node.taints, UNREADABLE_TAINT))
            out.append(node)
        return out


def _same_piece(last: _Last, pieces: Mapping[tuple[str, str], Piece], node: Node) -> bool:
    """Whether the node's object is the one the last build used (a node's store key is its
    name)."""
    return last.pieces.get((NODE, node.name)) is pieces.get((NODE, node.name))


def _nodes_of(last: _Last, kind: str, key: str) -> list[str]:
    """The nodes the last build bound the pods of ``kind`` ``key`` to."""
    return [p.node for _k, p in last.inputs.get((kind, key), ()) if p.node is not None]


__all__ = ["Built", "StoreBuild"]
