"""The cluster made from the watched store's conversions, redoing only what changed since the
last build.

:class:`StoreBuild` is what :meth:`KubeWatchSource.build
<defrag.adapters.kube_watch.KubeWatchSource.build>` runs. Every object in the store carries its
conversion (a :class:`~defrag.adapters.kube_convert.Piece`, made once per change). The store
tells the builder which objects changed since its last build (:meth:`StoreBuild.update`); the
builder keeps, from build to build, each pod's resolved form (priority from its class, a share
sized against its GPUs), which pods each node holds, and the warnings and left-out pods by
object. A change redoes its objects and the nodes it touched — a node that changed, or to or
from which a pod came, went or changed — and those nodes' pods are assigned their GPU slots
again (:func:`defrag.model.rebuild.rebuilt`); every other node keeps its row of free resources
and its pods as they were (the model is frozen: they are shared).

What the lenient :meth:`ClusterParts.build <defrag.adapters.kube_convert.ClusterParts.build>`
decides over the whole cluster makes a change that moves it a full build (:meth:`full`): a
PriorityClass changed, a node came or went, or became unreadable or readable, the largest GPU
memory moved (a pending pod's share is sized against it), the set of nodes holding a pod that
could not be read moved, or the last build had to assume every pod's slots (conflicting
``defrag.io/gpu-indices``). Either way the result is the cluster a full build of the same store
makes — the same nodes, pods in the same order, slots, free resources, warnings and left-out
pods (tests/test_store_build.py checks it on random event sequences).

:meth:`StoreBuild.ahead` answers, without building, what the next build's free resources will
be when the changes held since the last build are only a few pods coming, going or changing:
the last build's arrays with the rows of the nodes those pods touch redone as :func:`rebuilt
<defrag.model.rebuild.rebuilt>` redoes them (the extender answers from them while the build is
still to come; tests/test_extender_ahead.py checks them against the build).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from defrag.adapters.kube_convert import (
    UNREADABLE_TAINT,
    Piece,
    PriorityClass,
    build_lenient,
    dropped_warning,
    priority_values,
    resolve_pod,
    skipped_warning,
)
from defrag.model.arrays import NodeArrays
from defrag.model.cluster import Cluster, ModelError, PodDisruptionBudget
from defrag.model.cluster import _assign_gpus as assign_gpus
from defrag.model.rebuild import HOLDING_PHASES, rebuilt
from defrag.model.resources import Node, Pod
from defrag.model.units import GPU_MILLI

NODE, POD, PRIORITY_CLASS = "Node", "Pod", "PriorityClass"

Ref = tuple[str, str]
"""(kind, store key ``namespace/name``)."""
Keyed = tuple[tuple[str, Pod], ...]
"""A pod object's pods (one, or none when left out), each with its ``Pod.key``."""


@dataclass(frozen=True, slots=True)
class Built:
    """A build's cluster, the pods it left out (bound to a node not listed, or not fitting it),
    and whether every node was built (else only those a change touched)."""

    cluster: Cluster
    dropped: tuple[str, ...]
    full: bool


@dataclass(slots=True)
class _State:
    """What the last build knew, by object."""

    kinds: tuple[str, ...]
    pieces: dict[Ref, Piece]
    cluster: Cluster
    values: dict[str, int]
    default: int
    gpu_memory: dict[str, int]
    largest: int
    skipped: frozenset[str]
    hidden: frozenset[str]
    nodes: dict[str, Node]
    """Node name → the node as built (tainted where a pod on it could not be read)."""
    inputs: dict[str, Keyed] = field(default_factory=dict)
    """Pod store key → its pods resolved (before slots)."""
    order: list[str] = field(default_factory=list)
    """The pod store keys, sorted: the order of the cluster's pods."""
    on_node: dict[str, set[str]] = field(default_factory=dict)
    """Node name → the store keys of the pods bound to it."""
    warned: dict[tuple[int, str], tuple[str, ...]] = field(default_factory=dict)
    """(kind's place, store key) → the object's conversion warnings."""
    hidden_by: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Pod store key → the nodes it hides usage on (it could not be read)."""
    pdbs: dict[Ref, tuple[PodDisruptionBudget, ...]] = field(default_factory=dict)
    astray: int = 0
    """Pod store keys whose pods are not exactly one pod keyed as the object is stored: while
    none are, the pods' order (by store key) is their keys' own order."""


AHEAD_LIMIT = 64
"""The most changed objects :meth:`StoreBuild.ahead` applies; past that the build is the cheaper
way (a relist marks every object changed)."""

KEPT_COUNTS = ("whole_count", "share_free", "share_max", "domain_whole")
"""The per-node counts ``NodeArrays`` keeps from its free GPU shares (its ``recount``)."""


@dataclass(frozen=True, slots=True)
class Ahead:
    """The free resources the next build will have, ahead of it: pod changes only."""

    base: Cluster
    """The last build, which the changes are applied to."""
    arrays: NodeArrays
    """``base``'s arrays with the rows of the nodes the changes touched as the next build makes
    them (``base.arrays`` itself when they touched no node: pending pods only)."""
    went: tuple[Pod, ...]
    """The changed objects' pods as the last build had them (resolved, before GPU slots)."""
    came: tuple[Pod, ...]
    """The changed objects' pods as the next build will have them."""


@dataclass(frozen=True, slots=True)
class _Memo:
    """An answer :meth:`StoreBuild.ahead` gave: the changes it applied to ``base`` (each
    object's piece, and its pods resolved) and the arrays they made (never written again)."""

    base: Cluster
    pieces: dict[Ref, Piece | None]
    resolved: dict[str, Keyed]
    arrays: NodeArrays


class Declined(Exception):
    """A change that moves what the whole cluster decides: build in full."""


@dataclass(slots=True)
class StoreBuild:
    """Builds clusters from a store's pieces, reusing the last build. Not thread-safe: the
    caller serialises builds."""

    full_builds: int = 0
    partial_builds: int = 0
    _state: _State | None = field(default=None, repr=False)
    _memo: _Memo | None = field(default=None, repr=False)
    """The last answer :meth:`ahead` gave, and from what."""

    @property
    def ready(self) -> bool:
        """Whether a build was made that :meth:`update` can start from."""
        return self._state is not None

    def full(self, kinds: Sequence[tuple[str, Mapping[str, Piece]]]) -> Built:
        """The cluster of every piece (``kinds``: each kind's pieces by store key, in listing
        order), as the lenient ``ClusterParts.build`` makes it."""
        self._state = None
        ordered = [(kind, sorted(pieces.items())) for kind, pieces in kinds]
        nodes: list[Node] = []
        pdbs: dict[Ref, tuple[PodDisruptionBudget, ...]] = {}
        classes: list[PriorityClass] = []
        warned: dict[tuple[int, str], tuple[str, ...]] = {}
        skipped: set[str] = set()
        hidden_by: dict[str, tuple[str, ...]] = {}
        with_pods: list[tuple[str, Piece]] = []
        for place, (kind, items) in enumerate(ordered):
            for key, piece in items:
                if piece.warnings:
                    warned[place, key] = tuple(str(w) for w in piece.warnings)
                nodes += piece.nodes
                if piece.pods:
                    with_pods.append((key, piece))
                if piece.pdbs:
                    pdbs[kind, key] = piece.pdbs
                classes += piece.priority_classes
                skipped.update(piece.skipped_nodes)
                if piece.hidden_usage:
                    hidden_by[key] = piece.hidden_usage
        values, default = priority_values(classes)
        gpu_memory = {n.name: n.gpu_memory_mib for n in nodes}
        hidden = frozenset(h for names in hidden_by.values() for h in names)
        state = _State(
            kinds=tuple(kind for kind, _ in kinds),
            pieces={(kind, key): piece for kind, items in ordered for key, piece in items},
            cluster=Cluster.build([]),
            values=values,
            default=default,
            gpu_memory=gpu_memory,
            largest=max(gpu_memory.values(), default=0),
            skipped=frozenset(skipped),
            hidden=hidden,
            nodes={},
            warned=warned,
            hidden_by=hidden_by,
            pdbs=pdbs,
        )
        state.nodes = {n.name: _tainted(n, hidden) for n in nodes}
        for key, piece in with_pods:
            state.inputs[key] = self._resolve(state, piece)
            state.astray += _astray(key, state.inputs[key])
            state.order.append(key)
            for _k, pod in state.inputs[key]:
                if pod.node is not None:
                    state.on_node.setdefault(pod.node, set()).add(key)
        pods = [(k, p) for key in state.order for k, p in state.inputs[key]]
        warnings, dropped, pods = _leave_out(state, pods)
        built_nodes = sorted(state.nodes.values(), key=lambda n: n.name)
        cluster, assumed = build_lenient(
            built_nodes,
            [p for _k, p in pods],
            _pdbs(state),
            values,
            warnings,
            dropped,
        )
        self.full_builds += 1
        state.cluster = cluster
        if not assumed:  # slots assumed for every pod: nothing to start the next build from
            self._state = state
        return Built(cluster, tuple(dropped), full=True)

    def update(self, changed: Mapping[Ref, Piece | None]) -> Built | None:
        """The cluster after ``changed`` (each changed object's new piece; None: deleted),
        redoing only what they touched; None when :meth:`full` must build it (then nothing
        is kept: the caller builds in full)."""
        state = self._state
        if state is None:
            return None
        self._state = None  # a change half applied must not be built on
        try:
            cluster, dropped = self._update(state, changed)
        except Declined:
            return None
        state.cluster = cluster
        self._state = state
        self.partial_builds += 1
        return Built(cluster, dropped, full=False)

    def ahead(self, changed: Mapping[Ref, Piece | None]) -> Ahead | None:
        """The next build's free resources after ``changed`` (as :meth:`update` takes them),
        without building and without changing what the next build starts from; None where only
        a build can say: anything but pods changed, more than :data:`AHEAD_LIMIT` objects, a pod
        bound to a node not built (or unreadable), a pod that does not fit its node, a pod
        object that is not exactly one pod keyed as it is stored (anywhere in the store), or
        the nodes a pod hides usage on moved. Not thread-safe with builds: the caller
        serialises it with them.

        The changes pile up between two builds: the last answer ahead of the same build is
        kept, and only the nodes of the objects changed since it are redone on a copy of its
        arrays (each object's pods resolved once)."""
        state = self._state
        if state is None or state.astray or len(changed) > AHEAD_LIMIT:
            return None
        base = state.cluster
        memo = self._memo if self._memo is not None and self._memo.base is base else None
        last_pieces = memo.pieces if memo is not None else {}
        last_resolved = memo.resolved if memo is not None else {}
        pieces: dict[Ref, Piece | None] = {}
        resolved: dict[str, Keyed] = {}
        moved: set[str] = set()  # store keys whose pods differ from the last answer's
        for ref, piece in changed.items():
            kind, key = ref
            if state.pieces.get(ref) is piece:
                continue
            if kind != POD:
                return None
            if ref in last_pieces and last_pieces[ref] is piece:
                after = last_resolved[key]
            else:
                after = self._resolve(state, piece) if piece is not None else ()
                if _astray(key, after):
                    return None
                hides = piece.hidden_usage if piece is not None else ()
                if hides != state.hidden_by.get(key, ()):
                    return None
                moved.add(key)
            if _astray(key, state.inputs.get(key, ())):
                return None
            pieces[ref] = piece
            resolved[key] = after
        moved.update(key for (_kind, key) in last_pieces.keys() - pieces.keys())
        went: list[Pod] = []
        came: list[Pod] = []
        leaving: dict[str, set[str]] = {}  # node → changed store keys whose pods it held
        arriving: dict[str, set[str]] = {}  # node → changed store keys whose pods it holds now
        for key, after in resolved.items():
            for _k, pod in state.inputs.get(key, ()):
                went.append(pod)
                if pod.node is not None:
                    leaving.setdefault(pod.node, set()).add(key)
            for _k, pod in after:
                came.append(pod)
                if pod.node is not None:
                    arriving.setdefault(pod.node, set()).add(key)
        if memo is None:
            redo = leaving.keys() | arriving.keys()
        else:  # where the moved objects' pods were in the last answer, and are now
            redo = {
                pod.node
                for key in moved
                for keyed in (
                    last_resolved.get(key, state.inputs.get(key, ())),
                    resolved.get(key, state.inputs.get(key, ())),
                )
                for _k, pod in keyed
                if pod.node is not None
            }
        if any(name not in state.nodes or name in state.skipped for name in redo):
            return None
        arrays = memo.arrays if memo is not None else base.arrays
        if redo:
            arrays = arrays.copy()
            for name in sorted(redo):
                keys = (state.on_node.get(name, set()) - leaving.get(name, set())) | arriving.get(
                    name, set()
                )
                on_node = [
                    pod
                    for key in sorted(keys)
                    for _k, pod in (resolved[key] if key in resolved else state.inputs[key])
                ]
                if not _redo_row(arrays, name, on_node):
                    return None
        self._memo = _Memo(base, pieces, resolved, arrays)
        return Ahead(base, arrays, tuple(went), tuple(came))

    # --- the parts ---------------------------------------------------------------------------

    def _update(
        self, state: _State, changed: Mapping[Ref, Piece | None]
    ) -> tuple[Cluster, tuple[str, ...]]:
        dirty: set[str] = set()
        nodes_changed = False
        places = {kind: place for place, kind in enumerate(state.kinds)}
        pod_changes: list[tuple[str, Piece | None]] = []
        for (kind, key), piece in changed.items():
            old = state.pieces.get((kind, key))
            if old is piece:
                continue
            if kind not in places or kind == PRIORITY_CLASS:
                raise Declined
            if piece is None:
                del state.pieces[kind, key]
            else:
                state.pieces[kind, key] = piece
            state.warned.pop((places[kind], key), None)
            if piece is not None and piece.warnings:
                state.warned[places[kind], key] = tuple(str(w) for w in piece.warnings)
            if kind == NODE:
                self._node_changed(state, key, old, piece)
                dirty.add(key)
                nodes_changed = True
            elif kind == POD:
                pod_changes.append((key, piece))
            elif _makes_nodes_or_pods(old) or _makes_nodes_or_pods(piece):
                raise Declined  # only the kinds above convert to nodes and pods
            else:
                state.pdbs.pop((kind, key), None)
                if piece is not None and piece.pdbs:
                    state.pdbs[kind, key] = piece.pdbs
        if nodes_changed:
            largest = max(state.gpu_memory.values(), default=0)
            if largest != state.largest:
                raise Declined
            # A node's GPU memory sizes the shares of the pods on it: resolved again.
            for name in sorted(dirty):
                for key in sorted(state.on_node.get(name, ())):
                    pod_changes.append((key, state.pieces.get((POD, key))))
        pods = state.cluster.pods_copy()
        reorder = False  # a pod new to the map goes last in it: put back in order
        for key, piece in pod_changes:
            before = state.inputs.pop(key, ())
            after = self._resolve(state, piece) if piece is not None else ()
            state.astray += _astray(key, after) - _astray(key, before)
            if before and not after:
                del state.order[bisect.bisect_left(state.order, key)]
            elif after and not before:
                bisect.insort(state.order, key)
            hides = piece.hidden_usage if piece is not None else ()
            if hides != state.hidden_by.get(key, ()):
                raise Declined  # the nodes holding an unreadable pod
            staying = {k for k, _ in after}
            for k, pod in before:
                if k not in staying:
                    pods.pop(k, None)
                if pod.node is not None:
                    dirty.add(pod.node)
                    state.on_node[pod.node].discard(key)
            leaving = {k for k, _ in before}
            for k, pod in after:
                if k not in pods:
                    reorder = True
                elif k not in leaving:
                    raise Declined  # two objects, one pod key: the full build names it
                pods[k] = pod
                if pod.node is not None:
                    dirty.add(pod.node)
                    state.on_node.setdefault(pod.node, set()).add(key)
            if after:
                state.inputs[key] = after
        warnings, dropped, _ = _leave_out(state, None)
        for k in dropped:
            pods.pop(k, None)
        for name in state.skipped:
            for key in state.on_node.get(name, ()):
                for k, _pod in state.inputs[key]:
                    pods.pop(k, None)
        if reorder and not state.astray:
            # Each object one pod keyed as the object is stored: its keys' order is the store
            # keys' order. Sorting pairs that are in order but for the new ones at the end is
            # nearly linear, in C; the walk below is a Python loop over every pod.
            pods = dict(sorted(pods.items()))
        elif reorder:
            pods = {k: pods[k] for key in state.order for k, _ in state.inputs[key] if k in pods}
        on_dirty = {
            name: [kp for key in sorted(state.on_node.get(name, ())) for kp in state.inputs[key]]
            for name in sorted(dirty)
            if name in state.nodes
        }
        built_nodes = (
            sorted(state.nodes.values(), key=lambda n: n.name)
            if nodes_changed
            else list(state.cluster.nodes)
        )
        cluster = rebuilt(
            state.cluster,
            built_nodes,
            on_dirty,
            pods,
            _pdbs(state),
            state.values,
            warnings,
        )
        if cluster is None:
            raise Declined
        return cluster, tuple(dropped)

    @staticmethod
    def _node_changed(state: _State, name: str, old: Piece | None, piece: Piece | None) -> None:
        """A node modified in place; one that came, went, or is (or was) unreadable is a
        change to the whole cluster."""
        if old is None or piece is None or not old.nodes or not piece.nodes:
            raise Declined
        if old.skipped_nodes or piece.skipped_nodes:
            raise Declined
        (node,) = piece.nodes
        state.nodes[name] = _tainted(node, state.hidden)
        state.gpu_memory[name] = node.gpu_memory_mib

    @staticmethod
    def _resolve(state: _State, piece: Piece) -> Keyed:
        memory = dict(piece.share_memory)
        return tuple(
            (
                pod.key,
                resolve_pod(
                    pod,
                    explicit,
                    memory.get(pod.key),
                    state.values,
                    state.default,
                    state.gpu_memory,
                    state.largest,
                ),
            )
            for pod, explicit in piece.pods
        )


def _leave_out(
    state: _State, pods: list[tuple[str, Pod]] | None
) -> tuple[list[str], list[str], list[tuple[str, Pod]]]:
    """The warnings (the objects' own, then pods on unreadable nodes, then pods on no node),
    the pods left out for want of their node, and ``pods`` without those on unreadable or
    missing nodes (only what differs is looked at when ``pods`` is None)."""
    warnings = [w for place_key in sorted(state.warned) for w in state.warned[place_key]]
    lost: list[tuple[str, Pod]] = []
    if pods is None:
        # Pods can be on a missing node only where they said so: look at the nodes named.
        # Set operations on the key views, in C: a Python walk of every node named costs
        # milliseconds a build at 20,000 nodes.
        names = (state.on_node.keys() - state.nodes.keys()) | (state.skipped & state.on_node.keys())
        keys = sorted({key for n in names for key in state.on_node[n]})
        lost = [(k, p) for key in keys for k, p in state.inputs[key]]
        kept: list[tuple[str, Pod]] = []
    else:
        lost = pods
    skipped = [(k, p) for k, p in lost if p.node in state.skipped]
    warnings += [skipped_warning(p) for _k, p in skipped]
    dropped = [
        k
        for k, p in lost
        if p.node is not None and p.node not in state.skipped and p.node not in state.nodes
    ]
    warnings += [dropped_warning(k) for k in dropped]
    if pods is not None:
        gone = set(dropped) | {k for k, _p in skipped}
        kept = [(k, p) for k, p in pods if k not in gone]
    return warnings, dropped, kept


def _astray(key: str, keyed: Keyed) -> int:
    """1 when an object has pods and they are not exactly one pod whose key is the object's
    store key (a pod listed without a namespace is stored as ``name``, keyed ``default/name``),
    else 0. An object without pods (left out, or not there before or after a change) orders
    nothing: counted as one, a pod's coming took the count below zero, and the pods' order was
    then always walked in Python."""
    return 0 if not keyed or (len(keyed) == 1 and keyed[0][0] == key) else 1


def _redo_row(arrays: NodeArrays, name: str, pods: Sequence[Pod]) -> bool:
    """Node ``name``'s row of ``arrays`` emptied and its ``pods`` (in the full build's order)
    given their GPU slots again, as :func:`rebuilt <defrag.model.rebuild.rebuilt>` redoes a
    dirty node; False where it declines (a node not in the arrays, a pod that does not fit)."""
    row = arrays.index.get(name)
    if row is None:
        return False
    one = arrays.row_view(row)  # its numpy fields write through to ``arrays``
    one.gpu_free[0] = np.where(one.gpu_exists[0], GPU_MILLI, 0)
    one.cpu_free[0] = one.cpu_total[0]
    one.mem_free[0] = one.mem_total[0]
    one.class_count[0] = 0
    one.pool_free[0] = one.pool_total[0]
    bound: list[tuple[int, Pod]] = []
    try:
        for pod in pods:
            if pod.phase not in HOLDING_PHASES:
                continue
            pod = assign_gpus(one, pod)
            one.take_gpus(0, pod, pod.gpu_indices)
            bound.append((0, pod))
    except ModelError:
        return False
    one.charge(bound)  # CPU, memory and classes through the views; the counts made anew:
    for field_name in KEPT_COUNTS:
        getattr(arrays, field_name)[row] = getattr(one, field_name)[0]
    return True


def _makes_nodes_or_pods(piece: Piece | None) -> bool:
    return piece is not None and bool(
        piece.nodes
        or piece.pods
        or piece.priority_classes
        or piece.skipped_nodes
        or piece.hidden_usage
    )


def _pdbs(state: _State) -> list[PodDisruptionBudget]:
    places = {kind: place for place, kind in enumerate(state.kinds)}
    return [
        pdb
        for ref in sorted(state.pdbs, key=lambda r: (places[r[0]], r[1]))
        for pdb in state.pdbs[ref]
    ]


def _tainted(node: Node, hidden: frozenset[str]) -> Node:
    return replace(node, taints=(*node.taints, UNREADABLE_TAINT)) if node.name in hidden else node


__all__ = ["AHEAD_LIMIT", "Ahead", "Built", "StoreBuild"]
